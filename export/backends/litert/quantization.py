"""LiteRT quantization: each float .tflite re-grafted with quantized weights (graft.py), streamed from its
own memory map, then the .litertlm bundle rebuilt from the results (bundle.py). `quantize` is the backend's entry
point (export/backends/litert/__init__.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mtpkit.runtime.manifest import Backend, GraphFile, LiteRtOptions, Signature, TensorSpec, sha256_file

from ... import int4
from ...recipes import FP32, KEPT_8BIT, Recipe
from ...recipes import recipe as recipe_named
from .bundle import BUNDLE_SECTIONS, rebuild_bundle

# ---- quantization: each float .tflite re-grafted, then the bundle's sections swapped for the results ----


def quantize(folder: Path, backend: Backend, recipes: dict[str, str], block_size: int = 32,
             accuracy_level: int = 4, ple_bits: int = 8, plans: dict | None = None) -> Backend:
    """Rewrite the float .tflite files in folder in place with quantized weights, a recipe per side
    ({"target": "int4", "drafter": "int8"}; "target" covers target, embedder and per_layer_embedder), and rebuild
    model.litertlm with the same bytes in its sections. Derived from a float export, so one export serves every
    recipe. The KV cache and every signature's inputs/outputs stay float (weights-only recipes).

    The layouts are ai-edge-quantizer's (the same int8 bytes as its dynamic_wi8_afp32), written by mtpkit so that
    no pass holds the whole flatbuffer (ai-edge-quantizer's holds 3x the float model, docs/export-memory.md):
    fp16: the FULLY_CONNECTED / EMBEDDING_LOOKUP weights in float16, each read through a DEQUANTIZE;
    int8: int8 channelwise weights, float activations quantized by the kernel at run time;
    int4 / int4-rtn: int4 blockwise weights with float16 scales for FULLY_CONNECTED and EMBEDDING_LOOKUP, the ops
        holding the weights here (as LiteRT-LM's gemma4_mixed48_b32 does), the block picked per tensor where a
        width is not a multiple of it (encoding_for); under int4 the scales are searched and the side's plan
        (`plans`: "target" / "drafter" -> export/int4.Int4Plan) keeps its sensitive tensors at int8; as in
        gemma4_mixed48 the per-layer-embedding path keeps 8 bits (the per_layer_embedder table and the target's per_layer
        projections): a 4-bit PLE table is where Gemma 4 broke elsewhere. per_layer_embedder is recorded as int8.
        ple_bits=4 (`--ple-quant int4`, only when asked) gives the PLE path 4 bits too.
    int8-dynamic: int8 (its `litert_as`), so stored as int8 in the graphs, the bundle and its section recipes.
    Under every int recipe the drafter's centroid-head table (its EMBEDDING_LOOKUP's) is int4 blockwise: the
    recipe's draft_table_bits.
    accuracy_level is ONNX Runtime's (MatMulNBits) and has no LiteRT counterpart; it is accepted and ignored.
    """
    folder = Path(folder)
    recipes = {side: stored_recipe(r) for side, r in recipes.items()}
    for recipe in recipes.values():
        if recipe.quantized and recipe.litert is None:
            raise ValueError(f"the {recipe.name} recipe has no LiteRT encoding (export/recipes.py `litert`)")
    graphs, options = dict(backend.graphs), backend.options
    assert isinstance(options, LiteRtOptions)  # this module's own entry
    detail = dict(options.quantization or {})
    changed = False
    for name in BUNDLE_SECTIONS:
        recipe = recipes.get("drafter" if name == "drafter" else "target", FP32)
        if name not in graphs or not recipe.quantized or recipe_named(graphs[name].recipe).quantized:
            continue  # float requested, or already quantized
        path = folder / graphs[name].file
        plan = (plans or {}).get("drafter" if name == "drafter" else "target")
        int4.require_plan(recipe, plan, name)
        stored, how = _quantize_tflite(path, name, recipe, block_size, ple_bits, plan)
        graphs[name] = dataclasses.replace(_graph_file(folder, graphs[name].file), recipe=stored)
        detail[name] = {"recipe": stored, **how}
        changed = True
    if not changed:
        return backend
    bundle = graphs["bundle"].file
    layout = rebuild_bundle(folder / bundle, {BUNDLE_SECTIONS[n]: folder / graphs[n].file
                                              for n in BUNDLE_SECTIONS if n in graphs})
    graphs["bundle"] = dataclasses.replace(_graph_file(folder, bundle), recipe=graphs["target"].recipe)
    bundled = {**options.bundle, "shared": layout.shared, "section_recipes": {
        section: graphs[name].recipe for name, section in BUNDLE_SECTIONS.items() if section in layout.sections}}
    options = dataclasses.replace(options, bundle=bundled, quantization=detail)
    return dataclasses.replace(backend, graphs=graphs, signatures=redescribe(folder, graphs, backend.signatures),
                               options=options)


def _graph_file(folder: Path, name: str) -> GraphFile:
    path = folder / name
    return GraphFile(file=name, sha256=sha256_file(path), bytes=path.stat().st_size, backend="litert")


def _quantize_tflite(path: Path, name: str, recipe: Recipe, block_size: int, ple_bits: int = 8,
                     plan=None) -> tuple[str, dict]:
    """Re-graft one float .tflite in place with its weights encoded by `recipe`, read from its own memory map a
    block of rows at a time (graft.py); returns (the recipe it now carries, encodings by count, and by name for
    the lookup tables and, under an int4 plan, every weight)."""
    from ai_edge_litert import schema_py_generated as schema

    from . import static_int8
    from .graft import Encoding, graft, read_map
    from .sources import GraftedSource

    recipe = graph_recipe(recipe, name, ple_bits)
    model = schema.ModelT.InitFromPackedBuf(read_map(path), 0)  # the flatbuffer only: weights follow it
    choose, tables = encoding_for(recipe, name, block_size, ple_bits, plan), []

    def noted(weight: str, shape: tuple, uses: set) -> Encoding:  # the lookup tables, named in the manifest with their storage
        if uses and uses <= {LOOKUP, ("GATHER_ND", 0)}:  # EMBEDDING_LOOKUP, or a packed table's GATHER (tables.py)
            tables.append(weight)
        return choose(weight, shape, uses)

    static: list[int] = []
    activations = plan.lattice.activations if plan is not None and plan.lattice is not None else {}
    rewrite = (lambda m, placed: static.append(static_int8.apply(m, placed, activations))) if activations else None
    done = graft(path, path, GraftedSource(path, model), noted, rewrite=rewrite)
    counts: dict[str, int] = {}
    for encoding in done.values():
        counts[encoding] = counts.get(encoding, 0) + 1
    if recipe.int4 and not any(e.startswith("int4") for e in counts):
        recipe = KEPT_8BIT  # every weight kept 8 bits (the embedder's table under int4): recorded as what it is
    how = {"weights": dict(sorted(counts.items())), "block_size": block_size}
    if any(static):  # layers computed with int8 activations at the checkpoint's static scales
        how["static_int8"] = sum(static)
    if tables:
        how["tables"] = {k.removeprefix("w:"): done[k] for k in sorted(tables)}
    if plan is not None and (recipe.int4 or recipe.lattice):
        how.update(tensors={k.removeprefix("w:"): v for k, v in sorted(done.items())},
                   calibration=dict(plan.calibration) or None)
    return recipe.name, how


def stored_recipe(recipe: Recipe) -> Recipe:
    """The recipe whose bytes LiteRT stores for `recipe` (its `litert_as`: int8-dynamic is stored as int8)."""
    return recipe_named(recipe.litert_as) if recipe.litert_as else recipe


def graph_recipe(recipe: Recipe, graph: str, ple_bits: int) -> Recipe:
    """The recipe a graph is quantized with: under int4 the per_layer_embedder keeps 8 bits unless ple_bits is 4
    (see quantize's docstring)."""
    return KEPT_8BIT if recipe.int4 and graph == "per_layer_embedder" and ple_bits == 8 else recipe


LOOKUP = ("EMBEDDING_LOOKUP", 1)  # a table's use: (op, input) of the ids' rows
WEIGHT_OPS_FC = ("FULLY_CONNECTED", 1)
WEIGHT_OPS = {WEIGHT_OPS_FC, LOOKUP}  # (op, input) pairs that read a weight
LATTICE_OPS = WEIGHT_OPS | {("GATHER_ND", 0)}  # and a checkpoint's packed table (tables.py)

# The (op, input) that reads a weight in the LiteRT graphs for each use a model adapter declares (export/models
# stored_in): the size plan asks encoding_for about a weight it has not converted yet through these
OPS = {"matmul": ("FULLY_CONNECTED", 1), "lookup": ("EMBEDDING_LOOKUP", 1), "gather": ("GATHER_ND", 0),
       "other": ("MUL", 1)}


def encoding_for(recipe: Recipe, graph: str, block_size: int, ple_bits: int, plan=None):
    """The encoding of each weight under `recipe`: only FULLY_CONNECTED weights and EMBEDDING_LOOKUP tables are
    quantized (dynamic range: int8 channelwise, int4 blockwise with float16 scales, or float16 through a
    DEQUANTIZE); norms, scalars and the rest stay float32. int4 keeps the per-layer-embedding path at 8 bits
    (the target's per_layer projections; as LiteRT-LM's gemma4_mixed48) unless ple_bits is 4, and a weight whose
    width no block of 128/64/32 (up to block_size) divides gets int8 channelwise. The drafter's lookup table (its
    centroid head's) takes the recipe's draft_table_bits (None: float32). `plan` (int4 / int4-rtn): the weights it
    keeps at 8 bits, each weight's calibration importance for the scale search, and what --max-size lowered to 2
    bits: FULLY_CONNECTED weights only, one float32 scale per row (XNNPACK runs no 2-bit blocks). A channelwise
    recipe (mobile) gives every 4-bit weight and table one scale per row (channel_block)."""
    from .graft import Encoding, channel_block, int4_block, lattice_encoding

    def choose(name: str, shape: tuple, uses: set) -> Encoding:
        if plan is not None and plan.lattice is not None and len(shape) == 2 and uses and uses <= LATTICE_OPS:
            return lattice_encoding(plan.lattice.weight(name), shape, uses, LOOKUP)
        if len(shape) != 2 or not uses or not uses <= WEIGHT_OPS or not recipe.quantized:
            return Encoding("float32")
        if recipe.litert == "fp16":
            return Encoding("float16")
        bits = 8 if recipe.litert == "int8" else 4
        if graph == "drafter" and uses == {LOOKUP}:  # the centroid head's table: bits of its own
            if not recipe.draft_table_bits:
                return Encoding("float32")
            bits = recipe.draft_table_bits
        if graph == "target" and "per_layer" in name and ple_bits == 8 or plan is not None and plan.bits(name) == 8:
            bits = 8
        searched = plan is not None and plan.searched
        if plan is not None and plan.bits(name) == 2 and uses == {WEIGHT_OPS_FC} and shape[1] % 4 == 0:
            return Encoding("int2", searched=True, importance=plan.importance_of(name))  # per channel only
        block = channel_block(shape[1]) if recipe.channelwise else int4_block(shape[1], block_size)
        if bits == 8 or not block:
            return Encoding("int8")
        return Encoding("int4", block, searched=searched, importance=plan.importance_of(name) if searched else None)

    return choose


def redescribe(folder: Path, graphs: dict[str, GraphFile], signatures: dict[str, Signature]) -> dict[str, Signature]:
    """Signatures with shapes / dtypes read back from the rewritten files (roles, layers and names kept): the
    runtime binds by role, so a dtype change must reach the manifest. A renamed or missing tensor is an error."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    NO_DELEGATES = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES  # signatures only: XNNPACK would pack weights

    interpreters, out = {}, {}
    for key, sig in signatures.items():
        graph = graphs[sig.graph]
        if graph.file not in interpreters:
            interpreters[graph.file] = Interpreter(model_path=str(folder / graph.file),
                                                   experimental_op_resolver_type=NO_DELEGATES)
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


