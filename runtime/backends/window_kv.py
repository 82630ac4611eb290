"""The ONNX backend's host KV cache: each target call gets its past window and hands back its new entries.

A full-attention layer keeps every position in one [1, kv_heads, capacity, head_dim] buffer. A sliding-window layer
is only ever asked for its last W + 1 positions (the target reads W - 1, the drafter W + 1), so it keeps a ring:
position p at slot p % size. The ring holds the window before the prompt's end and everything generated after
it (`keep_from`), so a long prompt costs the window, not its length. Rollback after a rejected draft is only a
rewind of the caller's `pos`; a rewind further back than a ring holds (a chat history that differs before the
last answer) is refused by `resumable`, and the caller prefills again from the start.
"""

from __future__ import annotations

import numpy as np

from ..handoff import CacheFullError, LastCall, drafter_ranges
from ..manifest import Manifest

VERIFY_ROOM = 17  # a ring's first room beyond the window: one verify at the default --max-draft 16; it grows


def first_ring(capacity: int, drafter_sliding: int) -> int:
    """A sliding layer's first ring: what the drafter reads (W + 1) and one verify call, within the capacity."""
    return min(capacity, drafter_sliding + VERIFY_ROOM)


class Full:
    """A full-attention layer's K and V at every position."""

    def __init__(self, heads: int, capacity: int, head_dim: int):
        self.k = np.zeros((1, heads, capacity, head_dim), np.float32)
        self.v = np.zeros_like(self.k)

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        return _contiguous(self.k[:, :, lo:hi]), _contiguous(self.v[:, :, lo:hi])

    def write(self, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        self.k[:, :, pos:pos + k.shape[2]], self.v[:, :, pos:pos + v.shape[2]] = k, v


class Ring:
    """A sliding layer's K and V for positions [lo, end): position p at slot p % size."""

    def __init__(self, heads: int, size: int, head_dim: int):
        self.k = np.zeros((1, heads, size, head_dim), np.float32)
        self.v = np.zeros_like(self.k)
        self.size, self.lo, self.end = size, 0, 0

    def read(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions lo..hi-1 in order; a position the ring no longer holds reads as its slot's content, as an
        unwritten slot of a full buffer does (the backends' timing calls read such windows)."""
        first = lo % self.size
        last = first + hi - lo
        if last <= self.size:  # one run of slots: a view, as a full buffer gives
            return _contiguous(self.k[:, :, first:last]), _contiguous(self.v[:, :, first:last])
        wrap = last - self.size
        return (np.concatenate([self.k[:, :, first:], self.k[:, :, :wrap]], axis=2),
                np.concatenate([self.v[:, :, first:], self.v[:, :, :wrap]], axis=2))

    def write(self, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Entries for positions pos..pos+n-1; of a call longer than the ring only the last `size` are kept."""
        n, end = k.shape[2], pos + k.shape[2]
        if n > self.size:
            k, v, n = k[:, :, n - self.size:], v[:, :, n - self.size:], self.size
        first = (end - n) % self.size
        head = self.size - first
        if n <= head:
            self.k[:, :, first:first + n], self.v[:, :, first:first + n] = k, v
        else:
            self.k[:, :, first:], self.v[:, :, first:] = k[:, :, :head], v[:, :, :head]
            self.k[:, :, :n - head], self.v[:, :, :n - head] = k[:, :, head:], v[:, :, head:]
        held = min(self.lo, pos) if pos <= self.end else pos  # after a gap nothing before pos is held
        self.lo, self.end = max(end - self.size, held), end

    def holds(self, lo: int, hi: int) -> bool:
        return self.lo <= lo and hi <= self.end

    def grow(self, size: int, cap: int) -> None:
        """At least `size` slots (at most cap), every position held kept; it doubles, so a long answer costs a
        few copies, not one per call."""
        if size <= self.size:
            return
        k, v = self.read(self.lo, self.end)
        self.size = min(cap, max(size, 2 * self.size))
        self.k = np.zeros(self.k.shape[:2] + (self.size, self.k.shape[3]), np.float32)
        self.v = np.zeros_like(self.k)
        self.write(self.lo, k, v)  # the held range fits: lo and end stay as they are


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class WindowKV:
    """The host's KV buffers; hands each call its past window and each drafter step its visible entries."""

    def __init__(self, manifest: Manifest):
        spec = manifest.kv_cache
        self.capacity = spec.capacity
        self.sliding_past = spec.sliding_past  # W-1: what a sliding layer needs of the past
        self.drafter_sliding = spec.drafter_sliding_visible  # W+1: what the drafter's sliding layers see
        self.drafter_layers = {t: int(i) for t, i in spec.drafter_layers.items()}
        self.last = LastCall()
        self.keep = 0  # keep_from
        ring = first_ring(self.capacity, self.drafter_sliding)
        self.stores: dict[int, Full | Ring] = {
            d.layer: Full(d.kv_heads, self.capacity, d.head_dim) if d.type == "full_attention"
            else Ring(d.kv_heads, ring, d.head_dim) for d in manifest.kv_layers}
        self.rings = [s for s in self.stores.values() if isinstance(s, Ring)]
        # per layer: its store and feed / output keys, resolved once (a target call touches every layer twice)
        self._layers = [(s, isinstance(s, Ring), ("past_key", layer), ("past_value", layer), ("new_key", layer),
                         ("new_value", layer)) for layer, s in self.stores.items()]

    def windows(self, pos: int) -> dict:
        """Every layer's past window for a target call at `pos`, keyed as the call's feeds."""
        lo, feeds = max(0, pos - self.sliding_past), {}
        for store, sliding, kkey, vkey, _, _ in self._layers:
            feeds[kkey], feeds[vkey] = store.read(lo if sliding else 0, pos)
        return feeds

    def commit(self, pos: int, count: int, out: dict) -> None:
        """Write a call's new entries of every layer at pos..pos+count-1; the rings first grow to keep every
        position from `keep_from`'s window on."""
        end = pos + count
        need = end - max(0, min(self.keep, end) - self.drafter_sliding)
        if self.rings and need > self.rings[0].size:  # every ring has the same size
            for ring in self.rings:
                ring.grow(need, self.capacity)
        for store, _, _, _, knew, vnew in self._layers:
            store.write(pos, out[knew], out[vnew])

    def keep_from(self, pos: int) -> None:
        """Keep every position from `pos` on readable, with the window before it: the tokens a generate adds
        after its prompt, into which a verify rewinds and where the next turn of a chat may start again.
        Until it is called everything is kept."""
        self.keep = pos

    def resumable(self, pos: int) -> bool:
        """Whether a call may start at `pos` with what the cache holds: every ring still has the positions the
        target and the drafter read before it."""
        lo = max(0, pos - self.drafter_sliding)
        return all(ring.holds(lo, pos) for ring in self.rings)

    def write(self, layer: int, key: np.ndarray, value: np.ndarray) -> None:
        self.stores[layer].write(0, key, value)

    def check_room(self, pos: int, count: int) -> None:
        if pos + count > self.capacity:
            raise CacheFullError(
                f"KV cache full: {pos + count} positions needed, export capacity is {self.capacity}; "
                "shorten the prompt or --max-new-tokens, or re-export with a larger --max-cache-len")

    def drafter_view(self, pos: int, mode: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Store-layer K/V per layer type, as the drafter sees them when drafting for the token at `pos`."""
        ranges = drafter_ranges(pos, mode, self.last, self.sliding_past, self.drafter_sliding)
        return {layer_type: self.stores[self.drafter_layers[layer_type]].read(lo, hi)
                for layer_type, (lo, hi) in ranges.items()}
