"""ONNX backend: torch.export (dynamo) of the step modules, then the embedding table moved to a shared file.

One dynamic-T target graph serves prefill, decode and verify (window KV I/O: past window in, the T new entries
out, named new.{i}.key/value so they cannot be mistaken for optimum's past+new `present.*`); the drafter graph
serves draft.

The target graph's tied embedding/lm_head table is written once, as ONNX external data in `embeddings.bin`;
the runtime memory-maps the same file to look up the drafter's token embeddings, so the 262k-row table is
stored once. The other weights are external data in `<graph>.onnx.data`, written tensor by tensor from the
loaded model without an fp32 copy of it (onnx_stream.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import tempfile
import warnings
from pathlib import Path
from typing import Callable, ContextManager

import numpy as np
import torch

from mtpkit.runtime.backends.onnx import release
from mtpkit.runtime.manifest import (Backend, GraphFile, KVLayer, Manifest, OnnxOptions, Signature, TensorSpec,
                                     sha256_file)

from .. import int4
from ..phases import MB
from ..scoped import logger_level, root_logging_kept
from . import ExportJob, ExportMemory, onnx_fusions, onnx_stream
from .onnx_embedding import drop_stale_data, quantize_shared_table, save_with_table_external

log = logging.getLogger(__name__)
EMBEDDINGS_FILE = "embeddings.bin"
OPSET = 20
_TWO_GB = 2**31 - 2**26  # protobuf's hard limit, with headroom for the graph itself
_REGISTRATION_LOGGER = "torch.onnx._internal.exporter._registration"
INT_RECIPES = ("int8", "int4", "int4-rtn", "int8-dynamic")  # the PLE table follows --ple-quant under these
# Bits of the tied embedding / lm_head table (quantize_shared_table) per recipe; a recipe not listed keeps it float.
# int4's plan may keep it at 8 (export/int4.py).
TABLE_BITS = {"int8": 8, "int4": 4, "int4-rtn": 4, "int8-dynamic": 8}
PAST = "past_window.{layer}.{kind}"
NEW = "new.{layer}.{kind}"
STREAMED = frozenset({"fp32", "int8", "int4", "int4-rtn"})  # quantized tensor by tensor; fp16 and int8-dynamic load the whole graph
# what writes this backend's files or the figures in its entry (the acceptance runs on ONNX Runtime), recorded with
# their versions in manifest.json's `export` entry (export/reproduce.py)
PACKAGES = ("onnx", "onnxscript", "onnx-ir", "onnxruntime", "protobuf")


def _quantize_growth(recipes: set) -> float:
    """The quantize phase's growth in W for `recipes` (e2b-wide peaks in MiB, docs/export-memory.md): 1.0 when every
    recipe is packed tensor by tensor from the float graph's mapped data (onnx_stream.py) beside the unpacked float
    sessions (int4: 1787); 1.8 when one loads the float graph whole and quantizes beside it (int4 so: 2321); 1.1 W
    more for int8-dynamic, whose quantize_dynamic reads its own shape-inferred copy of the float graph (3010)."""
    growth = 1.0 if recipes <= STREAMED else 1.8
    return max(growth, 1.8 + 1.1) if "int8-dynamic" in recipes else growth


# The memory preflight's figures (export/preflight.py; docs/export-memory.md). Anonymous memory per phase: fixed
# MiB + growth x W (session phases: W less the mapped PLE table), beyond a held copy converted from the stored dtype
# and, while quantizing, the quantized weights; fitted through e2b-wide (W = 580 MiB) and the full-size E2B
# (W = 17954 MiB), both int4 and held as stored, plus 20% (docs/export-memory.md, "Resident and anonymous").
MEMORY = ExportMemory(
    base=600 * MB,  # the interpreter, torch, transformers, onnx, onnxruntime (tiny e2b's largest phase: 581 MB)
    graphs=0.15,  # streamed (onnx_stream.py): the IR, one tensor in flight (e2b-wide fp32 held 1159, bf16 held 971)
    quantize=_quantize_growth,
    anonymous={"load": (330, 0.021), "onnx graphs": (600, 0.028), "reference": (420, 0.173), "check": (235, 0.52),
               "quantize": (450, 0.28), "acceptance": (410, 0.51)},
    anonymous_recipes=STREAMED)


def export(job: ExportJob) -> Backend:
    """target.onnx + drafter.onnx + embeddings.bin into job.folder; their manifest entry."""
    sigs = signatures(job.kv_layers, job.store, job.hidden, job.vocab)
    t_path, d_path = job.folder / "target.onnx", job.folder / "drafter.onnx"
    fuse = job.cfg.fuse
    embed = job.target.model.embed_tokens
    embedding = export_graph(job.target_adapter.TargetStep(job.target), sigs["verify"], _target_sample(job.kv_layers),
                             t_path, fused=functools.partial(job.target_adapter.fused_ops, job.target) if fuse else None,
                             table=embed.weight)
    export_graph(job.drafter_adapter.DraftStep(job.drafter), sigs["draft"], _draft_sample(job, job.hidden), d_path,
                 fused=functools.partial(job.drafter_adapter.fused_ops, job.drafter) if fuse else None)
    if embedding is None:
        raise RuntimeError(f"the embedding table is not an initializer of {t_path.name}")
    embedding["scale"] = float(embed.embed_scale.float())  # the graphs' fp32 scale, whatever --dtype holds
    graphs = {name: _graph_file(job.folder, p) for name, p in (("target", t_path), ("drafter", d_path))}
    # fused: the contrib kernels' oldest ORT with MultiHeadAttention's grouped mask (onnx_fusions.py)
    options = OnnxOptions(embedding=embedding, nodes=_log_nodes(job, graphs), min_onnxruntime="1.20" if fuse else None)
    return Backend("onnx", "window", graphs, sigs, options)


def check(manifest: Manifest, job: ExportJob, ids: list[int]) -> list:
    """The float graphs against PyTorch, session by session (export/verify.py)."""
    from ..verify import check_onnx

    return check_onnx(manifest, job.target, job.drafter, ids)


def _log_nodes(job: ExportJob, graphs: dict[str, GraphFile]) -> dict[str, int]:
    """Node count per graph, logged and returned for the manifest: what op fusion (onnx_fusions.py) shrinks."""
    layers = {"target": job.target.config.num_hidden_layers,
              "drafter": job.drafter.config.get_text_config().num_hidden_layers}
    nodes = {name: _node_count(job.folder / g.file) for name, g in graphs.items()}
    for name, count in nodes.items():
        log.info("  %s: %d nodes, %.1f per decoder layer", graphs[name].file, count, count / layers[name])
    return nodes


def quantize(folder: Path, backend: Backend, recipes: dict[str, str], block_size: int = 32,
             accuracy_level: int = 4, ple_bits: int = 8, plans: dict | None = None) -> Backend:
    """Rewrite float graphs in folder in place with a recipe per graph ({"target": "int4", "drafter": "int8"}):
    weight-only int8 / int4 MatMulNBits, int8-dynamic (ORT's quantize_dynamic), or fp16 with the norms kept in
    fp32. The tied embedding / lm_head table is quantized once at TABLE_BITS (MatMulNBits + GatherBlockQuantized
    over the same bytes, see onnx_embedding.py) and stays stored once in embeddings.bin, where the host's drafter
    lookup reads it too. Derived from a float export, so one export serves every recipe. `plans` ("target" /
    "drafter" -> export/int4.Int4Plan, int4 recipes): the weights kept at 8 bits and the scale search's importance;
    the choice per weight is recorded in options.quantization."""
    import onnx

    graphs, options = dict(backend.graphs), backend.options
    assert isinstance(options, OnnxOptions)  # this module's own entry
    embedding, lookup, oldest, detail = options.embedding, dict(options.lookup_tables or {}), options.min_onnxruntime, \
        dict(options.quantization or {})
    for name, recipe in recipes.items():
        if recipe == "fp32" or graphs[name].recipe != "fp32":
            continue
        path = folder / graphs[name].file
        shared_name = _external_initializer(path, EMBEDDINGS_FILE)
        plan = (plans or {}).get(name)
        int4.require_plan(recipe, plan, name)
        model, tensors = _weights_quantized(path, recipe, block_size, accuracy_level, skip=shared_name, plan=plan)
        streamed = recipe in onnx_stream.STREAMED  # its weights stay in <graph>.onnx.data: tables go there too
        tables = dict(base_dir=str(folder), data_file=path.name + ".data" if streamed else None)
        layout = None
        if shared_name and recipe in TABLE_BITS:  # the tied table quantized once: lm_head, lookup and host
            bits = plan.bits(shared_name) if plan else TABLE_BITS[recipe]
            model, layout = quantize_shared_table(model, shared_name, bits=bits, block_size=block_size,
                                                  accuracy_level=accuracy_level, **tables)
            tensors[shared_name] = f"int{bits}/b{block_size}"
        if shared_name and recipe in INT_RECIPES:
            for table in _lookup_tables(model, exclude=shared_name):  # the PLE table: 8 bits unless asked for 4
                model, _ = quantize_shared_table(model, table, bits=ple_bits, block_size=block_size,
                                                 accuracy_level=accuracy_level, **tables)
                lookup[table] = f"int{ple_bits}"
        if layout or lookup:  # GatherBlockQuantized's `bits` attribute (onnx_embedding.py)
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
            onnx_stream.compact(path)  # drop the float tables' bytes the quantized ones replaced
        graphs[name] = dataclasses.replace(_graph_file(folder, path), recipe=recipe)
        if plan is not None:
            detail[name] = {"recipe": recipe, "tensors": dict(sorted(tensors.items())),
                            "calibration": dict(plan.calibration) or None}
    nodes = {name: _node_count(folder / g.file) for name, g in graphs.items()}
    options = dataclasses.replace(options, embedding=embedding, nodes=nodes, min_onnxruntime=oldest,
                                  lookup_tables=lookup or None, quantization=detail or None)
    return dataclasses.replace(backend, graphs=graphs, options=options)


# fp16 keeps these in fp32: x^2 in Gemma's RMSNorm overflows fp16 once |x| > 256, and the soft-cap / softmax
# need the range (the residual stream between them stays fp16). The fused norms and attention (onnx_fusions.py)
# are those same computations; RotaryEmbedding runs between them, so it stays fp32 rather than cast twice.
_FP32_OPS = ("Pow", "ReduceMean", "Sqrt", "Reciprocal", "Softmax", "Tanh", "Div", "SimplifiedLayerNormalization",
             "SkipSimplifiedLayerNormalization", "MultiHeadAttention", "RotaryEmbedding")


def _weights_quantized(path: Path, recipe: str, block_size: int, accuracy_level: int, skip: str | None,
                       plan=None) -> tuple:
    """The graph at path with its weight MatMuls quantized, loaded without external data where that data stays on
    disk: int8 / int4 are packed tensor by tensor from the memory-mapped float data (onnx_stream.py, the same bytes
    as ORT's MatMulNBitsQuantizer), so the float graph is never loaded whole; fp16 and int8-dynamic go through
    ONNX Runtime's whole-graph tools. `skip`: the shared table, quantized once after this. int4 / int4-rtn:
    export/int4.py's plan picks each weight's bits and int4 searches the scales. Returns (the model, weight name
    -> its encoding, for the streamed recipes)."""
    import onnx

    if recipe in onnx_stream.STREAMED:
        tensors = onnx_stream.quantize_matmuls(path, 8 if recipe == "int8" else 4, block_size, accuracy_level,
                                               skip={skip} - {None}, plan=plan)
        return onnx.load(str(path), load_external_data=False), tensors
    if recipe == "int8-dynamic":
        log.warning("int8-dynamic quantizes activations with one scale per call: speculative output can differ "
                    "from --no-mtp output where two logits nearly tie (docs/scale-bench.md)")
        return _dynamic_int8(path), {}
    return _quantized(onnx.load(str(path)), recipe, block_size, accuracy_level), {}


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


def _quantized(model, recipe: str, block_size: int, accuracy_level: int):
    with root_logging_kept():  # ORT's quantization modules call logging.basicConfig(INFO) when imported
        from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
        from onnxruntime.transformers import float16
    if recipe == "fp16":
        block = list(float16.DEFAULT_OP_BLOCK_LIST) + list(_FP32_OPS)
        return float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=block)
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level,
                                          bits=4 if recipe == "int4" else 8, op_types_to_quantize=("MatMul",))
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    return quantizer.model.model


def _lookup_tables(model, exclude: str) -> list[str]:
    """2-D float initializers read only by Gather (the per-layer-embedding table), other than `exclude`.

    A 4-bit PLE table produced garbage in other Gemma 4 toolchains, so these keep 8 bits under every int recipe.
    """
    import onnx

    floats = {t.name for t in model.graph.initializer
              if len(t.dims) == 2 and t.data_type == onnx.TensorProto.FLOAT and t.name != exclude}
    readers: dict[str, set] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in floats:
                readers.setdefault(name, set()).add((node.op_type, i))
    return sorted(name for name, uses in readers.items() if uses == {("Gather", 0)})


def _external_initializer(path: Path, location: str) -> str | None:
    """The initializer stored in the external file `location` (the shared embedding table), if any."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return next((t.name for t in model.graph.initializer if any(
        e.key == "location" and e.value == location for e in t.external_data)), None)


