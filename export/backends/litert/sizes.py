"""The bytes of the LiteRT files an export writes (the size plan, export/sizes.py), before any weight is read.

A grafted .tflite (graft.py) is its flatbuffer, 4096 bytes of slack, then every weight at a 64-byte aligned offset,
each encoded as quantize() would (encoding_for, through the op the model adapter says reads it). The flatbuffer
(ops, tensors, signatures) is modelled by the constants below: the flatbuffer's length (graft._pack) per decoder
layer and signature of the tiny float exports of tests/conftest.py (e2b_gemma4_centroid: 10 layers, cache 256;
e4b_text_dense_kv_eq: 12 layers, cache 512; the centroid head's selection from their drafters' difference); a
quantized weight adds to it at each place (a signature's subgraph) that reads it, measured on
e2b_gemma4_centroid's fp16 / int8 / int4 copies (quant_report.derive_quantized). The e4b copies, not fitted, land
within 0.6%. model.litertlm is litert-lm-builder's 16 KiB blocks: a header, the metadata (chat
template, one entry per KV cache), the tokenizer.json zlib-compressed, then the four .tflite files, a weight that
a later section stores with the same encoding left out of the earlier one (bundle.py: the tied table, stored once).
"""

from __future__ import annotations

import json
import zlib

from ...sizes import PlannedFile, SizeJob, tally
from .describe import draft_windows
from .graft import SLACK, Encoding, aligned
from .bundle import BUNDLE_SECTIONS
from .quantization import OPS, encoding_for, graph_recipe, stored_recipe

# flatbuffer bytes (measured, see the docstring): the target per decoder layer (its three signatures: prefill,
# decode, verify), the per-layer embedder fixed and per layer, the embedder fixed, the drafter per drafter layer and
# signature (draft + one draft_masked per cache window)
TARGET_PER_LAYER = 73926
# a static activation rounding's ops in prefill, decode and verify, with its QUANTIZE or DEQUANTIZE and int8 tensor
# (static_int8.py: 833 B of it) (tiny pair)
ROUNDING = 4155
PLE_FIXED, PLE_PER_LAYER = 6096, 2880
EMBEDDER_FIXED = 4224
DRAFTER_PER_LAYER_SIGNATURE = 16178
# per signature, the ops a centroid head selects its rows with (top-k, gather, scatter) around its index table
SELECT_PER_SIGNATURE = 2740
# flatbuffer bytes a quantized weight adds at each place that reads it, beyond Encoding.params_bytes: int4's
# scales tensor, float16's DEQUANTIZE op and its float32 output tensor, int8's vectors (see the docstring)
PLACE_BYTES = {"float32": 0, "float16": 140, "int8": 31, "int4": 150, "int2": 31, "int4c": 31, "uint8": 0,
               "packed": 0}  # int4c: per-row parameters, as int8 and int2
BLOCK = 16 << 10  # litert-lm-builder's section alignment (litertlm_core.BLOCK_SIZE)
METADATA_FIXED = 350  # LlmMetadata beyond its chat template (start / stop tokens, channels)
EXECUTOR_PER_CACHE = 66  # ExecutorMetadata: one entry per K and per V cache


def plan_files(job: SizeJob) -> list[PlannedFile]:
    """target.tflite, embedder.tflite, per_layer_embedder.tflite, drafter.tflite and model.litertlm."""
    graphs = [_graph(job, name) for name in BUNDLE_SECTIONS]
    return [*graphs, _bundle(job, graphs)]


def _chooser(job: SizeJob, graph: str):
    """(the graph's side, its encoding_for) under the job's recipes."""
    cfg = job.cfg
    side = "drafter" if graph == "drafter" else "target"
    recipe = graph_recipe(stored_recipe(cfg.recipes[side]), graph, cfg.ple_bits)
    return side, recipe, encoding_for(recipe, graph, cfg.block_size, cfg.ple_bits, job.plans.get(side))


