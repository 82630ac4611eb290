"""The role table: every tensor role a graph signature may carry, and every backend mtpkit knows.

Exporters name tensors however their format wants and tag each with one of these roles; runtimes bind by
(role, layer) and never by name. records.TensorSpec refuses a role missing here, so the table cannot drift
from what the graphs carry. A new backend adds its row to BACKENDS (with the record of its manifest options, and new
roles, if any), one export package export/backends/<kind>/ and one runtime module runtime/backends/<kind>.py;
everything else finds it through them (tests/test_third_backend.py registers one that way and runs it end to end).
"""

from __future__ import annotations

from dataclasses import dataclass

from .record import Record, field
from .schema import DICT, NUMBER, STR, fields, integer, items, mapping, optional, release

ROLES = {
    # target signatures (prefill / decode / verify)
    "input_ids": "token ids [1,T]",
    "input_pos": "absolute position of the first token ([1]) or of every token ([T])",
    "embeddings": "scaled token embeddings E[ids]*sqrt(H) [1,T,H] (external embedder output / target input)",
    "per_layer_embeddings": "per-layer-embedding (PLE) lookups [1,T,L,P] (external embedder output / target input)",
    "token_ids": "token ids of an embedder signature",
    "mask": "additive float attention mask; layer_type set when it applies to one layer type only",
    "logits": "soft-capped target logits [1,T,V] / raw drafter logits [1,1,V]",
    "activations": "final-norm hidden states [1,T,H]: what the drafter reads (target output, drafter input)",
    "past_key": "window input: the past K entries a call reads [1,h,P,d] (ONNX; full: all, sliding: last W-1)",
    "past_value": "window input: the past V entries a call reads [1,h,P,d]",
    "new_key": "window output: only the T new K entries [1,h,T,d], written by the host at input_pos",
    "new_value": "window output: only the T new V entries [1,h,T,d]",
    "kv_key": "state tensor: the layer's whole K cache, in and (updated) out; seq_axis says where positions run",
    "kv_value": "state tensor: the layer's whole V cache (LiteRT stores it transposed, seq_axis 3)",
    # drafter signatures (draft / draft_masked)
    "inputs_embeds": "the target's scaled embedding of the newest token [1,1,H]",
    "embeds_and_activations": "[inputs_embeds, activations] concatenated [1,1,2H] (LiteRT-LM's drafter input)",
    "store_key": "window input: a store layer's visible K entries [1,h,S,d] (ONNX), or the S cache slots a LiteRT "
                 "draft_masked signature reads of a store layer; layer and layer_type set",
    "store_value": "window input: a store layer's visible V entries [1,h,S,d] (LiteRT: transposed, seq_axis 3)",
    "projected_activations": "the drafter's activations for its next step [1,1,H]",
    "selected_logits": "a centroid drafter head's logits of the tokens it selected [1,1,N] (every other token: min - 1)",
    "selected_ids": "the token ids of selected_logits [1,1,N] int32",
}


@dataclass(frozen=True, kw_only=True)
class Options(Record):
    """What every backend's options carry, written after the kind's own fields: how each quantized graph stores its
    weights, and the drafter's acceptance on its graphs (auto's prior)."""

    quantization: dict | None = field(optional(DICT), default=None, omit=True)
    acceptance_by_position: list[float] | None = field(optional(items(NUMBER)), default=None, omit=True)


EMBEDDING = fields({"file": STR, "dtype": STR, "shape": items(integer(1), 2), "scale": NUMBER}, {"offset": integer()})


@dataclass(frozen=True, kw_only=True)
class _OnnxFields(Record):
    embedding: dict = field(EMBEDDING)  # file, dtype, shape, scale, and the int tables' layout
    nodes: dict = field(DICT, factory=dict)  # graph -> node count (informational)
    min_onnxruntime: str | None = field(optional(release), default=None, omit=True)
    lookup_tables: dict | None = field(optional(mapping(STR)), default=None, omit=True)


@dataclass(frozen=True, kw_only=True)
class OnnxOptions(Options, _OnnxFields):  # fields: _OnnxFields', then Options' (reversed MRO)
    """backends.onnx.options: the embedding table the target graph shares with the host's drafter lookup, and the
    oldest ONNX Runtime its graphs run on."""


PREFILL = fields({"num_tokens": integer(1), "signature": STR})
WINDOW = fields({"full_slots": integer(1), "signature": STR})


@dataclass(frozen=True, kw_only=True)
class _LiteRtFields(Record):
    max_draft: int = field(integer(1))  # the most drafts one verify call takes: verify runs max_draft + 1 tokens
    mask: dict = field(fields({"hidden": NUMBER}))  # the mask convention
    kv_cache: dict = field(DICT, factory=dict)  # the cache tensors' names, layouts and seq axes
    drafter_visibility: dict = field(DICT, factory=dict)
    prefill: list = field(items(PREFILL, 1))  # [{num_tokens, signature}]
    draft_windows: list | None = field(optional(items(WINDOW)), default=None, omit=True)  # [{full_slots, signature}]
    bundle: dict = field(fields({"file": STR}))  # file, sections, section_recipes, shared (weights stored once)


@dataclass(frozen=True, kw_only=True)
class LiteRtOptions(Options, _LiteRtFields):
    """backends.litert.options: static lengths (the capacity is kv_cache.capacity), the mask convention, the cache
    tensors, and the .litertlm bundle."""


@dataclass(frozen=True)
class BackendKind:
    kv_io: str  # window: past window in, new entries out; state: whole cache in and out
    extra: str | None  # the pip extra that installs its modules (None: the runtime-only install / [export])
    runtime_modules: tuple[str, ...]  # what the runtime backend imports
    export_needs_onnx: bool  # its export is checked against the ONNX graphs, so they are written too
    export_modules: tuple[str, ...] = ()  # what its export imports beyond the [export] extra
    static_verify: bool = False  # verify takes a fixed token count (--max-draft + 1): longer rounds are refused
    options: type[Options] = Options  # the record of its manifest options, read and checked with the manifest


BACKENDS = {
    "onnx": BackendKind("window", None, ("onnxruntime",), False, options=OnnxOptions),
    "litert": BackendKind("state", "litert", ("ai_edge_litert",), False,
                          ("litert_torch", "ai_edge_litert", "litert_lm_builder", "ai_edge_quantizer"), True,
                          options=LiteRtOptions),
}