def _node_count(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def signatures(kv_layers, store: dict[str, int], hidden: int, vocab: int) -> dict[str, Signature]:
    t_in, t_out = _target_io(kv_layers, hidden, vocab)
    d_in, d_out = _drafter_io({t: next(d for d in kv_layers if d.layer == i) for t, i in store.items()}, hidden, vocab)
    return {"prefill": Signature("target", t_in, t_out, None), "decode": Signature("target", t_in, t_out, 1),
            "verify": Signature("target", t_in, t_out, None), "draft": Signature("drafter", d_in, d_out, 1)}


def _target_io(kv_layers, hidden: int, vocab: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(input_ids [1,T], input_pos [1], past windows) -> logits, final-norm hidden states, new K/V."""
    inputs = [TensorSpec("input_ids", "input_ids", [1, "T"], "int64"),
              TensorSpec("input_pos", "input_pos", [1], "int64")]
    outputs = [TensorSpec("logits", "logits", [1, "T", vocab], "float32"),
               TensorSpec("hidden_states", "activations", [1, "T", hidden], "float32")]
    for d in kv_layers:
        past = "past_sliding" if d.type == "sliding_attention" else "past_full"
        for kind in ("key", "value"):
            inputs.append(TensorSpec(PAST.format(layer=d.layer, kind=kind), f"past_{kind}",
                                     [1, d.kv_heads, past, d.head_dim], "float32", d.layer))
            outputs.append(TensorSpec(NEW.format(layer=d.layer, kind=kind), f"new_{kind}",
                                      [1, d.kv_heads, "T", d.head_dim], "float32", d.layer))
    return inputs, outputs


def _drafter_io(store: dict[str, KVLayer], hidden: int, vocab: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Store-layer K/V are read-only inputs, tagged with the target layer and layer type they come from."""
    inputs = [TensorSpec("inputs_embeds", "inputs_embeds", [1, 1, hidden], "float32"),
              TensorSpec("activations", "activations", [1, 1, hidden], "float32"),
              TensorSpec("input_pos", "input_pos", [1], "int64")]
    for layer_type in ("full_attention", "sliding_attention"):  # DraftStep.forward's argument order
        d, short = store[layer_type], layer_type.split("_")[0]
        for kind in ("key", "value"):
            inputs.append(TensorSpec(f"{short}_{kind}", f"store_{kind}", [1, d.kv_heads, f"{short}_len", d.head_dim],
                                     "float32", d.layer, layer_type=layer_type))
    outputs = [TensorSpec("logits", "logits", [1, 1, vocab], "float32"),
               TensorSpec("projected_activations", "projected_activations", [1, 1, hidden], "float32")]
    return inputs, outputs


def _target_sample(kv_layers) -> tuple:
    t, p = 3, 5  # avoid 0/1 so torch.export keeps T and the past lengths dynamic
    past = [torch.randn(1, d.kv_heads, p, d.head_dim) for d in kv_layers for _ in (0, 1)]
    return (torch.randint(0, 8, (1, t)), torch.tensor([p]), *past)


def _draft_sample(job: ExportJob, hidden: int) -> tuple:
    full, sliding = job.kv_layer(job.store["full_attention"]), job.kv_layer(job.store["sliding_attention"])
    return (torch.randn(1, 1, hidden), torch.randn(1, 1, hidden), torch.tensor([6]),
            torch.randn(1, full.kv_heads, 6, full.head_dim), torch.randn(1, full.kv_heads, 6, full.head_dim),
            torch.randn(1, sliding.kv_heads, 5, sliding.head_dim),
            torch.randn(1, sliding.kv_heads, 5, sliding.head_dim))


def _graph_file(folder: Path, path: Path) -> GraphFile:
    data = {p.name: sha256_file(p) for p in data_files(path)}
    size = path.stat().st_size + sum((folder / n).stat().st_size for n in data)
    return GraphFile(file=path.name, sha256=sha256_file(path), bytes=size, backend="onnx", data_files=data)


def _names(specs) -> list[str]:
    return [t.name for t in specs]


def _dims(signature: Signature) -> tuple:
    """torch.export dynamic shapes built from the signature table's symbolic dims."""
    cache: dict[str, torch.export.Dim] = {}

    def dim(name: str) -> torch.export.Dim:
        if name not in cache:
            cache[name] = torch.export.Dim(name, min=1 if name == "T" else 0, max=1 << 20)
        return cache[name]

    specs = [{i: dim(s) for i, s in enumerate(t.shape) if isinstance(s, str)} or None for t in signature.inputs]
    return specs


def export_graph(step: torch.nn.Module, signature: Signature, sample: tuple, path: Path,
                 fused: Callable[[], ContextManager] | None = None, table: torch.Tensor | None = None) -> dict | None:
    """Export one step module with the signature's names and dynamic dims, streaming (onnx_stream.py): traced
    on fake fp32 weights, each weight converted to fp32 only as it is written to external data.

    Args:
        fused: makes the model adapter's fused_ops(model) patch; inside it the step calls export/fused_ops.py's
            custom ops, lowered here to fused ORT kernels (onnx_fusions.py). None exports the modules as they are.
        table: the tied embedding table (a parameter of step), written alone to EMBEDDINGS_FILE.

    Returns:
        the manifest's `embedding` entry (file, offset, shape, dtype, initializer) when table is given.
    """
    dims = _dims(signature)
    fixed = _n_positional(step)
    if len(dims) > fixed:  # *past varargs need a nested spec
        dims = [*dims[:fixed], tuple(dims[fixed:])]
    # torch.onnx logs one warning per missing torchvision op; irrelevant here (scoped: the caller's level returns)
    # fused_ops first: the regrouped attention weights it registers are faked and bound like the others
    with warnings.catch_warnings(), torch.no_grad(), logger_level(_REGISTRATION_LOGGER, logging.ERROR), \
            (fused() if fused else contextlib.nullcontext()), onnx_stream.fake_weights(step) as real:
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            step, sample, input_names=_names(signature.inputs), output_names=_names(signature.outputs),
            dynamic_shapes=tuple(dims), dynamo=True, optimize=False, opset_version=OPSET, verbose=False,
            custom_translation_table=onnx_fusions.translation_table() if fused else None,
        )
    onnx_stream.bind_lazy(program.model, real)
    onnx_stream.fold_weight_transposes(program.model, real)
    program.optimize()  # after the lazy folds: what is left to fold is small
    if fused:
        onnx_fusions.fuse_graph(program.model)
    return onnx_stream.save(program.model, path, onnx_stream.initializer_of(program.model, real, table),
                            EMBEDDINGS_FILE)


def _n_positional(step: torch.nn.Module) -> int:
    import inspect

    params = inspect.signature(step.forward).parameters.values()
    return sum(1 for p in params if p.kind == p.POSITIONAL_OR_KEYWORD)


def save_sharing_embedding(model, graph_path: Path, initializer: str) -> dict:
    """Save `model` to graph_path with the named initializer as external data in EMBEDDINGS_FILE, whatever its
    dtype (fp32, or fp16 after conversion), so the host's drafter-embedding lookup reads the same bytes."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    folder = graph_path.parent
    tensor = next(t for t in model.graph.initializer if t.name == initializer)
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


def data_files(graph_path: Path) -> list[Path]:
    """External data files a saved ONNX graph refers to."""
    import onnx

    model = onnx.load(str(graph_path), load_external_data=False)
    names = set()
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            names.update(e.value for e in t.external_data if e.key == "location")
    return [graph_path.parent / n for n in sorted(names)]
