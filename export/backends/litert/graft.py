"""LiteRT graphs without holding the model: convert a weightless graph, then graft the weights in, streamed.

litert-torch converts a module whose weights are constants into a flatbuffer that holds them all, several times
over while it converts (4.3 W, docs/export-memory.md). Here the converter sees every weight as a signature input
instead (`weights_as_inputs`: the module's parameters on the meta device, the inputs `torch.empty`, never touched),
so the converted graph is a few MB at any size. `graft` then turns each weight input into a constant: it writes the
flatbuffer first, with every weight's buffer at an offset after it (LiteRT's large-model layout, which LiteRT and
LiteRT-LM load at any size), and streams the weights behind it, a block of rows at a time, encoded as they are
written: float32, float16, int8 channelwise or int4 blockwise, the layouts ai-edge-quantizer writes (dynamic range:
float activations, quantized weights). The same function re-encodes a grafted file (float -> fp16 / int8 / int4)
reading the float weights from that file's memory map, so one float export serves every recipe. What it reads the
weights from: sources.py.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ... import int4
from ...progress import progress
# the encodings live in encodings.py; graft's callers take them from here too
from .encodings import INT8_SCALE, INT8_ZERO_POINT, PER_CHANNEL, Encoding  # noqa: F401
from .encodings import channel_block, int4_block, lattice_encoding, unquantized  # noqa: F401

WEIGHT = "w:"  # name prefix of every grafted weight tensor: "w:" + the module's parameter name
_INPUT = "mtpkit_weight_"  # the signature-input names the converter sees
_ALIGN = 64
SLACK = 4096  # room after the first packing of the flatbuffer: packed again with the int8 scales, it must not grow
_ROWS_BYTES = 16 << 20  # rows read and encoded per step: each encoding holds a few temporaries of this size


# ---- conversion with the weights as inputs ----

# litert-torch names every tensor after the module that computed it (`<__module__>.<qualname>;<n>`): a fixed scope,
# not this file's import path, so the graphs' bytes do not depend on where the code lives
TENSOR_NAME_SCOPE = "mtpkit.export.backends.litert_graft"

class WeightInputs:
    """Converts modules with their weights as signature inputs, one input name per weight tensor.

    A tensor keeps its input name across every module and signature that reaches it (prefill / decode / verify
    wrap the same model), so the grafted weight is stored once. `names` maps input name -> parameter name (as
    the first module that reached it calls it); buffers become inputs only where `buffer_kept(name)` says so
    (persistent buffers that carry checkpoint values). The samples are uninitialized float32 tensors: address
    space only, the converter reads shapes, not values.
    """

    def __init__(self, buffer_kept: Callable[[str], bool] = lambda name: False):
        self.buffer_kept = buffer_kept
        self.keys: dict[int, str] = {}  # id(tensor) -> input name
        self.names: dict[str, str] = {}  # input name -> parameter name

    def wrap(self, module, sample_kwargs: dict) -> tuple:
        """(wrapper module, sample kwargs with the weights added)."""
        import torch
        from torch import nn

        chosen = dict(module.named_parameters())
        chosen.update({n: b for n, b in module.named_buffers() if b.is_floating_point() and self.buffer_kept(n)})
        mine = {}
        for name, tensor in chosen.items():
            key = self.keys.setdefault(id(tensor), f"{_INPUT}{len(self.keys)}")
            if len(name) > len(self.names.get(key, "")):  # the most qualified path: the embedders see a submodule
                self.names[key] = name
            mine[key] = (name, tuple(tensor.shape))

        class WeightsAsInputs(nn.Module):
            def __init__(self):
                super().__init__()
                # not a registered submodule: torch.export would lift its (meta) parameters as constants
                object.__setattr__(self, "inner", module)

            def forward(self, **kwargs):
                weights = {mine[k][0]: kwargs.pop(k) for k in list(kwargs) if k in mine}
                return torch.func.functional_call(self.inner, weights, args=(), kwargs=kwargs, tie_weights=True,
                                                  strict=False)

        WeightsAsInputs.__module__ = TENSOR_NAME_SCOPE

        dtypes = {k: chosen[name].dtype if not chosen[name].is_floating_point() else torch.float32
                  for k, (name, _) in mine.items()}  # a packed table's bytes stay uint8 (tables.py)
        samples = {k: torch.empty(shape, dtype=dtypes[k]) for k, (_, shape) in mine.items()}
        # export_hf makes its samples on the parameters' device, meta here; tracing wants them beside the weights
        given = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda v: torch.ones(v.shape, dtype=v.dtype) if v.is_meta else v, sample_kwargs)
        return WeightsAsInputs(), {**given, **samples}

    @contextlib.contextmanager
    def converting(self):
        """litert-torch's Converter.add_signature wraps every module it is given, for the block."""
        from litert_torch._convert import interface

        from ...scoped import patched

        real = interface.Converter.add_signature

        def add_signature(converter, name, module, sample_args=None, sample_kwargs=None, **kwargs):
            if sample_args:
                raise ValueError("weights as inputs needs keyword sample inputs")
            wrapper, samples = self.wrap(module, sample_kwargs or {})
            return real(converter, name, wrapper, None, samples, **kwargs)

        with patched(interface.Converter, "add_signature", add_signature):
            yield self


