"""A checkpoint's packed rows turned into int8 codes, a few rows at a time (export/lattice/types.Weight.rows): the
packed bytes stay as the checkpoint stored them, so a 262k-row table is never held as one int8 code per value.
Every layout stores a code as code + 2^(bits-1) in a bits-wide field, so any stored value decodes into range."""

from __future__ import annotations

import numpy as np


def codes(stored: np.ndarray, bits: int, width: int) -> np.ndarray:
    """int8 codes stored as they are (int8 weights, Q4_0 codes recovered from floats)."""
    return stored.astype(np.int8, copy=False)


def gemma(stored: np.ndarray, bits: int, width: int) -> np.ndarray:
    """transformers' `gemma` layout: uint8, 8 / bits codes a byte, the first in the lowest bits (int8: as int8)."""
    if bits == 8:
        return stored.astype(np.int8, copy=False)
    per, mask = 8 // bits, (1 << bits) - 1
    parts = [((stored >> (bits * i)) & mask).astype(np.int8) - np.int8(1 << (bits - 1)) for i in range(per)]
    return np.stack(parts, axis=-1).reshape(len(stored), -1)[:, :width]


def compressed(stored: np.ndarray, bits: int, width: int) -> np.ndarray:
    """compressed-tensors' pack-quantized layout: int32 words packed densely from the lowest bit, a row padded to
    whole 32-value groups (a value may spill into the next word)."""
    rows, cols = stored.shape
    groups = -(-width // 32)
    words = np.zeros((rows, groups * bits), np.uint32)
    words[:, :cols] = stored.view(np.uint32)
    words = words.reshape(rows, groups, bits)
    start = np.arange(32) * bits
    lo = (words[..., start // 32] >> (start % 32).astype(np.uint32)).astype(np.uint64)
    spill = (start % 32) + bits > 32
    hi_words = words[..., np.minimum(start // 32 + 1, bits - 1)].astype(np.uint64)
    value = lo | np.where(spill, hi_words << (32 - start % 32).astype(np.uint64), 0)
    out = (value & ((1 << bits) - 1)).astype(np.int16) - (1 << (bits - 1))
    return out.reshape(rows, groups * 32)[:, :width].astype(np.int8)


LAYOUTS = {"codes": codes, "gemma": gemma, "compressed": compressed}
