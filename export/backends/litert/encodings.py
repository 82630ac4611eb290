"""What a weight becomes in a grafted .tflite (graft.py): its encoding (float32, float16, int8 channelwise, int4
blockwise, int2 / int4c per channel, a checkpoint's own codes, a packed table's bytes), how many bytes it takes, and
its rows encoded."""

from __future__ import annotations

import dataclasses

import numpy as np

from ... import int4
from . import tables
from .tables import packed_width

# int8 weights' QuantizationParameters, per row at each place (subgraph) reading the weight: kept in the flatbuffer
INT8_SCALE, INT8_ZERO_POINT = np.dtype(np.float32), np.dtype(np.int64)
# encodings whose scales are QuantizationParameters (per row, at each place); int4c: int4 with one float32 scale per
# row, how a checkpoint's own per-channel int4 scales stay exact (int4's blockwise scales are float16)
PER_CHANNEL = ("int8", "int2", "int4c")
GATHER = ("GATHER_ND", 0)  # how the embedders read a packed table's bytes (tables.py)


@dataclasses.dataclass(frozen=True)
class Encoding:
    # float32 | float16 | int8 | int4 | int2 (one float32 scale per row: XNNPACK has no 2-bit blocks) | int4c |
    # uint8 (bytes as they are: a checkpoint's packed table, tables.py) | packed (the size plan's view of such a
    # table: its packed bytes and float32 scales, two tensors)
    kind: str
    block: int = 0  # int4 only
    # int4 / int2: scales searched per block or row (export/int4.py), weighted by this importance ([k], or [k, k]:
    # GPTQ)
    searched: bool = False
    importance: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    # --quant checkpoint: the checkpoint's own codes and scales (export/lattice.Weight), written instead of encoding
    lattice: object = dataclasses.field(default=None, compare=False, repr=False)

    def data_bytes(self, shape) -> int:
        n = int(np.prod(shape))
        if self.kind == "packed":
            return shape[0] * packed_width(shape[1], self.lattice.bits)
        return {"float32": 4 * n, "float16": 2 * n, "int8": n, "int4": (n + 1) // 2, "int4c": (n + 1) // 2,
                "int2": (n + 3) // 4, "uint8": n}[self.kind]

    def scale_bytes(self, shape) -> int:
        if self.kind == "packed":
            return 4 * shape[0] * self.lattice.groups
        return 2 * shape[0] * (shape[1] // self.block) if self.kind == "int4" else 0

    def params_bytes(self, shape) -> int:
        """Flatbuffer bytes at each place reading the weight: int8's / int2's per-row scale and zero point."""
        return shape[0] * (INT8_SCALE.itemsize + INT8_ZERO_POINT.itemsize) if self.kind in PER_CHANNEL else 0

    def encode(self, rows: np.ndarray, start: int = 0) -> tuple[bytes, np.ndarray | None]:
        """(data, per-row scales) of a block of rows, the first being row `start`; rows are independent in every
        encoding."""
        if self.lattice is not None:
            return self._lattice(start, len(rows))
        if self.kind == "float32":
            return np.ascontiguousarray(rows, np.float32).tobytes(), None
        if self.kind == "float16":
            return rows.astype(np.float16).tobytes(), None
        if self.kind == "uint8":
            return np.ascontiguousarray(rows, np.uint8).tobytes(), None
        if self.kind == "int8":  # ai-edge-quantizer's symmetric channelwise rule (zero rows: scale 1e-9/127)
            scale = np.maximum(np.abs(rows).max(axis=1), 1e-9).astype(np.float32) / np.float32(127)
            q = np.clip(np.rint(rows / scale[:, None]), -127, 127).astype(np.int8)
            return q.tobytes(), scale
        if self.kind == "int2":  # one scale per row, searched (weighted, compensated) as int4's blocks are
            codes, scale = int4.encode(rows, rows.shape[1], self.importance, bits=2)
            q = codes.reshape(-1, 4) & 0x03  # four values per byte, the first in the lowest bits (widths % 4 == 0)
            return (q[:, 0] | q[:, 1] << 2 | q[:, 2] << 4 | q[:, 3] << 6).astype(np.uint8).tobytes(), \
                scale[:, 0].astype(np.float32)
        codes, scale = int4.encode(rows, self.block, self.importance,
                                   int4.SCALE_GRID if self.searched else int4.RTN_GRID)  # rtn: absmax / 7
        q = codes.reshape(-1)
        if q.size % 2:
            q = np.append(q, np.int8(0))
        packed = (q[0::2] & 0x0F) | ((q[1::2] & 0x0F) << 4)  # two values per byte, the first in the low nibble
        return packed.astype(np.uint8).tobytes(), scale


    def _lattice(self, start: int, count: int) -> tuple[bytes, np.ndarray]:
        """The checkpoint's codes of rows start.. as this kind stores them, and their scales (per row, or per block:
        float16 for blockwise int4, exact only where the checkpoint's scales are)."""
        if self.kind == "uint8":
            return tables.packed_rows(self.lattice, start, start + count).tobytes(), None
        codes = self.lattice.rows(start, start + count)
        scales = self.lattice.scales[start:start + count]
        per_row = scales[:, 0].astype(np.float32)
        if self.kind == "int8":
            return codes.astype(np.int8).tobytes(), per_row
        q = codes.reshape(-1).astype(np.int8)
        if self.kind == "int2":
            q = q.reshape(-1, 4) & 0x03
            return (q[:, 0] | q[:, 1] << 2 | q[:, 2] << 4 | q[:, 3] << 6).astype(np.uint8).tobytes(), per_row
        if q.size % 2:
            q = np.append(q, np.int8(0))
        packed = ((q[0::2] & 0x0F) | ((q[1::2] & 0x0F) << 4)).astype(np.uint8).tobytes()
        if self.kind == "int4c":
            return packed, per_row
        return packed, np.repeat(scales, self.lattice.group // self.block, axis=1)


def lattice_encoding(weight, shape: tuple, uses: set, lookup: tuple) -> "Encoding":
    """--quant checkpoint: a weight's encoding that writes the checkpoint's codes exactly (export/lattice): per row
    int8 / int2 / int4c with float32 scales, groups as int4 blocks (their float16 scales); a 2- or 4-bit table
    the embedders read gathered from its packed bytes with float32 scales (tables.py: "packed" in the size plan,
    its bytes "uint8" in the graph, read by GATHER), an 8-bit one by EMBEDDING_LOOKUP at int8; a weight the
    checkpoint keeps float stays float32."""
    if weight is None:
        return Encoding("float32")
    if tables.packed(weight) and uses & {lookup, GATHER}:
        return Encoding("packed" if lookup in uses else "uint8", lattice=weight)
    per_row = weight.groups == 1
    if weight.bits == 8 or uses & {lookup} and per_row:
        return Encoding("int8", lattice=weight)
    if not per_row:
        return Encoding("int4", weight.group, lattice=weight)
    if weight.bits == 2 and shape[1] % 4 == 0:
        return Encoding("int2", lattice=weight)
    return Encoding("int4c", lattice=weight)


def channel_block(width: int) -> int | None:
    """One scale per row, as a block as wide as the row: the float16 scales lie in one buffer every signature's
    subgraph shares (per-channel quantization parameters would repeat a float32 scale and an int64 zero point per
    row in each subgraph that reads the weight), and XNNPACK takes any block that is a multiple of 32."""
    return width if width % 32 == 0 else int4_block(width, 128)


def int4_block(width: int, block_size: int) -> int | None:
    """The largest of 128/64/32 not above block_size dividing width (int4 blockwise needs whole blocks)."""
    return next((b for b in (128, 64, 32) if b <= block_size and width % b == 0), None)


def unquantized(name: str, shape: tuple, uses: set) -> Encoding:
    """The float export's choice for every weight: float32."""
    return Encoding("float32")