def read_map(path: Path) -> mmap.mmap:
    """A read-only memory map of a file. Never closed explicitly: views into it (numpy arrays the flatbuffer
    object API keeps) would make close() raise; it goes with its last reference, and the file may be replaced
    meanwhile (the map keeps the old inode)."""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


# ---- the graft ----

def _opnames(model) -> list[str]:
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    return [names.get(max(c.builtinCode, c.deprecatedBuiltinCode), "?") for c in model.operatorCodes]


def find_weights(model, names: dict[str, str] | None = None) -> dict[str, list[tuple[int, int]]]:
    """Parameter name -> (subgraph, tensor) of every weight: fresh signature inputs (`names`: input key -> name)
    or tensors a previous graft named WEIGHT + name."""
    found: dict[str, list[tuple[int, int]]] = {}
    for g, sg in enumerate(model.subgraphs):
        for t, tensor in enumerate(sg.tensors):
            name = tensor.name.decode()
            if name.startswith(WEIGHT):
                found.setdefault(name[len(WEIGHT):], []).append((g, t))
    for sig in model.signatureDefs or []:
        for io in sig.inputs:
            key = io.name.decode()
            if names and key in names:
                found.setdefault(names[key], []).append((sig.subgraphIndex, io.tensorIndex))
    return found


def weight_uses(model, where: dict[str, list[tuple[int, int]]]) -> dict[str, set[tuple[str, int]]]:
    """Parameter name -> {(op name, input position)} over every subgraph."""
    ops = _opnames(model)
    owner = {gt: name for name, places in where.items() for gt in places}
    uses: dict[str, set] = {name: set() for name in where}
    for g, sg in enumerate(model.subgraphs):
        for op in sg.operators:
            for p, t in enumerate(op.inputs):
                if (g, int(t)) in owner:
                    uses[owner[(g, int(t))]].add((ops[op.opcodeIndex], p))
    return uses


def _detach_inputs(model, where) -> None:
    """Weight tensors stop being graph and signature inputs."""
    places = {gt for p in where.values() for gt in p}
    for g, sg in enumerate(model.subgraphs):
        sg.inputs = np.array([t for t in sg.inputs if (g, int(t)) not in places], np.int32)
    for sig in model.signatureDefs or []:
        sig.inputs = [io for io in sig.inputs if (sig.subgraphIndex, io.tensorIndex) not in places]


