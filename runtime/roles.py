"""The role table: every tensor role a graph signature may carry, and every backend mtpkit knows.

Exporters name tensors however their format wants and tag each with one of these roles; runtimes bind by
(role, layer) and never by name. records.TensorSpec refuses a role missing here, so the table cannot drift
from what the graphs carry. A new backend adds its row to BACKENDS (and new roles, if any), its options record
(runtime/records.py OPTIONS), one export module export/backends/<kind>.py and one runtime module
runtime/backends/<kind>.py; everything else finds it through
them (tests/test_third_backend.py registers one that way and runs it end to end).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class BackendKind:
    kv_io: str  # window: past window in, new entries out; state: whole cache in and out
    extra: str | None  # the pip extra that installs its modules (None: the runtime-only install / [export])
    runtime_modules: tuple[str, ...]  # what the runtime backend imports
    export_needs_onnx: bool  # its export is checked against the ONNX graphs, so they are written too
    export_modules: tuple[str, ...] = ()  # what its export imports beyond the [export] extra
    static_verify: bool = False  # verify takes a fixed token count (--max-draft + 1): longer rounds are refused


BACKENDS = {
    "onnx": BackendKind("window", None, ("onnxruntime",), False),
    "litert": BackendKind("state", "litert", ("ai_edge_litert",), False,
                          ("litert_torch", "ai_edge_litert", "litert_lm_builder", "ai_edge_quantizer"), True),
}
