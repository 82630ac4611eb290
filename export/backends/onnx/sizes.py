"""The bytes of the ONNX files an export writes (the size plan, export/sizes.py), before any weight is read.

target.onnx and drafter.onnx hold their weights as external data (<graph>.onnx.data; under fp16 and int8-dynamic,
below 2 GB, inside the .onnx itself): each file is planned with its data, the weights encoded as quantize() would
(encodings.encoding_for), plus the graph's protobuf (nodes, names, small constants), modelled by the constants
below, measured on the tiny exports of tests/conftest.py. embeddings.bin is the tied table alone, as the target's
quantizer leaves it: float, or its packed blocks and scales.
"""

from __future__ import annotations

from ...sizes import PlannedFile, SizeJob, tally
from .encodings import MATMUL, Encoding, encoding_for
from .graphs import EMBEDDINGS_FILE

# protobuf bytes per decoder layer (node names and metadata, small constants): a file's bytes less its planned
# weights, per layer, by the encoding of the graph's MatMul weights (how the recipe rewrote the graph). Measured: the
# float target on e2b_gemma4_centroid (10 layers) and e4b_text_dense_kv_eq (12), the float drafter (4 layers) on the
# latter's dense head, the rewritten graphs on the former's fp16 / int8 / int4 / int8-dynamic copies
# (quant_report.derive_quantized); the latter's copies, not fitted, land within 0.4%. Re-saved through onnx_ir, a
# MatMulNBits graph keeps less of torch's node metadata.
ROUNDING = 3688  # a static activation rounding's nodes (Div, Round, Clip, Mul), measured on the tiny pair
PROTO_PER_LAYER = {"float32": {"target": 36086, "drafter": 23737}, "nbits": {"target": 31883, "drafter": 20529},
                   "float16": {"target": 39912, "drafter": 27123},
                   "int8-channel": {"target": 34186, "drafter": 22785}}
# the ops a centroid head selects its rows with (top-k, gather, scatter) around its index table, and the scatter's
# float32 row of the vocabulary it fills (e2b_gemma4_centroid's drafter less e4b_text_dense_kv_eq's)
SELECT_BYTES, SELECT_VOCAB_BYTES = 8571, 4


def plan_files(job: SizeJob) -> list[PlannedFile]:
    """target.onnx (with its .data), embeddings.bin and drafter.onnx (with its .data)."""
    return [_graph(job, "target"), _embeddings(job), _graph(job, "drafter")]


def _choose(job: SizeJob, side: str):
    cfg = job.cfg
    return encoding_for(cfg.recipes[side], side, cfg.block_size, cfg.ple_bits, job.plans.get(side))


def _graph(job: SizeJob, side: str) -> PlannedFile:
    choose, parts = _choose(job, side), []
    rewrite = choose("", (1, job.cfg.block_size), {MATMUL}).kind  # what the recipe makes of a MatMul weight
    structure = PROTO_PER_LAYER[rewrite][side] * _layers(job, side)
    structure += ROUNDING * job.roundings if side == "target" else 0
    for w in (w for w in job.side(side) if side in w.stored):
        uses = w.stored[side]
        if w.index_bytes is not None:  # an index table, and the ops selecting through it
            parts.append((uses, "int64", w.index_bytes))
            structure += SELECT_BYTES + SELECT_VOCAB_BYTES * job.target_config.vocab_size
            continue
        enc = choose(w.name, w.shape, uses)
        parts.append((uses, enc.label, enc.nbytes(w.shape)))
    return tally(f"{side}.onnx", side, parts, structure, f"with {side}.onnx.data")


def _embeddings(job: SizeJob) -> PlannedFile:
    """The tied table, stored once: the lm_head's MatMul and the lookups (the graph's and the host's) read it."""
    choose, parts = _choose(job, "target"), []
    for w in (w for w in job.side("target") if "embeddings" in w.stored):
        enc: Encoding = choose(w.name, w.shape, w.stored["embeddings"])
        parts.append((w.stored["embeddings"], enc.label, enc.nbytes(w.shape)))
    return tally(EMBEDDINGS_FILE, "target", parts, 0, "the tied table: lm_head and token lookup")


def _layers(job: SizeJob, side: str) -> int:
    config = job.target_config if side == "target" else job.drafter_config.get_text_config()
    return config.num_hidden_layers
