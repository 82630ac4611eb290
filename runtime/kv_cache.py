"""Host-side KV state: one preallocated [1, kv_heads, capacity, head_dim] buffer per KV-owning target layer.

A target call at `pos` writes its new entries at pos..pos+T-1 (a position-indexed write). Rollback after a
rejected draft is only a rewind of the caller's `pos`: masks come from absolute positions, so slots beyond it
are never read until they are overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .manifest import Manifest


class CacheFullError(ValueError):
    pass


@dataclass
class LastCall:
    """Where the most recent target call wrote: needed to reproduce transformers' drafter hand-off."""

    start: int = 0
    end: int = 0


class KVCache:
    def __init__(self, manifest: Manifest):
        spec = manifest.kv_cache
        self.capacity = int(spec["capacity"])
        self.types = {d.layer: d.type for d in manifest.kv_layers}
        self.buffers = {d.layer: (np.zeros((1, d.kv_heads, self.capacity, d.head_dim), np.float32),
                                  np.zeros((1, d.kv_heads, self.capacity, d.head_dim), np.float32))
                        for d in manifest.kv_layers}
        self.sliding_past = int(spec["sliding_past"])  # W-1: what a sliding layer needs of the past
        self.drafter_sliding = int(spec["drafter_sliding_visible"])  # W+1: what the drafter's sliding layers see
        self.drafter_layers = {t: int(i) for t, i in spec["drafter_layers"].items()}
        self.last = LastCall()

    def past(self, layer: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """The past window a target call at `pos` reads for this layer (views when contiguous)."""
        start = 0 if self.types[layer] == "full_attention" else max(0, pos - self.sliding_past)
        k, v = self.buffers[layer]
        return _contiguous(k[:, :, start:pos]), _contiguous(v[:, :, start:pos])

    def write(self, layer: int, pos: int, k_new: np.ndarray, v_new: np.ndarray) -> None:
        k, v = self.buffers[layer]
        end = pos + k_new.shape[2]
        k[:, :, pos:end] = k_new
        v[:, :, pos:end] = v_new

    def check_room(self, pos: int, count: int) -> None:
        if pos + count > self.capacity:
            raise CacheFullError(
                f"KV cache full: {pos + count} positions needed, export capacity is {self.capacity}; "
                "shorten the prompt or --max-new-tokens, or re-export with a larger --max-cache-len")

    def drafter_view(self, pos: int, mode: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The store-layer K/V the drafter sees when drafting for the newest token at `pos` (see drafter_ranges)."""
        view = {}
        for layer_type, (lo, hi) in drafter_ranges(pos, mode, self.last, self.sliding_past, self.drafter_sliding).items():
            k, v = self.buffers[self.drafter_layers[layer_type]]
            view[layer_type] = (_contiguous(k[:, :, lo:hi]), _contiguous(v[:, :, lo:hi]))
        return view


def drafter_ranges(pos: int, mode: str, last: LastCall, sliding_past: int, sliding_visible: int) -> dict:
    """[lo, hi) of cache positions the drafter attends to, per layer type.

    clean: only committed positions (< pos); full sees all of them, sliding the last W+1.
    hf: what transformers 5.24 hands over: the last target call's K/V sliced to [:pos+1], which after a
        partial accept includes the rejected draft at `pos` (and, for sliding layers, later ones).
    """
    if mode == "clean":
        return {"full_attention": (0, pos), "sliding_attention": (max(0, pos - sliding_visible), pos)}
    if mode != "hf":
        raise ValueError(f"unknown KV hand-off mode {mode!r}; use clean or hf")
    length = pos + 1  # transformers slices the returned K/V to the committed sequence length
    # sliding: the returned tensor covers [max(0, start-(W-1)), end), sliced to its first `length` entries
    lo = max(0, last.start - sliding_past)
    hi = min(last.end, lo + length)
    return {"full_attention": (0, min(last.end, length)),
            "sliding_attention": (max(lo, hi - sliding_visible), hi)}


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)
