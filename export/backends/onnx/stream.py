"""ONNX graphs written without holding an fp32 copy of the model (what a full-size E2B/E4B export needs).

The step module is traced on fake fp32 parameters (`fake_weights`: nothing is allocated); every initializer that
was a parameter is then bound to a lazy tensor that converts the model's own tensor (fp32, bf16 or fp16, as
loaded) to fp32 only when it is written; the weight Transposes are folded lazily too, before the optimizer would
fold them eagerly; and the graph is saved tensor by tensor (onnx_ir's bounded writer), the tied embedding table
into `embeddings.bin`, where the runtime's host lookup reads the same bytes, everything else into
`<graph>.onnx.data`. So the export's peak is the loaded model plus about one tensor, not 4x the weights
(docs/export-memory.md).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from ... import int4
from ...lattice import pack
from ...progress import progress
from .encodings import matmul_bits, nbits_layout

# onnx_ir's writer materializes at most this many bytes of lazy tensors at once
IN_FLIGHT_BYTES = 256 << 20
SLAB_BYTES = 64 << 20  # what one large weight holds in fp32 at a time while it is written
INLINE_BYTES = 1024  # smaller initializers stay in the graph's proto


@contextlib.contextmanager
def fake_weights(module: torch.nn.Module):
    """Inside the block every parameter of `module` is a FakeTensor of dtype float32 (ties kept: one fake per
    real parameter); buffers stay real (small: rotary frequencies, scales). Yields {parameter name: real tensor},
    names as torch.export gives them to initializers. The real parameters are restored on exit."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes, swapped = {}, []
    real = {name: p for name, p in module.named_parameters(remove_duplicate=False)}
    for owner in module.modules():
        for key, param in list(owner._parameters.items()):
            if param is None:
                continue
            if id(param) not in fakes:
                with mode:
                    fakes[id(param)] = torch.nn.Parameter(torch.empty(param.shape, dtype=torch.float32),
                                                          requires_grad=False)
            swapped.append((owner, key, param))
            owner._parameters[key] = fakes[id(param)]
    try:
        yield {name: p.detach() for name, p in real.items()}
    finally:
        for owner, key, param in swapped:
            owner._parameters[key] = param


def bind_lazy(model, real: dict[str, torch.Tensor]) -> int:
    """Give every initializer named after a parameter a lazy fp32 value read from the real tensor; returns how
    many were bound. An initializer that is neither bound nor real data would fail at save: refused here."""
    bound = 0
    for name, value in model.graph.initializers.items():
        if name in real:
            value.const_value = _lazy(real[name], name)
            bound += 1
        elif _is_fake(value.const_value):
            raise RuntimeError(f"initializer {name} has no real tensor to read (not a parameter of the step)")
    return bound