def graft(skeleton: bytes | Path, out: Path, source, choose: Callable[[str, tuple, set], Encoding],
          names: dict[str, str] | None = None, rewrite: Callable[[object, list[dict]], None] | None = None) \
        -> dict[str, str]:
    """Write `skeleton` to `out` with every weight a constant from `source`, encoded as `choose` says. `rewrite`
    (model, placed weights) may change the graph's ops once the weights are placed (static_int8.py).

    Returns parameter name -> encoding ("int4/b32", "int8", "float32", ...). `out` appears complete or not at all.
    """
    from ai_edge_litert import schema_py_generated as schema

    if isinstance(skeleton, Path):
        model = schema.ModelT.InitFromPackedBuf(read_map(skeleton), 0)  # the flatbuffer only: weights follow it
    else:
        model = schema.ModelT.InitFromPackedBuf(skeleton, 0)
    where = find_weights(model, names)
    uses = weight_uses(model, where)
    _detach_inputs(model, where)
    plan = []  # (name, encoding, shape, data buffer, scales buffer, quantization objects to fill)
    for name, places in where.items():
        if not uses[name]:  # an input no op reads (the module reached it, its graph does not): stored nowhere
            for g, t in places:
                model.subgraphs[g].tensors[t].buffer = 0
            continue
        shape = tuple(int(x) for x in model.subgraphs[places[0][0]].tensors[places[0][1]].shape)
        if tuple(source.shape(name)) != shape and int(np.prod(source.shape(name))) != int(np.prod(shape)):
            raise ValueError(f"weight {name}: the graph wants shape {shape}, the source has {source.shape(name)}")
        enc = choose(name, shape, uses[name])
        if _integer(model, places[0]) and enc.kind != "uint8":
            enc = Encoding("uint8")  # a packed table's bytes (tables.py): written as they are in every pass
        plan.append(_place(model, name, places, shape, enc))
    if rewrite is not None:
        rewrite(model, plan)
    return _write(model, plan, source, Path(out))


def _integer(model, place: tuple[int, int]) -> bool:
    from ai_edge_litert import schema_py_generated as schema

    return model.subgraphs[place[0]].tensors[place[1]].type == schema.TensorType.UINT8


def _new_buffer(model) -> int:
    from ai_edge_litert import schema_py_generated as schema

    buf = schema.BufferT()
    buf.offset, buf.size = 1, 1  # placeholders until the layout is known (present, non-zero fields)
    model.buffers.append(buf)
    return len(model.buffers) - 1


