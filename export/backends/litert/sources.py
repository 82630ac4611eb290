"""Where a graft reads its weights: rows of a named weight as float32, from an in-memory module, a checkpoint's
.safetensors files or a grafted file, a block of rows at a time."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import tables
from .graft import WEIGHT

# ---- weight sources: rows of a named weight, as float32 ----

class StateSource:
    """Weights of an in-memory module (the drafter: small)."""

    def __init__(self, state: dict):
        self.state = state

    def shape(self, name: str) -> tuple:
        return tuple(self.state[name].shape)

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return self.state[name].detach()[start:stop].float().numpy()


_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


class SafetensorsSource:
    """Weights read from a checkpoint's .safetensors files with plain reads, a block of rows at a time: nothing
    is mapped, so the process's resident memory never holds the checkpoint (the page cache does, reclaimably)."""

    def __init__(self, folder: Path, resolve: Callable[[str], str] | None = None):
        from ...checkpoint import safetensors_files

        self.where: dict[str, tuple] = {}  # key -> (path, dtype, shape, first byte)
        for f in safetensors_files(Path(folder)):
            with open(f, "rb") as h:
                n = int.from_bytes(h.read(8), "little")
                header = json.loads(h.read(n))
            for key, d in header.items():
                if key != "__metadata__":
                    self.where[key] = (f, d["dtype"], tuple(d["shape"]), 8 + n + d["data_offsets"][0])
        self.resolve = resolve or (lambda name: name)

    def shape(self, name: str) -> tuple:
        return self.where[self.resolve(name)][2]

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        path, dtype, shape, first = self.where[self.resolve(name)]
        if dtype not in _DTYPES:
            raise ValueError(f"{path.name}: {name} is {dtype}; mtpkit reads float32, float16 and bfloat16 weights")
        width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        count = (stop - start) * width if shape else 1
        item = np.dtype(_DTYPES[dtype]).itemsize
        with open(path, "rb") as f:
            raw = os.pread(f.fileno(), count * item, first + start * width * item)
        values = np.frombuffer(raw, _DTYPES[dtype])
        if dtype == "BF16":  # the high half of a float32
            values = (values.astype(np.uint32) << 16).view(np.float32)
        return values.astype(np.float32, copy=False).reshape((stop - start, *shape[1:]) if shape else ())


_GRAFTED = {0: np.float32, 3: np.uint8}  # TensorType FLOAT32, UINT8 (a packed table's bytes): what a graft reads back


class GraftedSource:
    """The float32 weights of a grafted file, read from its memory map (re-encoding float -> int8 / int4)."""

    def __init__(self, path: Path, model):
        self.fd = os.open(path, os.O_RDONLY)  # the inode stays readable after the file is replaced
        self.found = {}
        for sg in model.subgraphs:
            for t in sg.tensors:
                name = t.name.decode()
                if name.startswith(WEIGHT) and t.type in _GRAFTED:
                    buf = model.buffers[t.buffer]
                    self.found[name[len(WEIGHT):]] = (buf.offset, tuple(int(x) for x in t.shape), _GRAFTED[t.type])

    def shape(self, name: str) -> tuple:
        return self.found[name][1]

    def __del__(self):
        os.close(self.fd)


    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        offset, shape, dtype = self.found[name]
        width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        count = (stop - start) * width if shape else 1
        size = np.dtype(dtype).itemsize
        raw = os.pread(self.fd, size * count, offset + size * start * width)  # a read, not the map: RSS stays flat
        return np.frombuffer(raw, dtype).reshape((stop - start, *shape[1:]) if shape else ())


def checkpoint_resolver(keys) -> Callable[[str], str]:
    """Module parameter name -> checkpoint key: the longest dotted suffix (of two parts at least) that names
    exactly one key."""
    keys = list(keys)

    def resolve(name: str) -> str:
        parts = name.split(".")
        for i in range(max(1, len(parts) - 1)):  # the leaf and its module at least: "1.weight" names nothing
            suffix = ".".join(parts[i:])
            hits = [k for k in keys if k == suffix or k.endswith("." + suffix)]
            if len(hits) == 1:
                return hits[0]
        raise KeyError(f"no checkpoint tensor for {name!r}")

    return resolve


_FLOATS = ("F32", "F16", "BF16", "F64")


class LatticeSource:
    """A pre-quantized checkpoint's weights as float32 rows: where the checkpoint holds packed codes (not floats)
    or only a quantized table, the lattice's dequantized values (export/lattice), under the key "<key>.weight";
    everything else the checkpoint's own floats."""

    def __init__(self, inner: SafetensorsSource, lattice):
        from ...lattice import key

        self.inner, self.lattice = inner, lattice
        floats = {key(k) for k, (_, dtype, _, _) in inner.where.items() if dtype in _FLOATS}
        self.where: dict[str, tuple | None] = {k: v for k, v in inner.where.items()
                                              if v[1] in _FLOATS or key(k) not in lattice.weights}
        self.where.update({k + ".weight": None for k in lattice.weights if k not in floats})
        # a packed table's two tensors (tables.py) -> (its key, which)
        self.packed = {f"{k}.{part}": (k, part) for k, w in lattice.weights.items() if tables.packed(w)
                       for part in (tables.PACKED, tables.SCALES)}
        self.where = {k: v for k, v in self.where.items()  # the checkpoint's own copies: served from the lattice
                      if not any(k.endswith("." + p) for p in self.packed)}
        self.where.update(dict.fromkeys(self.packed))
        self.resolve: Callable[[str], str] = lambda name: name
        inner.resolve = lambda name: name  # given resolved keys

    def shape(self, name: str) -> tuple:
        k = self.resolve(name)
        if k in self.packed:
            w, part = self.lattice.weights[self.packed[k][0]], self.packed[k][1]
            return (w.shape[0], tables.packed_width(w.shape[1], w.bits) if part == tables.PACKED else w.groups)
        return self._weight(k).shape if self.where[k] is None else self.inner.shape(k)

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        k = self.resolve(name)
        if k in self.packed:
            w, part = self.lattice.weights[self.packed[k][0]], self.packed[k][1]
            return tables.packed_rows(w, start, stop) if part == tables.PACKED else w.scales[start:stop]
        if self.where[k] is not None:
            return self.inner.rows(k, start, stop)
        return self._weight(k).dequantized(start, stop)

    def _weight(self, k: str):
        return self.lattice.weights[k.removesuffix(".weight")]