def _lazy(tensor: torch.Tensor, name: str, transpose: bool = False):
    import onnx_ir as ir

    class Fp32(ir.LazyTensor):
        def tofile(self, file) -> None:
            """Written a slab of rows at a time: E2B's PLE table alone is 9.4 GB in fp32."""
            source = tensor.T if transpose else tensor
            rows = max(1, SLAB_BYTES // max(1, 4 * source[0].numel())) if source.dim() > 1 else len(source)
            for start in range(0, max(1, len(source)), rows):
                file.write(source[start:start + rows].to(torch.float32).contiguous().numpy().tobytes())

    shape = tuple(tensor.shape[::-1]) if transpose else tuple(tensor.shape)

    def materialize():
        array = tensor.to(torch.float32).numpy()
        return ir.tensor(np.ascontiguousarray(array.T) if transpose else array, name=name)

    return Fp32(materialize, dtype=ir.DataType.FLOAT, shape=ir.Shape(shape), name=name)


def _is_fake(tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    raw = getattr(tensor, "raw", None)
    return isinstance(raw, FakeTensor)


def fold_weight_transposes(model, real: dict[str, torch.Tensor]) -> int:
    """Transpose(W) of a parameter feeding only MatMuls -> a lazily transposed initializer W^T (what onnxscript's
    constant folding would do eagerly, holding every transposed weight in memory). Returns how many."""
    import onnx_ir as ir

    graph, folded = model.graph, 0
    for node in list(graph):
        if node.op_type != "Transpose" or node.inputs[0] is None or node.inputs[0].name not in real:
            continue
        perm = node.attributes.get("perm")
        source = real[node.inputs[0].name]
        if source.dim() != 2 or (perm is not None and list(perm.as_ints()) != [1, 0]):
            continue
        if len(node.inputs[0].uses()) != 1 or not all(
                user.op_type == "MatMul" and index == 1 for user, index in node.outputs[0].uses()):
            continue  # the tied table also feeds the token lookup: one copy, transposed at run time
        source_name = node.inputs[0].name
        name = source_name + ".T"
        value = ir.Value(name=name, shape=ir.Shape(tuple(source.shape[::-1])), type=ir.TensorType(ir.DataType.FLOAT),
                         const_value=_lazy(source, name, transpose=True))
        graph.register_initializer(value)
        node.outputs[0].replace_all_uses_with(value)
        graph.remove(node, safe=True)
        graph.initializers.pop(source_name)  # W itself is no longer read: never written
        folded += 1
    return folded


def save(model, path: Path, table: str | None, embeddings_file: str) -> dict | None:
    """Write the graph with every weight as external data, one tensor at a time: the initializer `table` alone
    in `embeddings_file` (its entry for the manifest is returned), the rest in `<path>.data`."""
    import onnx_ir as ir

    folder = path.parent
    inits = model.graph.initializers
    entry = None
    if table is not None:
        tensor = inits[table].const_value
        inits[table].const_value = _write([inits[table]], folder, embeddings_file)[0]
        entry = {"file": embeddings_file, "offset": 0, "shape": list(tensor.shape), "dtype": _numpy_dtype(tensor.dtype),
                 "initializer": table}
    for node in model.graph:  # the exporting machine's source paths: not shipped, and graphs stay reproducible
        node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)
    rest = _large(model, lambda v: v.name == table)
    for value, written in zip(rest, _write(rest, folder, path.name + ".data")):
        value.const_value = written
    ir.save(model, path)
    return entry


def _large(model, skip) -> list:
    """The initializers written as external data: INLINE_BYTES or more, and not skip(value)."""
    return [v for v in model.graph.initializers.values()
            if v.const_value is not None and v.const_value.nbytes >= INLINE_BYTES and not skip(v)]


def _write(values: list, folder: Path, file: str) -> list:
    """Write the values' tensors into folder/file one at a time (at most IN_FLIGHT_BYTES materialized at once)."""
    from onnx_ir import external_data

    return external_data.convert_tensors_to_external([v.const_value for v in values], folder, file,
                                                     max_in_flight_bytes=IN_FLIGHT_BYTES)


def initializer_of(model, real: dict[str, torch.Tensor], tensor: torch.Tensor | None) -> str | None:
    """The initializer bound to `tensor` (by storage: a tied parameter has several names, the graph keeps one)."""
    if tensor is None:
        return None
    inits = model.graph.initializers
    return next((n for n, t in real.items() if n in inits and t.data_ptr() == tensor.data_ptr()
                 and t.shape == tensor.shape), None)


def _numpy_dtype(dtype) -> str:
    return np.dtype(dtype.numpy()).name



def quantize_matmuls(path: Path, bits: int, block_size: int, accuracy_level: int, skip: set[str] = frozenset(),
                     plan=None) -> dict[str, str]:
    """Rewrite the saved float graph at `path` in place: every MatMul whose B is a 2-D fp32 initializer (not in
    `skip`) becomes the MatMulNBits that ONNX Runtime's MatMulNBitsQuantizer writes (its C++ packing, names and
    attributes), each weight read from the memory-mapped external data and packed only as it is written, so the
    float graph is never loaded whole. `plan` (export/int4.Int4Plan) picks a weight's bits instead of `bits` and,
    under int4, packs export/int4.py's searched codes and scales. Returns weight name -> "int<bits>/b<block>"."""
    import onnx_ir as ir

    model = ir.load(path)
    graph, replaced, packs, chosen = model.graph, 0, [], {}
    for node in list(graph):
        b = node.inputs[1] if node.op_type == "MatMul" and node.domain == "" else None
        tensor = b.const_value if b is not None and b.is_initializer() else None
        if tensor is None or b.name in skip or tensor.dtype != ir.DataType.FLOAT or len(tensor.shape) != 2:
            continue
        if plan is not None and plan.lattice is not None:
            quant = _lattice_packed(tensor, plan.lattice.weight(b.name), block_size)
            if quant is None:
                continue  # a weight the checkpoint keeps float
            chosen[b.name] = quant.lattice.label()
        else:
            wbits = matmul_bits(bits, plan, b.name)
            search = plan is not None and plan.searched and wbits in (2, 4)
            quant = _Packed(tensor, wbits, block_size, search, plan.importance_of(b.name) if search else None)
            chosen[b.name] = int4.label(wbits, block_size, quant.importance)
        packs.append(quant)
        _replace_matmul(graph, node, b, quant, quant.block_size, accuracy_level)
        replaced += 1
    if replaced:
        model.opset_imports.setdefault(MS_DOMAIN, 1)
        with progress(len(packs), f"quantizing {path.name}", "tensors") as advance:
            for quant in packs:  # each weight is packed while the file is written
                quant.done = advance
            _save_replacing(model, path)
    return chosen


def _lattice_packed(tensor, weight, channel_block: int) -> _Packed | None:
    """The checkpoint's codes of a MatMul weight (B is W^T: [in, out]), refused by name when they do not fit it."""
    if weight is None:
        return None
    if tuple(weight.shape[::-1]) != tuple(tensor.shape):
        raise ValueError(f"the checkpoint's codes {weight.shape} do not fit the graph weight {tensor.shape}")
    return _Packed(tensor, pack.widen(weight.bits, pack.ONNX_BITS), pack.onnx_block(weight, channel_block),
                   lattice=weight)


def _replace_matmul(graph, node, b, quant, block_size: int, accuracy_level: int) -> None:
    """node (MatMul(A, b)) -> MatMulNBits(A, packed, scales), both read lazily from quant as the file is written."""
    import onnx_ir as ir

    (k, n), bits = b.const_value.shape, quant.bits
    blocks, blob = nbits_layout(k, bits, block_size)
    packed = ir.Value(name=f"{b.name}_Q{bits}", shape=ir.Shape([n, blocks, blob]),
                      type=ir.TensorType(ir.DataType.UINT8), const_value=ir.LazyTensor(
                          lambda q=quant: ir.tensor(q.get(0)), dtype=ir.DataType.UINT8,
                          shape=ir.Shape([n, blocks, blob])))
    scales = ir.Value(name=f"{b.name}_scales", shape=ir.Shape([n, blocks]),
                      type=ir.TensorType(ir.DataType.FLOAT), const_value=ir.LazyTensor(
                          lambda q=quant: ir.tensor(q.get(1)), dtype=ir.DataType.FLOAT,
                          shape=ir.Shape([n, blocks])))
    attributes = {"K": k, "N": n, "bits": bits, "block_size": block_size}
    if accuracy_level:  # as the quantizer: the attribute is optional and left out at 0
        attributes["accuracy_level"] = accuracy_level
    new = ir.node("MatMulNBits", [node.inputs[0], packed, scales], attributes=attributes, domain=MS_DOMAIN,
                  name=f"{node.name}_Q{bits}" if node.name else "", outputs=[ir.Value(name=node.outputs[0].name)])
    for value in (packed, scales):
        graph.register_initializer(value)
    graph.insert_before(node, new)
    node.outputs[0].replace_all_uses_with(new.outputs[0], replace_graph_outputs=True)
    new.outputs[0].shape, new.outputs[0].type = node.outputs[0].shape, node.outputs[0].type
    graph.remove(node, safe=True)
    if not b.uses():
        graph.initializers.pop(b.name)


MS_DOMAIN = "com.microsoft"


def compact(path: Path) -> None:
    """Rewrite <graph>.onnx.data with only the tensors the saved graph still reads, streamed in chunks (the
    float tables a quantization replaced leave their bytes behind otherwise)."""
    import onnx_ir as ir

    data = path.with_name(path.name + ".data")
    if data.exists():
        _save_replacing(ir.load(path), path)


class _Packed:
    """One weight's (packed, scales), computed on the first read and dropped once both were read: the writer asks
    for them one after the other, so at most one weight's quantized copy is alive."""

    def __init__(self, tensor, bits: int, block_size: int, search: bool = False, importance=None, lattice=None):
        self.tensor, self.bits, self.block_size, self.result, self.reads = tensor, bits, block_size, None, 0
        self.search, self.importance, self.lattice = search, importance, lattice
        self.done = lambda n: None  # progress: called once per weight written

    def get(self, index: int) -> np.ndarray:
        if self.result is None and self.lattice is not None:  # the checkpoint's own codes and scales
            self.result = pack.nbits(self.lattice, self.bits, self.block_size)
        if self.result is None:
            w = self.tensor.numpy()
            self.result = _searched(w, self.block_size, self.importance, self.bits) if self.search else \
                _quantize(w, self.bits, self.block_size)
        value = self.result[index]
        self.reads += 1
        if self.reads % 2 == 0:
            self.result = None
            self.done(1)
        return value


def _quantize(w: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Runtime's symmetric blockwise packing of w [K, N] (DefaultWeightOnlyQuantizer.qbits_block_quant)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    k, n = w.shape
    blocks, blob = nbits_layout(k, bits, block_size)
    if blocks * block_size != k:
        w = np.pad(w, ((0, blocks * block_size - k), (0, 0)))
    w = np.ascontiguousarray(w, np.float32)
    packed = np.zeros((n, blocks, blob), np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    zero_points = np.zeros((n, -(-blocks * bits // 8)), np.uint8)
    kernel = quantize_matmul_8bits if bits == 8 else quantize_matmul_4bits
    kernel(packed, w, scales, zero_points, block_size, n, k, True)
    return packed, scales


def _searched(w: np.ndarray, block_size: int, importance: np.ndarray | None,
              bits: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' 4- or 2-bit (packed, scales) of w [K, N] from export/int4.py's codes: code + 2^(bits-1) (the
    op's default zero point), 8 / bits per byte along K, the lowest bits first; K zero-padded to whole blocks."""
    k, n = w.shape
    blocks, _ = nbits_layout(k, bits, block_size)
    pad = blocks * block_size - k
    rows = np.pad(np.asarray(w, np.float32).T, ((0, 0), (0, pad)))  # [N, K]: a row per output, as the op stores
    if importance is not None:  # [k] or [k, k]
        importance = np.pad(np.asarray(importance, np.float32), [(0, pad)] * np.ndim(importance))
    codes, scales = int4.encode(rows, block_size, importance, bits=bits)
    u = (codes.astype(np.int16) + (1 << (bits - 1))).astype(np.uint8).reshape(n, blocks, block_size)
    per = 8 // bits
    packed = np.zeros((n, blocks, block_size // per), np.uint8)
    for i in range(per):
        packed |= u[..., i::per] << (bits * i)
    return packed, scales.astype(np.float32)


def _save_replacing(model, path: Path) -> None:
    """Save over the graph whose external data the model still reads: the data into a new file first (every lazy
    tensor is read while it is written), renamed over the old one, then the graph pointing at it."""
    import onnx_ir as ir

    data = path.name + ".data"
    rest = _large(model, lambda v: _in_other_file(v.const_value, data))
    written = _write(rest, path.parent, data + ".new")
    kept = {id(v) for v in rest}
    for value in model.graph.initializers.values():  # small ones stay inline: read them before the old data goes
        if id(value) not in kept and value.const_value is not None and not _in_other_file(value.const_value, data):
            value.const_value = ir.tensor(value.const_value.numpy(), name=value.name)
    (path.parent / (data + ".new")).replace(path.parent / data)
    for value, tensor in zip(rest, written):
        value.const_value = ir.ExternalTensor(data, tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
                                              name=value.name, base_dir=path.parent)
    ir.save(model, path)


def _in_other_file(tensor, data: str) -> bool:
    """A tensor kept in another external file (the shared embeddings.bin): left where it is."""
    import onnx_ir as ir

    return isinstance(tensor, ir.ExternalTensor) and tensor.location != data
