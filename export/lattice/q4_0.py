"""bf16 weights on a Q4_0 lattice (Google's `*-qat-q4_0-unquantized` targets and assistants): every block of 32
input channels holds code x d with codes in -8..7 and one scale d. The lattice is recovered from the values
themselves, exactly: a block is on it when some float32 d gives code x d == value for every value (checked, not
assumed). Blocks that are not take the recipe's encoder (export/int4.encode) and are counted."""

from __future__ import annotations

import logging

import numpy as np


from .. import int4
from .types import Lattice, Weight, key

FORMAT = "q4_0"
BLOCK = 32
log = logging.getLogger("mtpkit")


def blocks_on_lattice(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes int8 [n, k], scales float32 [n, k / 32], on bool [n, k / 32]) of float32 rows w [n, k]: each block's
    scale from its largest magnitude (the code -8 or 7 it must be, or any code 1..8 where the block's extreme is a
    smaller multiple), the block on the lattice when every value is code x scale exactly."""
    n, k = w.shape
    blocks = w.reshape(n, k // BLOCK, BLOCK)
    best_codes = np.zeros(blocks.shape, np.int8)
    best_scale = np.zeros(blocks.shape[:2], np.float32)
    on = np.zeros(blocks.shape[:2], bool)
    zero = ~blocks.any(axis=2)
    on |= zero
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[..., None], axis=2)[..., 0]
    for code in (-8, 7, -7, 6, -6, 5, -5, 4, -4, 3, -3, 2, -2, 1, -1):
        scale = (extreme / np.float32(code)).astype(np.float32)
        ok = ~on & (scale > 0)
        if not ok.any():
            continue
        safe = np.where(ok, scale, 1.0).astype(np.float32)
        q = np.rint(blocks / safe[..., None])
        exact = ok & (np.abs(q) <= 8).all(axis=2) & (q <= 7).all(axis=2) & \
            ((q * safe[..., None]).astype(np.float32) == blocks).all(axis=2)
        best_codes[exact] = q[exact].astype(np.int8)
        best_scale[exact] = scale[exact]
        on |= exact
    return best_codes.reshape(n, k), best_scale, on


def read(state: dict, expected: dict) -> tuple[dict, Lattice]:
    """The lattice of every 2-D linear weight whose rows split into blocks of 32 (tables and norms stay float);
    off-lattice blocks are encoded by export/int4.encode (4 bits, searched scales, blocks of 32)."""
    weights, off = {}, {}
    for name, tensor in state.items():
        if tensor.dim() != 2 or "embed" in name or not name.endswith(".weight") or tensor.shape[1] % BLOCK:
            continue
        w = tensor.float().numpy()
        codes, scales, on = blocks_on_lattice(w)
        if not on.all():
            fallback_codes, fallback_scales = int4.encode(w, BLOCK)
            mask = np.repeat(~on, BLOCK, axis=1)
            codes = np.where(mask, fallback_codes, codes)
            scales = np.where(on, scales, fallback_scales.astype(np.float32))
            off[key(name)] = (int((~on).sum()), int(on.size))
        weights[key(name)] = Weight(codes.astype(np.int8), scales.astype(np.float32), 4)
    lattice = Lattice(FORMAT, weights, off_lattice=off)
    if off:
        log.info("  Q4_0 lattice: %d of %d blocks off the lattice in %d weights, re-encoded (4 bits, searched "
                 "scales)", sum(o for o, _ in off.values()), sum(a for _, a in off.values()), len(off))
    return state, lattice


