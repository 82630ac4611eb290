"""ONNX quantization: the float graphs rewritten in place under a recipe per graph, the tied embedding table
quantized once and kept shared with the host's lookup, the lookup tables (PLE, the drafter's centroid head) as
GatherBlockQuantized."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mtpkit.runtime.backends.onnx import release
from mtpkit.runtime.manifest import Backend, OnnxOptions

from ... import int4
from ...recipes import CHANNELWISE_ONNX_BLOCK, Recipe
from ...recipes import recipe as recipe_named
from ...scoped import logger_level, root_logging_kept
from . import stream
from .embedding import drop_stale_data, quantize_shared_table, save_with_table_external
from .encodings import LOOKUP, MATMUL, encoding_for
from .graphs import EMBEDDINGS_FILE, graph_file, node_count

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)
_TWO_GB = 2**31 - 2**26  # protobuf's hard limit, with headroom for the graph itself


def quantize(folder: Path, backend: Backend, recipes: dict[str, Recipe], block_size: int = 32,
             accuracy_level: int = 4, ple_bits: int = 8, plans: dict | None = None) -> Backend:
    """Rewrite float graphs in folder in place with a recipe per graph ({"target": int4, "drafter": int8}, Recipes):
    weight-only int8 / int4 MatMulNBits, int8-dynamic (ORT's quantize_dynamic), or fp16 with the norms kept in
    fp32. The tied embedding / lm_head table is quantized once at the recipe's table_bits (MatMulNBits +
    GatherBlockQuantized over the same bytes, see embedding.py) and stays stored once in embeddings.bin, where the
    host's drafter lookup reads it too; the drafter's centroid-head table (a Gather's) becomes GatherBlockQuantized
    at the recipe's draft_table_bits. Derived from a float export, so one export serves every recipe. `plans`
    ("target" / "drafter" -> export/int4.Int4Plan, int4 recipes): the weights kept at 8 bits and the scale search's
    importance; the choice per weight is recorded in options.quantization."""
    import onnx

    graphs, options = dict(backend.graphs), backend.options
    assert isinstance(options, OnnxOptions)  # this module's own entry
    embedding, lookup, oldest = options.embedding, dict(options.lookup_tables or {}), options.min_onnxruntime
    detail = dict(options.quantization or {})
    for name, recipe in recipes.items():
        if not recipe.quantized or recipe_named(graphs[name].recipe).quantized:
            continue
        path = folder / graphs[name].file
        shared_name = _external_initializer(path, EMBEDDINGS_FILE)
        plan = (plans or {}).get(name)
        int4.require_plan(recipe, plan, name)
        block = CHANNELWISE_ONNX_BLOCK if recipe.channelwise else block_size
        # a checkpoint's lattice is computed in fp32: int8 compute (level 4) would re-round the activations its
        # static scales already rounded, and the graphs would no longer compute what transformers does
        level = 0 if recipe.lattice else accuracy_level
        model, tensors = _weights_quantized(path, recipe, block, level, skip=shared_name, plan=plan)
        streamed = recipe.onnx == "streamed"  # its weights stay in <graph>.onnx.data: tables go there too
        tables = dict(base_dir=str(folder), data_file=path.name + ".data" if streamed else None)
        model, layout, ple, drafted = _quantize_tables(model, name, recipe, shared_name, plan, ple_bits,
                                                       block_size=block, accuracy_level=level, **tables)
        if layout:
            tensors[shared_name] = f"int{layout['bits']}/b{block}"
        tensors.update(drafted)
        lookup.update(ple)
        if layout or lookup or drafted:  # GatherBlockQuantized's `bits` attribute (embedding.py)
            oldest = max(oldest or "0", "1.21", key=release)
        if layout:
            shared = save_with_table_external(model, path, layout, file=EMBEDDINGS_FILE)
            embedding = {**shared, "scale": embedding["scale"]}
        elif shared_name:  # the table's bytes (fp32, or fp16 under fp16) stay shared with the host lookup
            shared = save_sharing_embedding(model, path, shared_name)
            embedding = {**shared, "scale": embedding["scale"]}
        else:
            drop_stale_data(model, path)
            onnx.save_model(model, str(path))
        if streamed:
            stream.compact(path)  # drop the float tables' bytes the quantized ones replaced
        graphs[name] = dataclasses.replace(graph_file(folder, path), recipe=recipe.name)
        if plan is not None or drafted:
            detail[name] = {"recipe": recipe.name, **({"tables": drafted} if drafted else {})}
        if plan is not None:
            detail[name].update(tensors=dict(sorted(tensors.items())), calibration=dict(plan.calibration) or None)
    nodes = {name: node_count(folder / g.file) for name, g in graphs.items()}
    options = dataclasses.replace(options, embedding=embedding, nodes=nodes, min_onnxruntime=oldest,
                                  lookup_tables=lookup or None, quantization=detail or None)
    return dataclasses.replace(backend, graphs=graphs, options=options)


def _quantize_tables(model: onnx.ModelProto, graph: str, recipe: Recipe, shared_name: str | None,
                     plan: int4.Int4Plan | None, ple_bits: int, block_size: int, **how: Any) -> tuple:
    """The graph's float tables, each as encodings.encoding_for decides (the decision the size plan reads) and
    quantized by embedding.py (`how`: its accuracy_level and where large tables go): the target's tied table at
    table_bits (int4's plan may raise it), its per-layer-embedding table at ple_bits under the int recipes, the
    drafter's lookup table (a centroid head's) at draft_table_bits. Returns (model, the tied table's layout or
    None, PLE table -> storage, drafter table -> storage)."""
    choose = encoding_for(recipe, graph, block_size, ple_bits, plan)
    layout, ple, drafted = None, {}, {}
    if shared_name and (enc := choose(shared_name, _dims(model, shared_name), {MATMUL, LOOKUP})).kind == "nbits":
        model, layout = quantize_shared_table(model, shared_name, bits=enc.bits, block_size=enc.block,
                                              encoded=_lattice_rows(plan, shared_name, enc), **how)
    for table in _lookup_tables(model, exclude=shared_name):
        if (enc := choose(table, _dims(model, table), {LOOKUP})).kind == "nbits":
            model, _ = quantize_shared_table(model, table, bits=enc.bits, block_size=enc.block,
                                             half_scales=enc.scale_bytes == 2,
                                             encoded=_lattice_rows(plan, table, enc), **how)
            if graph == "drafter":
                drafted[table] = enc.label
            else:
                ple[table] = f"int{enc.bits}"
    return model, layout, ple, drafted


def _lattice_rows(plan: int4.Int4Plan | None, table: str, enc) -> tuple | None:
    """A table's own codes and scales from a pre-quantized checkpoint (--quant checkpoint), laid out as enc."""
    from ...lattice import pack

    weight = plan.lattice.weight(table) if plan is not None and plan.lattice is not None else None
    return None if weight is None else pack.nbits(weight, enc.bits, enc.block)


# fp16 keeps these in fp32: x^2 in Gemma's RMSNorm overflows fp16 once |x| > 256, and the soft-cap / softmax
# need the range (the residual stream between them stays fp16). The fused norms and attention (fusions.py)
# are those same computations; RotaryEmbedding runs between them, so it stays fp32 rather than cast twice.
_FP32_OPS = ("Pow", "ReduceMean", "Sqrt", "Reciprocal", "Softmax", "Tanh", "Div", "SimplifiedLayerNormalization",
             "SkipSimplifiedLayerNormalization", "MultiHeadAttention", "RotaryEmbedding")


def _weights_quantized(path: Path, recipe: Recipe, block_size: int, accuracy_level: int, skip: str | None,
                       plan=None) -> tuple:
    """The graph at path with its weight MatMuls quantized, loaded without external data where that data stays on
    disk: int8 / int4 are packed tensor by tensor from the memory-mapped float data (stream.py, the same bytes
    as ORT's MatMulNBitsQuantizer), so the float graph is never loaded whole; fp16 and int8-dynamic go through
    ONNX Runtime's whole-graph tools. `skip`: the shared table, quantized once after this. int4 / int4-rtn:
    export/int4.py's plan picks each weight's bits and int4 searches the scales. Returns (the model, weight name
    -> its encoding, for the streamed recipes)."""
    import onnx

    if recipe.onnx == "streamed":
        tensors = stream.quantize_matmuls(path, recipe.bits, block_size, accuracy_level, skip={skip} - {None},
                                          plan=plan)
        return onnx.load(str(path), load_external_data=False), tensors
    if recipe.onnx == "dynamic":
        log.warning("%s quantizes activations with one scale per call: speculative output can differ from --no-mtp "
                    "output where two logits nearly tie (docs/scale-bench.md)", recipe.name)
        return _dynamic_int8(path), {}
    return _fp16(onnx.load(str(path))), {}


def _dynamic_int8(path: Path):
    """ONNX Runtime's quantize_dynamic on the graph file: per-channel int8 weights for every MatMul whose B is a
    constant, activations quantized per tensor at run time (MatMulInteger, fused by ORT into DynamicQuantizeMatMul).
    Given the file rather than a loaded copy, because quantize_dynamic loads (and shape-infers) its own."""
    import onnx

    with root_logging_kept():  # see _quantized
        from onnxruntime.quantization import QuantType, quantize_dynamic
    # it logs a pre-processing advice to the root logger on every call, which this graph does not need
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".int8-dynamic.") as tmp, root_logging_kept(), \
            logger_level("", logging.ERROR):
        out = Path(tmp) / path.name
        quantize_dynamic(path, out, per_channel=True, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                         use_external_data_format=True)
        return onnx.load(str(out))


