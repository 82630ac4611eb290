"""LiteRT quantization: ai-edge-quantizer 0.10.0 on each float .tflite, then the .litertlm bundle's sections swapped
for the results. Called through export/backends/litert.py `quantize` (the backend's one entry point)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
from pathlib import Path

import numpy as np

from mtpkit.runtime.manifest import Backend, GraphFile, Signature, TensorSpec, sha256_file

# ---- quantization: ai-edge-quantizer on each float .tflite, then the bundle's sections swapped for the results ----

# graph key in the manifest -> model_type of its .litertlm section (litert_lm_builder.TfLiteModelType)
BUNDLE_SECTIONS = {"target": "tf_lite_prefill_decode", "embedder": "tf_lite_embedder",
                   "per_layer_embedder": "tf_lite_per_layer_embedder", "drafter": "tf_lite_mtp_drafter"}
_BLOCKWISE_OPS = ("FULLY_CONNECTED", "EMBEDDING_LOOKUP")  # aeq quantizes only these blockwise (input dim 1)


def quantize(folder: Path, backend: Backend, recipes: dict[str, str], block_size: int = 32,
             accuracy_level: int = 4, ple_bits: int = 8) -> Backend:
    """Rewrite the float .tflite files in folder in place with ai-edge-quantizer, a recipe per side
    ({"target": "int4", "drafter": "int8"}; "target" covers target, embedder and per_layer_embedder), and rebuild
    model.litertlm with the same bytes in its sections. Derived from a float export, so one export serves every
    recipe. The KV cache and every signature's inputs/outputs stay float (weights-only recipes).

    fp16: FLOAT_CASTING of the FULLY_CONNECTED / EMBEDDING_LOOKUP (and conv) weights to float16;
    int8: dynamic_wi8_afp32 (int8 channelwise weights, float activations quantized by the kernel at run time);
    int4: dynamic int4 blockwise weights (aeq's dynamic_wi4b{block_size}_afp32) for FULLY_CONNECTED and
        EMBEDDING_LOOKUP, the ops holding the weights here (as LiteRT-LM's gemma4_mixed48_b32 does), the block
        picked per tensor where a width is not a multiple of it (_int4); as in gemma4_mixed48 the
        per-layer-embedding path keeps 8 bits (the per_layer_embedder table and the target's per_layer
        projections): a 4-bit PLE table is where Gemma 4 broke elsewhere. per_layer_embedder is recorded as int8.
        ple_bits=4 (`--ple-quant int4`, only when asked) gives the PLE path 4 bits too.
    int8-dynamic: int8 (see ALIASES), so stored as int8 in the graphs, the bundle and its section recipes.
    accuracy_level is ONNX Runtime's (MatMulNBits) and has no LiteRT counterpart; it is accepted and ignored.
    """
    folder = Path(folder)
    recipes = {side: ALIASES.get(recipe, recipe) for side, recipe in recipes.items()}
    for recipe in recipes.values():
        if recipe not in ("fp32", *RECIPES):
            raise ValueError(f"unknown LiteRT quantization recipe {recipe!r}; choose from fp32, {', '.join(RECIPES)}")
    graphs, options = dict(backend.graphs), dict(backend.options)
    detail = dict(options.get("quantization") or {})
    changed = False
    for name in BUNDLE_SECTIONS:
        recipe = recipes.get("drafter" if name == "drafter" else "target", "fp32")
        if name not in graphs or recipe == "fp32" or graphs[name].recipe != "fp32":
            continue  # float requested, or already quantized
        path = folder / graphs[name].file
        stored, how = _quantize_tflite(path, name, recipe, block_size, ple_bits)
        graphs[name] = dataclasses.replace(_graph_file(folder, graphs[name].file), recipe=stored)
        detail[name] = {"recipe": stored, **how}
        changed = True
    if not changed:
        return backend
    bundle = graphs["bundle"].file
    sections = rebuild_bundle(folder / bundle, {BUNDLE_SECTIONS[n]: folder / graphs[n].file
                                                for n in BUNDLE_SECTIONS if n in graphs})
    graphs["bundle"] = dataclasses.replace(_graph_file(folder, bundle), recipe=graphs["target"].recipe)
    options["bundle"] = {**options["bundle"], "section_recipes": {
        section: graphs[name].recipe for name, section in BUNDLE_SECTIONS.items() if section in sections}}
    options["quantization"] = detail
    return dataclasses.replace(backend, graphs=graphs, signatures=redescribe(folder, graphs, backend.signatures),
                               options=options)


def _graph_file(folder: Path, name: str) -> GraphFile:
    path = folder / name
    return GraphFile(file=name, sha256=sha256_file(path), bytes=path.stat().st_size, backend="litert")


RECIPES = ("fp16", "int8", "int4")
# LiteRT's int8 (dynamic_wi8_afp32) already quantizes activations at run time, so ONNX's int8-dynamic is that recipe
# here: the same bytes, recorded under the name of what they are
ALIASES = {"int8-dynamic": "int8"}


def _quantize_tflite(path: Path, name: str, recipe: str, block_size: int, ple_bits: int = 8) -> tuple[str, dict]:
    """Quantize one .tflite in place; returns (the recipe it now carries, how: aeq rules, per-tensor exceptions)."""
    from ai_edge_quantizer import algorithm_manager, qtyping, quantizer
    from ai_edge_quantizer import recipe as aeq_recipes

    if recipe == "int4" and name == "per_layer_embedder" and ple_bits == 8:
        recipe = "int8"  # the PLE table keeps 8 bits (see quantize's docstring)
    qt = quantizer.Quantizer(str(path))
    rules: list[str] = []
    how: dict = {"aeq": rules}
    if recipe == "fp16":
        qt.add_weight_only_config(regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED, num_bits=16,
                                  algorithm_key=algorithm_manager.AlgorithmName.FLOAT_CASTING)
        rules.append("weight_only float16 (FLOAT_CASTING), all supported ops")
    elif recipe == "int8":
        qt.load_quantization_recipe(aeq_recipes.dynamic_wi8_afp32())
        rules.append("dynamic_wi8_afp32 (int8 channelwise weights, float activations)")
    else:
        how["block_size"] = block_size
        how["per_tensor_blocks"] = _int4(qt, path, block_size, rules,
                                         keep_8bit="per_layer" if name == "target" and ple_bits == 8 else None)
    with _quiet_aeq(), np.errstate(invalid="ignore"):  # all-zero int4 blocks: 0/0, handled below
        data = bytearray(qt.quantize(enable_progress_bar=False, enable_progress_report=False).quantized_model)
    if recipe == "int4":
        how["zero_scales_raised"] = nonzero_int4_scales(data)
    tmp = path.with_name(f".{path.name}.quantized")
    tmp.write_bytes(data)
    tmp.replace(path)
    return recipe, how


class _DropSharedBufferNotice(logging.Filter):
    """aeq warns once per weight shared by several signatures ("... is overriding other previously quantized data
    in buffer N"): the same weight quantized again with the same rule, i.e. the same bytes. Thousands of lines on
    a real model, nothing to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is overriding other previously quantized data" not in record.getMessage()


@contextlib.contextmanager
def _quiet_aeq():
    """aeq's notices filtered, and its transformation progress bar off: ai-edge-quantizer 0.10.0's
    Quantizer.quantize(enable_progress_bar=False) does not pass the flag on to ModelModifier.modify_model, whose
    "Applying Transformations to tensors" bar then turns itself on for large models (thousands of tensors)."""
    from ai_edge_quantizer import model_modifier

    from mtpkit.export.scoped import patched

    real = model_modifier.ModelModifier.modify_model

    def modify_model(self, params, *args, **kwargs):
        kwargs["enable_progress_bar"] = False
        return real(self, params, *args[:1], **kwargs)

    root, noise = logging.getLogger(), _DropSharedBufferNotice()
    root.addFilter(noise)
    try:
        with patched(model_modifier.ModelModifier, "modify_model", modify_model):
            yield
    finally:
        root.removeFilter(noise)


def nonzero_int4_scales(data: bytearray) -> int:
    """Replace zero scales of INT4 weights by the smallest normal float16, in place; returns how many.

    A weight block (or channel) that is all zeros, e.g. the pad token's row of the tied embedding / lm_head, gets
    scale 0 from aeq, and XNNPACK then refuses the whole graph ("unsupported scale value (0.000000) in channel 0
    for INT4 tensor N"). The block's quantized values are all 0, so any positive scale dequantizes it exactly.
    Patched through flatbuffer views (no re-serialization), blockwise scale tensors and per-channel scales alike.
    """
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(data, 0)
    tiny = np.finfo(np.float16).tiny
    raised, seen = 0, set()

    def buffer_view(index: int, dtype) -> np.ndarray:
        buf = model.Buffers(index)
        if buf.Offset() > 1:  # large models keep buffers after the flatbuffer
            return np.frombuffer(memoryview(data)[buf.Offset(): buf.Offset() + buf.Size()], dtype)
        return buf.DataAsNumpy().view(dtype) if buf.DataLength() else np.zeros(0, dtype)

    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            q = tensor.Quantization()
            if tensor.Type() != schema.TensorType.INT4 or q is None:
                continue
            if q.DetailsType() == schema.QuantizationDetails.BlockwiseQuantization:
                details = schema.BlockwiseQuantization()
                table = q.Details()
                details.Init(table.Bytes, table.Pos)
                scales = subgraph.Tensors(details.Scales())
                if scales.Buffer() in seen:
                    continue
                seen.add(scales.Buffer())
                dtype = np.float16 if scales.Type() == schema.TensorType.FLOAT16 else np.float32
                view = buffer_view(scales.Buffer(), dtype)
                zero = view == 0
                if zero.any() and tensor.ShapeLength() == 2 and details.BlockSize() % 2 == 0:
                    # aeq computed the block's values as 0/0; make them exactly 0 (two int4 values per byte)
                    cols, block = tensor.Shape(1), details.BlockSize()
                    packed = buffer_view(tensor.Buffer(), np.uint8)
                    for r, b in zip(*np.nonzero(zero.reshape(-1, cols // block))):
                        start = (int(r) * cols + int(b) * block) // 2
                        packed[start: start + block // 2] = 0
            elif q.ScaleLength():
                view = q.ScaleAsNumpy()
                zero = view == 0
            else:
                continue
            if zero.any():
                view[zero] = tiny if view.dtype == np.float16 else np.float32(tiny)
                raised += int(zero.sum())
    return raised


def _int4(qt, path: Path, block_size: int, rules: list, keep_8bit: str | None) -> list[dict]:
    """Weight int4 blockwise (dynamic: float activations), with the block picked per tensor where needed.

    aeq aborts the whole file with "Quantized dimension N in tensor shape ... is not divisible by block size B"
    when any FULLY_CONNECTED / EMBEDDING_LOOKUP weight's input dimension (dim 1) is not a multiple of the block,
    which tiny test configs (and a drafter with hidden 32 under block 64/128) trip. Such ops get their own rule,
    matched on the op's exact scope (aeq's regex over its output tensor names): the largest of 128/64/32 not
    above block_size that divides the dimension, else int4 channelwise. Returns these exceptions grouped by op
    kind, input dimension and granularity (empty when every weight fits the block, as with Gemma 4's widths).
    """
    import re

    from ai_edge_quantizer import qtyping

    op = qtyping.TFLOperationName
    g = qtyping.QuantGranularity
    for kind in _BLOCKWISE_OPS:
        qt.add_dynamic_config(regex=".*", operation_name=getattr(op, kind), num_bits=4,
                              granularity=getattr(g, f"BLOCKWISE_{block_size}"))
    rules.append(f"dynamic int4 blockwise {block_size} for FULLY_CONNECTED and EMBEDDING_LOOKUP (float activations)")
    if keep_8bit:
        qt.add_dynamic_config(regex=keep_8bit, operation_name=op.FULLY_CONNECTED, num_bits=8,
                              granularity=g.CHANNELWISE)
        rules.append(f"dynamic int8 channelwise for FULLY_CONNECTED matching {keep_8bit!r}")
    exceptions = {}
    for kind, scope, dim in _blockwise_weights(path):
        if dim % block_size == 0 or (keep_8bit and kind == "FULLY_CONNECTED" and re.search(keep_8bit, scope)):
            continue
        block = next((b for b in (128, 64, 32) if b <= block_size and dim % b == 0), None)
        granularity = getattr(g, f"BLOCKWISE_{block}") if block else g.CHANNELWISE
        qt.add_dynamic_config(regex=f"^{re.escape(scope)}$", operation_name=getattr(op, kind), num_bits=4,
                              granularity=granularity)
        key = (kind, dim, granularity.value)
        exceptions[key] = exceptions.get(key, 0) + 1
    return [{"op": k, "input_dim": d, "granularity": gr, "ops": n} for (k, d, gr), n in sorted(exceptions.items())]


def _blockwise_weights(path: Path) -> list[tuple[str, str, int]]:
    """(op kind, aeq op scope, weight input dimension) of every FULLY_CONNECTED / EMBEDDING_LOOKUP."""
    from ai_edge_quantizer.utils import tfl_flatbuffer_utils as tfl

    model = tfl.read_model(str(path))
    found = []
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            kind = tfl.TFL_OP_CODE_TO_NAME.get(model.operatorCodes[op.opcodeIndex].builtinCode)
            kind = getattr(kind, "value", kind)
            if kind not in _BLOCKWISE_OPS or len(op.inputs) < 2 or op.inputs[1] < 0:
                continue
            shape = subgraph.tensors[op.inputs[1]].shape  # FC weight [out, in]; lookup table [rows, dim]
            if shape is not None and len(shape) == 2:
                found.append((kind, tfl.get_op_scope(op, subgraph.tensors), int(shape[1])))
    return found


def rebuild_bundle(bundle: Path, files: dict[str, Path]) -> list[str]:
    """Replace every .tflite section of the .litertlm by the file of its model_type, keeping the other sections
    (metadata, tokenizer) and the section order; check the result carries exactly the files' bytes.

    Returns the model types of the bundle's TFLite sections.
    """
    from ai_edge_quantizer.utils import litertlm_utils

    bundle = Path(bundle)
    source = litertlm_utils.LiteRTLMFile(bundle)
    overrides, types = {}, []
    for i, section in enumerate(source.sections):
        if section.dataType != litertlm_utils.AnySectionDataType.TFLiteModel:
            continue
        model_type = source.get_model_type(i)
        if model_type not in files:
            raise RuntimeError(f"{bundle.name}: section {i} has model_type {model_type!r}, which no exported "
                               f"file provides (have {', '.join(files)})")
        overrides[i] = files[model_type].read_bytes()
        types.append(model_type)
    missing = set(files) - set(types)
    if missing:
        raise RuntimeError(f"{bundle.name} has no section for {', '.join(sorted(missing))}")
    tmp = bundle.with_name(f".{bundle.name}.rebuilt")
    source.serialize(tmp, overrides)
    shutil.copymode(bundle, tmp)  # serialize creates it executable
    del source  # the source's buffers are read from bundle until here
    rebuilt = litertlm_utils.LiteRTLMFile(tmp)
    for i, data in overrides.items():
        if bytes(rebuilt.get_section_buffer(i)) != data:
            tmp.unlink()
            raise RuntimeError(f"{bundle.name}: rebuilt section {i} ({types[list(overrides).index(i)]}) differs "
                               "from its .tflite file")
    tmp.replace(bundle)
    return types


def redescribe(folder: Path, graphs: dict[str, GraphFile], signatures: dict[str, Signature]) -> dict[str, Signature]:
    """Signatures with shapes / dtypes read back from the rewritten files (roles, layers and names kept): the
    runtime binds by role, so a dtype change must reach the manifest. A renamed or missing tensor is an error."""
    from ai_edge_litert.interpreter import Interpreter

    interpreters, out = {}, {}
    for key, sig in signatures.items():
        graph = graphs[sig.graph]
        if graph.file not in interpreters:
            interpreters[graph.file] = Interpreter(model_path=str(folder / graph.file))
        runner = interpreters[graph.file].get_signature_runner(sig.backend_name)

        def specs(old: list[TensorSpec], details: dict) -> list[TensorSpec]:
            if {t.name for t in old} != set(details):
                raise RuntimeError(f"{graph.file} signature {sig.backend_name}: tensors changed by quantization "
                                   f"({sorted(t.name for t in old)} -> {sorted(details)})")
            return [dataclasses.replace(t, shape=[int(x) for x in details[t.name]["shape"]],
                                        dtype=np.dtype(details[t.name]["dtype"]).name) for t in old]

        out[key] = dataclasses.replace(sig, inputs=specs(sig.inputs, runner.get_input_details()),
                                       outputs=specs(sig.outputs, runner.get_output_details()))
    return out