def _stored_once(job: SizeJob) -> tuple[dict[str, int], list[str]]:
    """The bytes each graph's section leaves to the last later section storing the same weight with the same
    encoding (bundle.py keeps that one's copy), and those weights' names."""
    saved: dict[str, int] = {}
    names = []
    for side in ("target", "drafter"):
        for w in job.side(side):
            held = [g for g in BUNDLE_SECTIONS if g in w.stored] if w.index_bytes is None else []
            encs = {g: _chooser(job, g)[2](w.name, w.shape, {OPS[u] for u in w.stored[g]}) for g in held}
            for g in held[:-1]:
                if _label(encs[g]) == _label(encs[held[-1]]):
                    enc = encs[g]
                    saved[g] = saved.get(g, 0) + aligned(enc.data_bytes(w.shape)) + aligned(enc.scale_bytes(w.shape))
                    names.append(w.name)
    return saved, names


def _graph(job: SizeJob, graph: str) -> PlannedFile:
    side, recipe, choose = _chooser(job, graph)
    cfg = job.cfg
    places = _signatures(job, graph)
    head, parts = _structure(job, graph), []
    for w in (w for w in job.side(side) if graph in w.stored):
        uses = w.stored[graph]
        if w.index_bytes is not None:  # an index table: a constant inside the flatbuffer, and the ops using it
            head += w.index_bytes + SELECT_PER_SIGNATURE * places
            continue
        enc = choose(w.name, w.shape, {OPS[u] for u in uses})
        head += places * (enc.params_bytes(w.shape) + PLACE_BYTES[enc.kind])
        parts.append((uses, _label(enc), aligned(enc.data_bytes(w.shape)) + aligned(enc.scale_bytes(w.shape))))
    note = f"{places} signatures" + (f"; stored as {recipe.name}" if recipe is not cfg.recipes[side] else "")
    return tally(f"{graph}.tflite", side, parts, aligned(head + SLACK), note)


def _label(enc: Encoding) -> str:
    return f"int4/b{enc.block}" if enc.kind == "int4" else enc.kind


def _signatures(job: SizeJob, graph: str) -> int:
    """The signatures (subgraphs) of a graph, each a place reading every weight of it: the target's prefill,
    decode and verify; the embedders' decode and prefill; the drafter's draft and draft_masked per window."""
    return {"target": 3, "embedder": 2, "per_layer_embedder": 2,
            "drafter": 1 + len(draft_windows(job.cfg.max_cache_len))}[graph]


def _structure(job: SizeJob, graph: str) -> int:
    layers = job.target_config.num_hidden_layers
    if graph == "target":
        return TARGET_PER_LAYER * layers + ROUNDING * job.roundings
    if graph == "per_layer_embedder":
        return PLE_FIXED + PLE_PER_LAYER * layers
    if graph == "embedder":
        return EMBEDDER_FIXED
    drafter_layers = job.drafter_config.get_text_config().num_hidden_layers
    return DRAFTER_PER_LAYER_SIGNATURE * drafter_layers * _signatures(job, graph)


def _bundle(job: SizeJob, graphs: list[PlannedFile]) -> PlannedFile:
    """model.litertlm: each section at a 16 KiB boundary after a 16 KiB header; the last one unpadded."""
    caches = 2 * len(job.kv_layers)
    saved, shared = _stored_once(job)
    sections = [METADATA_FIXED + len(_chat_template(job).encode()), EXECUTOR_PER_CACHE * caches,
                8 + len(zlib.compress((job.target_folder / "tokenizer.json").read_bytes())),
                *(g.bytes - saved.get(name, 0) for name, g in zip(BUNDLE_SECTIONS, graphs))]
    size = BLOCK + sum(-(-n // BLOCK) * BLOCK for n in sections[:-1]) + sections[-1]
    once = f"; {', '.join(shared)} stored once" if shared else ""
    return PlannedFile("model.litertlm", size, None, note=f"the four .tflite files, metadata and the tokenizer, for "
                                                            f"LiteRT-LM{once}")


def _chat_template(job: SizeJob) -> str:
    """The chat template LiteRT-LM's metadata carries: chat_template.jinja, else tokenizer_config.json's."""
    jinja = job.target_folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = job.target_folder / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    return template if isinstance(template, str) else ""