def ort_matmul_nbits(model, bits: int, block_size: int, accuracy_level: int):
    """ONNX Runtime's own MatMulNBitsQuantizer on a loaded graph: the reference the streamed packing (stream.py)
    writes the same bytes as (tests/test_export_stream.py), and tools/nbits_rows.py's kernel timings."""
    with root_logging_kept():  # ORT's quantization modules call logging.basicConfig(INFO) when imported
        from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level,
                                          bits=bits, op_types_to_quantize=("MatMul",))
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    return quantizer.model.model


def _fp16(model):
    """ONNX Runtime's float16 converter, the ops in _FP32_OPS kept in fp32."""
    with root_logging_kept():  # ORT's quantization modules call logging.basicConfig(INFO) when imported
        from onnxruntime.transformers import float16
    block = list(float16.DEFAULT_OP_BLOCK_LIST) + list(_FP32_OPS)
    return float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=block)


def _lookup_tables(model, exclude: str | None = None) -> list[str]:
    """2-D float initializers read only by Gather (the per-layer-embedding table, the drafter's centroid rows), other
    than `exclude`; encoding_for says which are quantized."""
    import onnx

    floats = {t.name for t in model.graph.initializer
              if len(t.dims) == 2 and t.data_type == onnx.TensorProto.FLOAT and t.name != exclude}
    readers: dict[str, set] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in floats:
                readers.setdefault(name, set()).add((node.op_type, i))
    return sorted(name for name, uses in readers.items() if uses == {("Gather", 0)})


