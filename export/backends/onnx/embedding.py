"""Quantize the tied embedding / lm_head table once, shared by the graph's two uses and the host lookup.

The target graph reads its tied table W [V, H] twice: `Gather(W, input_ids)` (token embedding) and
`MatMul(hidden, Transpose(W))` (the lm_head). ORT's MatMulNBitsQuantizer skips that MatMul (its weight is not
a constant), so W would stay float. `quantize_shared_table` quantizes W blockwise along H (symmetric), stores
the packed bytes ONCE in com.microsoft MatMulNBits's B layout [V, n_blocks, blob_size] (uint8), and rewires:

* the lm_head -> `MatMulNBits(hidden, B, scales)`            (K=H, N=V, bits, block_size, accuracy_level)
* the Gather  -> `GatherBlockQuantized(Reshape(B, [V, n_blocks * blob_size]), ids, scales)`
                 (gather_axis=0, quantize_axis=1, bits, block_size), then a Slice when H % block_size != 0.

Zero-point convention: no zero_points input on either op, so both use their shared uint8 default, the
MatMulNBits convention that GatherBlockQuantized also follows for uint8 data: 8 for 4 bits, 128 for 8 bits.
The stored codes are therefore unsigned `q = clip(round(w / scale), -qmax, qmax) + zero_point` with
`qmax = 7` (4 bits) or `127` (8 bits), and `w ~= (q - zero_point) * scale`; 4-bit codes are packed two per
byte along H, low nibble first. Scales are [V, n_blocks] in W's float dtype (MatMulNBits needs scales of A's
type; GatherBlockQuantized outputs the scales' type).

`save_with_table_external` then writes the packed data and the scales (data first, then scales) as external
data into one file (embeddings.bin) and returns the manifest's `embedding` entry, which
`runtime/embedding_table.QuantizedTable` reads with numpy only.
"""
from __future__ import annotations

import dataclasses

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .encodings import nbits_layout

MS_DOMAIN = "com.microsoft"
_TWO_GB = 2 ** 31 - 1


def _zero_point(bits: int) -> int:
    return 1 << (bits - 1)  # 8 for int4, 128 for int8: both ops' default for uint8 data without zero_points