def _place(model, name, places, shape, enc: Encoding) -> dict:
    from ai_edge_litert import schema_py_generated as schema

    data = _new_buffer(model)
    scales = _new_buffer(model) if enc.kind == "int4" else None
    quants = []
    types = {"float32": schema.TensorType.FLOAT32, "float16": schema.TensorType.FLOAT16,
             "int8": schema.TensorType.INT8, "int4": schema.TensorType.INT4, "int4c": schema.TensorType.INT4,
             "int2": schema.TensorType.INT2, "uint8": schema.TensorType.UINT8}
    for g, t in places:
        sg = model.subgraphs[g]
        tensor = sg.tensors[t]
        tensor.name, tensor.buffer, tensor.type = (WEIGHT + name).encode(), data, types[enc.kind]
        tensor.shapeSignature = None
        tensor.quantization = None
        if enc.kind in PER_CHANNEL:
            q = schema.QuantizationParametersT()
            q.scale, q.zeroPoint = np.ones(shape[0], INT8_SCALE), np.zeros(shape[0], INT8_ZERO_POINT)
            q.quantizedDimension = 0
            tensor.quantization = q
            quants.append(q)
        elif enc.kind == "int4":
            st = schema.TensorT()
            st.name, st.buffer, st.type = (WEIGHT + name + ";scales").encode(), scales, schema.TensorType.FLOAT16
            st.shape = np.array([shape[0], shape[1] // enc.block], np.int32)
            sg.tensors.append(st)
            details = schema.BlockwiseQuantizationT()
            details.scales, details.zeroPoints, details.blockSize = len(sg.tensors) - 1, -1, enc.block
            q = schema.QuantizationParametersT()
            q.detailsType, q.details = schema.QuantizationDetails.BlockwiseQuantization, details
            tensor.quantization = q
        elif enc.kind == "float16":
            _dequantize_before_use(model, g, t, shape)
    return {"name": name, "enc": enc, "shape": shape, "data": data, "scales": scales, "quants": quants}


def _dequantize_before_use(model, g: int, t: int, shape) -> None:
    """A float16 weight feeds its ops through a DEQUANTIZE to float32 (what FLOAT_CASTING writes)."""
    from ai_edge_litert import schema_py_generated as schema

    dequantize = opcode(model, schema.BuiltinOperator.DEQUANTIZE, version=1)
    sg = model.subgraphs[g]
    wide = schema.TensorT()
    wide.name, wide.type, wide.shape = sg.tensors[t].name + b";float32", schema.TensorType.FLOAT32, np.array(shape,
                                                                                                            np.int32)
    wide.buffer = 0
    sg.tensors.append(wide)
    w = len(sg.tensors) - 1
    for op in sg.operators:
        op.inputs = np.array([w if int(i) == t else int(i) for i in op.inputs], np.int32)
    deq = schema.OperatorT()
    deq.opcodeIndex, deq.inputs, deq.outputs = dequantize, np.array([t], np.int32), np.array([w], np.int32)
    sg.operators.insert(0, deq)


def opcode(model, builtin: int, version: int | None = None) -> int:
    """The index of `builtin` among the model's operator codes (-1 if absent); appended at `version` when given."""
    from ai_edge_litert import schema_py_generated as schema

    for i, c in enumerate(model.operatorCodes):
        if max(c.builtinCode, c.deprecatedBuiltinCode) == builtin:
            return i
    if version is None:
        return -1
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def _pack(model) -> bytes:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    builder = flatbuffers.Builder(1 << 20)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _write(model, plan: list[dict], source, out: Path) -> dict[str, str]:
    """Flatbuffer first (offsets computed from the encoded sizes), then the weights; the flatbuffer is packed
    again with the int8 scales found while writing (same length: only values change)."""
    fresh = {p[key] for p in plan for key in ("data", "scales") if p[key] is not None}
    for i, buf in enumerate(model.buffers):  # a re-grafted file's old weight buffers: unreferenced from here on
        if buf.offset > 1 and i not in fresh:
            buf.offset, buf.size = 0, 0
    lay_out(model, [(p[key], size) for p in plan for key, size in (("data", p["enc"].data_bytes(p["shape"])),
                                                                   ("scales", p["enc"].scale_bytes(p["shape"])))
                     if p[key] is not None])
    head = _pack(model)
    tmp = out.with_name(f".{out.name}.partial")
    encodings = {}
    try:
        with open(tmp, "wb") as f, progress(len(plan), f"writing {out.name}", "tensors") as advance:
            f.write(head)
            for p in plan:
                encodings[p["name"]] = _write_weight(f, model, p, source)
                advance(1)
            f.truncate(max(f.tell(), 1))
            final = _pack(model)
            if len(final) != len(head):
                raise RuntimeError(f"{out.name}: the flatbuffer changed length when packed again")
            f.seek(0)
            f.write(final)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return encodings


def aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def lay_out(model, buffers: list[tuple[int, int]]) -> int:
    """Place buffers (index, size) after the flatbuffer in the given order: the first SLACK bytes past the packed
    flatbuffer's end, each at a 64-byte aligned offset. Returns where the last one ends (the flatbuffer's end if none)."""
    end = len(_pack(model))
    cursor = aligned(end + SLACK)
    for k, size in buffers:
        model.buffers[k].offset, model.buffers[k].size = cursor, size
        end = cursor + size
        cursor = aligned(end)
    return end


def _write_weight(f, model, p: dict, source) -> str:
    enc, shape = p["enc"], p["shape"]
    rows = shape[0] if shape else 1
    width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    step = max(1, _ROWS_BYTES // (4 * width))
    f.seek(model.buffers[p["data"]].offset)
    scales = []
    for start in range(0, rows, step):
        block = source.rows(p["name"], start, min(rows, start + step)).reshape(-1, *shape[1:]) if shape else \
            source.rows(p["name"], 0, 1)
        data, scale = enc.encode(block if enc.kind in ("float32", "float16") else block.reshape(len(block), -1), start)
        f.write(data)
        if scale is not None:
            scales.append(scale)
    if enc.kind in PER_CHANNEL:
        for q in p["quants"]:
            q.scale = np.concatenate(scales).astype(INT8_SCALE)
    if enc.kind == "int4":
        f.seek(model.buffers[p["scales"]].offset)
        f.write(np.concatenate(scales).astype(np.float16).tobytes())
    if enc.lattice is not None:
        return enc.lattice.label()
    if enc.kind == "int2":
        return int4.label(2, shape[1], enc.importance)
    return int4.label(4, enc.block, enc.importance) if enc.kind == "int4" else enc.kind