def _dims(model, name: str) -> tuple[int, ...]:
    return tuple(next(t.dims for t in model.graph.initializer if t.name == name))


def _external_initializer(path: Path, location: str) -> str | None:
    """The initializer stored in the external file `location` (the shared embedding table), if any."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((t.name for t in model.graph.initializer if any(
        e.key == "location" and e.value == location for e in t.external_data)), None)


def save_sharing_embedding(model, graph_path: Path, initializer: str) -> dict:
    """Save `model` to graph_path with the named initializer as external data in EMBEDDINGS_FILE, whatever its
    dtype (fp32, or fp16 after conversion), so the host's drafter-embedding lookup reads the same bytes."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    folder = graph_path.parent
    tensor = next(t for t in model.graph.initializer if t.name == initializer)
    where = {e.key: e.value for e in tensor.external_data}
    if tensor.data_location == onnx.TensorProto.EXTERNAL and where.get("location") == EMBEDDINGS_FILE:
        # a streamed graph whose table stays float (a checkpoint that keeps it float): already there, shared
        drop_stale_data(model, graph_path)
        onnx.save_model(model, str(graph_path))
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).name
        return {"file": EMBEDDINGS_FILE, "offset": int(where.get("offset", 0)), "shape": list(tensor.dims),
                "dtype": dtype, "initializer": initializer}
    table = numpy_helper.to_array(tensor)
    raw = np.ascontiguousarray(table).tobytes()
    (folder / EMBEDDINGS_FILE).write_bytes(raw)
    set_external_data(tensor, location=EMBEDDINGS_FILE, offset=0, length=len(raw))
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    big = sum(t.ByteSize() for t in model.graph.initializer) > _TWO_GB
    drop_stale_data(model, graph_path)  # rewritten below when still needed
    onnx.save_model(model, str(graph_path), save_as_external_data=big, all_tensors_to_one_file=True,
                    location=graph_path.name + ".data", size_threshold=1024)
    return {"file": EMBEDDINGS_FILE, "offset": 0, "shape": list(table.shape), "dtype": table.dtype.name,
            "initializer": initializer}