def quantize_blockwise(w: np.ndarray, bits: int, block_size: int,
                       scale_dtype: np.dtype | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric blockwise quantization of w [N, K] along K.

    Returns:
        packed uint8 [N, n_blocks, block_size * bits // 8] (MatMulNBits B layout, K zero-padded to
        n_blocks * block_size, 4-bit codes low nibble first), scales [N, n_blocks] in scale_dtype (default w's).
    """
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    n, k = w.shape
    n_blocks, _ = nbits_layout(k, bits, block_size)
    padded = np.zeros((n, n_blocks * block_size), np.float32)
    padded[:, :k] = w.astype(np.float32)
    blocks = padded.reshape(n, n_blocks, block_size)
    qmax = (1 << (bits - 1)) - 1
    amax = np.abs(blocks).max(axis=-1)
    # the scale is rounded to the stored dtype first, so codes are computed against the scale the ops use
    scales = (amax / qmax).astype(scale_dtype or w.dtype)
    s = scales.astype(np.float32)[..., None]
    safe = np.where(s == 0, np.float32(1), s)
    codes = np.clip(np.rint(blocks / safe), -qmax, qmax).astype(np.int32) + _zero_point(bits)
    codes = codes.astype(np.uint8)
    if bits == 4:
        packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    else:
        packed = codes
    return np.ascontiguousarray(packed), np.ascontiguousarray(scales)


LARGE = 64 << 20  # bytes from which a new initializer goes to data_file rather than into the proto


def _initializer(array: np.ndarray, name: str, base_dir: str | None, data_file: str | None) -> onnx.TensorProto:
    """A TensorProto of array: appended to base_dir/data_file as external data when it is LARGE and a file is
    given, else in the proto."""
    if data_file is None or base_dir is None or array.nbytes < LARGE:
        return numpy_helper.from_array(array, name)
    path = Path(base_dir) / data_file
    with open(path, "ab") as f:
        offset = f.seek(0, 2)
        np.ascontiguousarray(array).tofile(f)
    proto = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape,
                        data_location=TensorProto.EXTERNAL)
    for key, value in (("location", data_file), ("offset", str(offset)), ("length", str(array.nbytes))):
        proto.external_data.add(key=key, value=value)
    return proto


def _table(tensor: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    """The table's values: a read-only memory map of its external data when it has some (E2B's PLE table is
    9.4 GB of fp32), else the array itself."""
    if tensor.data_location != TensorProto.EXTERNAL or not base_dir:
        return numpy_helper.to_array(tensor, base_dir or "")
    info = {e.key: e.value for e in tensor.external_data}
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return np.memmap(Path(base_dir) / info["location"], dtype=dtype, mode="r", offset=int(info.get("offset", 0)),
                     shape=tuple(tensor.dims))


def _quantize_rows(w: np.ndarray, bits: int, block_size: int, scale_dtype: np.dtype | None = None,
                   rows: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """quantize_blockwise, a slab of rows at a time (blocks never cross rows): the same result without an fp32
    copy of the whole table."""
    first_packed, first_scales = quantize_blockwise(np.asarray(w[:rows]), bits, block_size, scale_dtype)
    packed = np.empty((len(w), *first_packed.shape[1:]), np.uint8)
    scales = np.empty((len(w), first_scales.shape[1]), first_scales.dtype)
    packed[:rows], scales[:rows] = first_packed, first_scales
    for start in range(rows, len(w), rows):
        packed[start:start + rows], scales[start:start + rows] = quantize_blockwise(
            np.asarray(w[start:start + rows]), bits, block_size, scale_dtype)
    return packed, scales


def dequantize_blockwise(packed: np.ndarray, scales: np.ndarray, bits: int, block_size: int, k: int) -> np.ndarray:
    """Inverse of quantize_blockwise: float32 [N, k]."""
    n, n_blocks = scales.shape
    flat = packed.reshape(n, -1)
    if bits == 4:
        codes = np.empty((n, flat.shape[1] * 2), np.int32)
        codes[:, 0::2] = flat & 0x0F
        codes[:, 1::2] = flat >> 4
    else:
        codes = flat.astype(np.int32)
    codes = (codes - _zero_point(bits)).reshape(n, n_blocks, block_size).astype(np.float32)
    return (codes * scales.astype(np.float32)[..., None]).reshape(n, -1)[:, :k]


def _consumers(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [node for node in graph.node if name in node.input]


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _unique(graph: onnx.GraphProto, base: str) -> str:
    taken = {i.name for i in graph.initializer} | {v for n in graph.node for v in (*n.input, *n.output)} | \
        {n.name for n in graph.node}
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


def _find_uses(graph: onnx.GraphProto, initializer: str, w: np.ndarray):
    """(gathers, lm_heads): Gather nodes reading the table as data, and lm_head uses as (node, kind) where kind is
    'transpose_matmul' (node is the MatMul fed by Transpose(W)), 'gemm' (Gemm(A, W, transB=1)) or
    'folded' (MatMul(A, W_T) with W_T an initializer equal to W.T)."""
    gathers, heads, dead = [], [], []
    for node in _consumers(graph, initializer):
        if node.op_type == "Gather" and node.input[0] == initializer and _attr(node, "axis", 0) == 0:
            gathers.append(node)
        elif node.op_type == "Transpose" and list(_attr(node, "perm", [1, 0])) == [1, 0]:
            users = _consumers(graph, node.output[0])
            if not users or any(u.op_type != "MatMul" or u.input[1] != node.output[0] for u in users):
                raise RuntimeError(f"Transpose({initializer}) feeds something other than MatMul's B input")
            heads += [(u, "transpose_matmul") for u in users]
            dead.append(node)
        elif node.op_type == "Gemm" and node.input[1] == initializer and _attr(node, "transB", 0) == 1 \
                and _attr(node, "transA", 0) == 0 and _attr(node, "alpha", 1.0) == 1.0:
            heads.append((node, "gemm"))
        else:
            raise RuntimeError(f"unsupported use of {initializer}: {node.op_type} {node.name!r}")
    if not heads:  # the transpose may have been folded into a second initializer [H, V]
        for t in graph.initializer:
            if tuple(t.dims) == (w.shape[1], w.shape[0]) and t.data_type == numpy_helper.from_array(w[:1]).data_type:
                if np.array_equal(numpy_helper.to_array(t), w.T):
                    heads += [(u, "folded") for u in _consumers(graph, t.name)
                              if u.op_type == "MatMul" and u.input[1] == t.name]
                    if any(u.op_type != "MatMul" or u.input[1] != t.name for u in _consumers(graph, t.name)):
                        raise RuntimeError(f"folded transpose {t.name} has uses other than MatMul's B input")
                    dead.append(t)
    return gathers, heads, dead


def quantize_shared_table(model: onnx.ModelProto, initializer: str, bits: int, block_size: int,
                          accuracy_level: int, base_dir: str | None = None, data_file: str | None = None,
                          half_scales: bool = False, encoded: tuple | None = None) -> tuple[onnx.ModelProto, dict]:
    """Replace the tied table `initializer` W [V, H] by one block-quantized copy read by both of its uses: the
    lm_head as MatMulNBits, the lookup as GatherBlockQuantized over Reshape(B) as uint8 with its `bits` attribute
    (ORT >= 1.21).

    Args:
        model: the graph (its external data loaded, or base_dir given to read it).
        initializer: W's name.
        bits: 4 or 8. block_size: 16/32/64/128/... (power of two). accuracy_level: MatMulNBits's (0..4).
        data_file: a file in base_dir the quantized table is appended to as external data when it is large
            (E2B's int8 PLE table is 2.35 GB: over protobuf's 2 GB message limit); None keeps it in the proto.
        half_scales: float16 scales for a table read by Gathers only (GatherBlockQuantized then outputs
            float16, cast back to W's dtype): half the scale bytes, E2B's PLE table 0.15 GB less at int8/b32.
        encoded: (packed, scales) already laid out (a checkpoint's own codes, export/lattice/pack.py), written
            instead of quantizing W.
    Returns:
        (model, layout): the model edited in place, and how the host can dequantize one row:
        {"initializer_data", "initializer_scales", "bits", "block_size", "shape": [V, H], "n_blocks",
         "data_shape": [V, n_blocks, blob_size], "scale_dtype", "zero_point", "packing"}.
    """
    graph = model.graph
    tensor = next((t for t in graph.initializer if t.name == initializer), None)
    if tensor is None:
        raise KeyError(f"no initializer {initializer!r}")
    w = _table(tensor, base_dir)
    if w.ndim != 2 or w.dtype not in (np.float32, np.float16):
        raise ValueError(f"{initializer} must be a 2-D float32/float16 table, got {w.dtype} {w.shape}")
    gathers, heads, dead = _find_uses(graph, initializer, w)
    if not gathers and not heads:
        raise RuntimeError(f"{initializer} has neither a Gather nor an lm_head use")
    if half_scales and heads:  # MatMulNBits needs scales of its input's type
        raise ValueError(f"{initializer} feeds an lm_head MatMul: its scales stay {w.dtype}")
    packed, scales = encoded if encoded is not None else \
        _quantize_rows(w, bits, block_size, np.dtype(np.float16) if half_scales else None)
    table = _Packed(initializer, _unique(graph, f"{initializer}_q{bits}"), _unique(graph, f"{initializer}_scales"),
                    bits, block_size, w.shape, packed.shape)
    new_inits = [_initializer(packed, table.data, base_dir, data_file),
                 _initializer(scales, table.scales, base_dir, data_file)]
    index = {id(n): i for i, n in enumerate(graph.node)}
    new_nodes = {index[id(node)]: _head_nodes(graph, node, kind, table, accuracy_level, w.dtype, new_inits)
                 for node, kind in heads}  # index of the replaced node -> its replacement(s)
    new_nodes.update(_gather_nodes(graph, gathers, table, index, new_inits, cast_to=None if scales.dtype == w.dtype
                                   else helper.np_dtype_to_tensor_dtype(w.dtype)))
    _rebuild(model, new_nodes, dead, {initializer}, new_inits)
    v, h = w.shape
    layout = {"initializer_data": table.data, "initializer_scales": table.scales, "bits": bits,
              "block_size": block_size, "shape": [v, h], "n_blocks": table.n_blocks,
              "data_shape": [v, table.n_blocks, table.blob], "scale_dtype": scales.dtype.name,
              "zero_point": _zero_point(bits), "packing": _packing(bits)}
    return model, layout


@dataclasses.dataclass(frozen=True)
class _Packed:
    """The quantized table's initializers and shape, as the nodes that read it need them."""
    name: str  # the float table's initializer
    data: str
    scales: str
    bits: int
    block_size: int
    shape: tuple[int, int]  # [V, H]
    packed_shape: tuple[int, int, int]  # [V, n_blocks, blob]

    @property
    def n_blocks(self) -> int:
        return self.packed_shape[1]

    @property
    def blob(self) -> int:
        return self.packed_shape[2]


def _head_nodes(graph, node, kind: str, table: _Packed, accuracy_level: int, dtype, new_inits: list) -> list:
    """The lm_head use `node` as MatMulNBits over the packed table (a Gemm's C added back, times its beta)."""
    out, (v, h) = node.output[0], table.shape
    has_c = kind == "gemm" and len(node.input) >= 3 and node.input[2]
    mm_out = _unique(graph, out + "_mm") if has_c else out
    nodes = [helper.make_node("MatMulNBits", [node.input[0], table.data, table.scales], [mm_out],
                              name=_unique(graph, (node.name or "lm_head") + "_MatMulNBits"),
                              domain=MS_DOMAIN, K=h, N=v, bits=table.bits, block_size=table.block_size,
                              accuracy_level=accuracy_level)]
    if has_c:  # Gemm's C, times beta
        c = node.input[2]
        beta = float(_attr(node, "beta", 1.0))
        if beta != 1.0:
            beta_name = _unique(graph, out + "_beta")
            new_inits.append(numpy_helper.from_array(np.array(beta, dtype), beta_name))
            scaled = _unique(graph, out + "_c")
            nodes.append(helper.make_node("Mul", [c, beta_name], [scaled]))
            c = scaled
        nodes.append(helper.make_node("Add", [mm_out, c], [out]))
    return nodes


def _gather_nodes(graph, gathers: list, table: _Packed, index: dict, new_inits: list,
                  cast_to: int | None = None) -> dict[int, list]:
    """Each lookup as GatherBlockQuantized over the packed rows (one Reshape before the first), cast to `cast_to`
    where the scales' type is not the table's, sliced back to H where the rows were padded to whole blocks."""
    if not gathers:
        return {}
    (v, h), name = table.shape, table.name
    flat_shape, flat = _unique(graph, f"{name}_q_rows_shape"), _unique(graph, f"{name}_q_rows")
    new_inits.append(numpy_helper.from_array(np.array([v, table.n_blocks * table.blob], np.int64), flat_shape))
    reshape = helper.make_node("Reshape", [table.data, flat_shape], [flat], name=_unique(graph, flat + "_Reshape"))
    replaced = {}
    for i, node in enumerate(gathers):
        out = node.output[0]
        padded = table.n_blocks * table.block_size != h
        gbq_out = _unique(graph, out + "_padded") if padded else out
        rows = _unique(graph, out + "_half") if cast_to is not None else gbq_out
        nodes = [reshape] if i == 0 else []
        nodes.append(helper.make_node("GatherBlockQuantized", [flat, node.input[1], table.scales], [rows],
                                      name=_unique(graph, (node.name or "embed") + "_GatherBlockQuantized"),
                                      domain=MS_DOMAIN, gather_axis=0, quantize_axis=1,
                                      block_size=table.block_size, bits=table.bits))
        if cast_to is not None:
            nodes.append(helper.make_node("Cast", [rows], [gbq_out], to=cast_to))
        if padded:  # K was zero-padded to whole blocks: drop the pad columns
            names = [_unique(graph, out + s) for s in ("_starts", "_ends", "_axes")]
            for nm, val in zip(names, (0, h, -1)):
                new_inits.append(numpy_helper.from_array(np.array([val], np.int64), nm))
            nodes.append(helper.make_node("Slice", [gbq_out, *names], [out]))
        replaced[index[id(node)]] = nodes
    return replaced


def _rebuild(model: onnx.ModelProto, new_nodes: dict, dead: list, removed: set, new_inits: list) -> None:
    """The graph's nodes with the replaced ones swapped in and the dead ones dropped, the float table (and dead
    initializers) replaced by new_inits, stale shape info dropped and the contrib opset declared."""
    graph = model.graph
    rebuilt = []
    dead_nodes = {id(n) for n in dead if isinstance(n, onnx.NodeProto)}
    for i, node in enumerate(graph.node):
        if i in new_nodes:
            rebuilt += new_nodes[i]
        elif id(node) not in dead_nodes:
            rebuilt.append(node)
    del graph.node[:]
    graph.node.extend(rebuilt)
    dead_inits = removed | {t.name for t in dead if isinstance(t, onnx.TensorProto)}
    kept = [t for t in graph.initializer if t.name not in dead_inits]
    del graph.initializer[:]
    graph.initializer.extend(kept + new_inits)
    for vi in list(graph.value_info):  # stale shape info of removed intermediates (Transpose output)
        if not any(vi.name in n.input or vi.name in n.output for n in graph.node):
            graph.value_info.remove(vi)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def drop_stale_data(model: onnx.ModelProto, path: Path) -> None:
    """Delete <graph>.data before `model` is saved to path, unless the model still reads from it (weights
    quantized tensor by tensor stay there; onnx.save_model appends what it must add)."""
    data = Path(path).with_name(Path(path).name + ".data")
    reads = any(e.key == "location" and e.value == data.name for t in model.graph.initializer for e in t.external_data)
    if data.exists() and not reads:
        data.unlink()


def _packing(bits: int) -> str:
    return ("uint4 codes, 2 per byte along H, low nibble first; rows padded to whole blocks" if bits == 4
            else "uint8 codes, 1 per byte along H; rows padded to whole blocks")


def save_with_table_external(model: onnx.ModelProto, path, layout: dict, file: str = "embeddings.bin") -> dict:
    """Save `model` to path with the packed table and its scales as external data in one file `file` next to it
    (data at offset 0, then scales right after), other tensors inline (or in <graph>.data when over 2 GB).

    Returns:
        the manifest's `embedding` entry: {"file", "dtype": "int4"|"int8", "shape": [V, H], "block_size", "bits",
        "data": {"offset", "length", "shape"}, "scales": {"offset", "length", "dtype", "shape"}, "zero_point",
        "packing", "initializer", "scales_initializer"}; the caller adds the embedding "scale" if it has one.
    """
    from onnx.external_data_helper import set_external_data

    path = Path(path)
    folder = path.parent
    by_name = {t.name: t for t in model.graph.initializer}
    data_t, scales_t = by_name[layout["initializer_data"]], by_name[layout["initializer_scales"]]
    data = numpy_helper.to_array(data_t, str(folder))
    scales = numpy_helper.to_array(scales_t, str(folder))
    raw_data, raw_scales = np.ascontiguousarray(data).tobytes(), np.ascontiguousarray(scales).tobytes()
    with open(folder / file, "wb") as f:
        f.write(raw_data)
        f.write(raw_scales)
    placed = [(data_t, 0, raw_data), (scales_t, len(raw_data), raw_scales)]
    for t, offset, raw in placed:
        del t.external_data[:]
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
            t.ClearField(field)
        t.raw_data = raw  # set_external_data wants raw_data present; cleared right after
        set_external_data(t, location=file, offset=offset, length=len(raw))
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
    big = sum(t.ByteSize() for t in model.graph.initializer) > _TWO_GB
    drop_stale_data(model, path)
    onnx.save_model(model, str(path), save_as_external_data=big, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    bits = layout["bits"]
    return {"file": file, "dtype": f"int{bits}", "shape": list(layout["shape"]),
            "block_size": layout["block_size"], "bits": bits,
            "data": {"offset": 0, "length": len(raw_data), "shape": list(data.shape)},
            "scales": {"offset": len(raw_data), "length": len(raw_scales), "dtype": scales.dtype.name,
                       "shape": list(scales.shape)},
            "zero_point": layout["zero_point"], "packing": layout["packing"],
            "initializer": layout["initializer_data"], "scales_initializer": layout["initializer_scales"]}
