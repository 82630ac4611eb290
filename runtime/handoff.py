"""What every runtime backend shares about the KV cache: the drafter's view of it, and the full-cache error.

clean (default): the drafter sees only committed positions. hf: exactly what transformers 5.24 hands over,
including a rejected draft's K/V; `mtpkit parity` uses it to compare drafts one-to-one with transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpkit.errors import UsageError

HANDOFF_MODES = ("clean", "hf")

Ranges = dict[str, tuple[int, int]]  # layer type -> [lo, hi) of the cache positions the drafter attends to


class CacheFullError(UsageError):
    """The prompt plus the tokens to generate do not fit the export's KV capacity."""


@dataclass
class LastCall:
    """Where the most recent logical target call wrote: needed to reproduce transformers' drafter hand-off."""

    start: int = 0
    end: int = 0


def drafter_ranges(pos: int, mode: str, last: LastCall, sliding_past: int, sliding_visible: int) -> Ranges:
    """[lo, hi) of cache positions the drafter attends to, per layer type.

    clean: only committed positions (< pos); full sees all of them, sliding the last W+1.
    hf: what transformers 5.24 hands over: the last target call's K/V sliced to [:pos+1], which after a
        partial accept includes the rejected draft at `pos` (and, for sliding layers, later ones).
    """
    if mode == "clean":
        return {"full_attention": (0, pos), "sliding_attention": (max(0, pos - sliding_visible), pos)}
    if mode != "hf":
        raise UsageError(f"unknown KV hand-off mode {mode!r}; use one of {', '.join(HANDOFF_MODES)}")
    length = pos + 1  # transformers slices the returned K/V to the committed sequence length
    # sliding: the returned tensor covers [max(0, start-(W-1)), end), sliced to its first `length` entries
    lo = max(0, last.start - sliding_past)
    hi = min(last.end, lo + length)
    return {"full_attention": (0, min(last.end, length)),
            "sliding_attention": (max(lo, hi - sliding_visible), hi)}
