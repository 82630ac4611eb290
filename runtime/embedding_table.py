"""Host-side row lookup in the block-quantized embedding table the target graph also reads (numpy only).

The manifest's `embedding` entry (written by export/backends/onnx/embedding.save_with_table_external) points at
one file holding the packed codes, uint8 [V, n_blocks, blob_size] (MatMulNBits layout), then the scales
[V, n_blocks]. A row dequantizes exactly as com.microsoft GatherBlockQuantized does for uint8 data without
zero_points: w = (code - zero_point) * scale, codes 4-bit low nibble first (zero_point 8) or 8-bit (128).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from mtpkit.errors import ManifestError


class QuantizedTable:
    """Memory-mapped int4 / int8 blockwise table; `row(token)` -> float32 [H]."""

    def __init__(self, entry: dict, folder: str | Path):
        self.entry = entry
        self.bits = int(entry["bits"])
        if self.bits not in (4, 8):
            raise ManifestError(f"unsupported embedding bits {self.bits}")
        self.block_size = int(entry["block_size"])
        self.vocab, self.hidden = (int(d) for d in entry["shape"])
        self.zero_point = int(entry["zero_point"])
        path = Path(folder) / entry["file"]
        d, s = entry["data"], entry["scales"]
        data_shape = tuple(int(x) for x in d["shape"])
        self.data = np.memmap(path, dtype=np.uint8, mode="r", offset=int(d["offset"]),
                              shape=(data_shape[0], int(np.prod(data_shape[1:]))))
        self.scales = np.memmap(path, dtype=np.dtype(s["dtype"]), mode="r", offset=int(s["offset"]),
                                shape=tuple(int(x) for x in s["shape"]))
        if self.data.shape[0] != self.vocab or self.scales.shape[0] != self.vocab:
            raise ManifestError("embedding data / scales rows do not match shape; re-export the model")

    def __len__(self) -> int:
        return self.vocab

    def row(self, token: int) -> np.ndarray:
        """Dequantized row `token`: float32 [H]."""
        token = int(token)
        if not 0 <= token < self.vocab:
            raise IndexError(f"token {token} out of range [0, {self.vocab})")
        packed = np.asarray(self.data[token])
        if self.bits == 4:
            codes = np.empty(packed.size * 2, np.int16)
            codes[0::2] = packed & 0x0F
            codes[1::2] = packed >> 4
        else:
            codes = packed.astype(np.int16)
        scales = np.asarray(self.scales[token], np.float32)
        values = (codes - self.zero_point).astype(np.float32).reshape(scales.size, -1) * scales[:, None]
        return values.reshape(-1)[:self.hidden]

    def rows(self, tokens: Sequence[int]) -> np.ndarray:
        """float32 [len(tokens), H]."""
        return np.stack([self.row(t) for t in tokens]) if len(tokens) else np.zeros((0, self.hidden), np.float32)

    def dense(self) -> np.ndarray:
        """The whole dequantized table, float32 [V, H] (tests / small tables only)."""
        return self.rows(range(self.vocab))
