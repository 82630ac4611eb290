"""A checkpoint's codes laid out as the graphs store them, never re-rounded."""

from __future__ import annotations

import numpy as np

from .types import Weight

ONNX_BITS = (2, 4, 8)  # MatMulNBits widths
ONNX_TABLE_BITS = (4, 8)  # GatherBlockQuantized widths: a 2-bit table's codes are written at 4 bits (exact)


def onnx_block(weight: Weight, channel_block: int) -> int:
    """The MatMulNBits / GatherBlockQuantized block of a weight (a power of two, at least 16): its group where the
    checkpoint has groups; per channel, ONNX Runtime's largest block `channel_block` with the channel's scale
    repeated in each, or the largest power of two dividing the row where that does not nest with it."""
    group = weight.group
    if weight.groups > 1 or group % channel_block == 0 or channel_block % group == 0:
        return group if weight.groups > 1 else channel_block
    block = channel_block
    while block > 16 and group % block:
        block //= 2
    if group % block:
        raise ValueError(f"a row of {group} holds no whole block of 16 or more")
    return block


def widen(bits: int, allowed: tuple[int, ...]) -> int:
    """The narrowest width in `allowed` that holds every `bits`-wide code exactly."""
    return min(b for b in allowed if b >= bits)


def nbits(weight: Weight, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 [n, blocks, block * bits / 8], scales float32 [n, blocks]): MatMulNBits' and
    GatherBlockQuantized's layout (code + 2^(bits-1), lowest bits first, the row zero-padded to whole blocks) of
    the checkpoint's codes at `bits` >= their own width; each block takes the scale of the group it lies in."""
    group = weight.group
    n, k = weight.shape
    if block % group and group % block:
        raise ValueError(f"block {block} and the checkpoint's group {group} do not nest")
    blocks = -(-k // block)
    packed = np.zeros((n, blocks, block * bits // 8), np.uint8)
    step = max(1, _CHUNK // (blocks * block))
    for start in range(0, n, step):  # a few rows unpacked at a time: a full-size table's codes are never whole
        stop = min(start + step, n)
        packed[start:stop] = _rows(weight.rows(start, stop), bits, blocks * block).reshape(stop - start, blocks, -1)
    starts = np.minimum(np.arange(blocks) * block // group, weight.scales.shape[1] - 1)
    return packed, np.ascontiguousarray(weight.scales[:, starts], np.float32)


_CHUNK = 1 << 22  # codes packed at a time by nbits


def _rows(codes: np.ndarray, bits: int, padded: int) -> np.ndarray:
    """uint8 [rows, padded * bits / 8] of int8 codes [rows, k <= padded], the padding decoding to 0."""
    rows, k = codes.shape
    u = np.full((rows, padded), 1 << (bits - 1), np.uint8)
    u[:, :k] = (codes.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8)
    per = 8 // bits
    out = np.zeros((rows, padded // per), np.uint8)
    for i in range(per):
        out |= u[:, i::per] << (bits * i)
    return out
