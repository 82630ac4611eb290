"""Gemma 4 MTP drafter ("-assistant" checkpoints): loading, compatibility checks and the exportable step.

The drafter has no KV cache: each step reads the target's two store-layer K/V. The host passes exactly the
entries the drafter may see (its hand-off mode decides which), so the graph needs no mask of its own.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import lattice
from ..checkpoint import CheckpointError, Source, assign_state, load_tensors
from ..lattice import srq
from .gemma4_text import fused_ops  # noqa: F401  (the drafter's layers are transformers' Gemma 4 text layers)

MODEL_TYPES = ("gemma4_assistant",)
# `--quant int4` keeps no drafter weight at 8 bits: acceptance holds with every drafter weight at 4 bits
# (docs/quant-report-tiny-pair)
INT4_KEEP_8BIT: tuple[str, ...] = ()
INT4_COMPENSATE: tuple[str, ...] = ()
INT4_PLE_PATH: tuple[str, ...] = ()  # no per-layer embeddings


def low_bit_order(config) -> tuple[str, ...]:
    """Nothing of the drafter is lowered by a size budget: at most 50 MB, it proposes every token."""
    return ()


# How the centroid head reads its rows of the tied table (selected_logits: an embedding lookup): EMBEDDING_LOOKUP on
# LiteRT, Gather on ONNX, both quantized at the recipe's draft_table_bits. The size plan reads it here.
CENTROID_TABLE_USE = "lookup"


def stored_in(config, name: str, shape: tuple, backend: str) -> dict[str, set[str]]:
    """graph -> uses of the checkpoint tensor `name` in `backend`'s graphs (as gemma4_text.stored_in): all in the
    drafter graph; the tied table is read by the centroid head's gather, or by a dense head's lm_head (matmul)."""
    if name == "model.embed_tokens.weight":
        return {"drafter": {CENTROID_TABLE_USE if config.use_ordered_embeddings else "matmul"}}
    return {"drafter": {"matmul" if len(shape) == 2 else "other"}}


def hf_config(source: Source):
    from transformers import AutoConfig

    try:
        config = AutoConfig.for_model(**source.config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"drafter config in {source.folder} is not a valid gemma4_assistant config: {e}") from e
    config.get_text_config()._attn_implementation = "eager"
    return config


def load(source: Source) -> nn.Module:
    from transformers import Gemma4AssistantForCausalLM

    config = hf_config(source)
    with torch.device("meta"):
        model = Gemma4AssistantForCausalLM(config)
    state = load_tensors(source.folder, "", "")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state, found = lattice.read(source.config, state, "", shapes, torch.float32)
    assign_state(model, state, "drafter", source.folder)
    text = model.model
    text.rotary_emb = type(text.rotary_emb)(text.config)
    text.embed_tokens.embed_scale = torch.tensor(text.config.hidden_size**0.5)
    model = model.float().eval()
    model.lattice = found  # what --quant checkpoint writes (export/lattice)
    srq.apply(model, found)
    return model


def check_compatible(target_config, drafter_config) -> None:
    """Refuse a drafter that cannot read this target's activations and K/V."""
    d = drafter_config.get_text_config()
    t = target_config
    problems = []
    if drafter_config.backbone_hidden_size != t.hidden_size:
        problems.append(f"backbone_hidden_size {drafter_config.backbone_hidden_size} != target hidden_size {t.hidden_size}")
    if d.vocab_size != t.vocab_size:
        problems.append(f"vocab_size {d.vocab_size} != target vocab_size {t.vocab_size}")
    if d.sliding_window != t.sliding_window:
        problems.append(f"sliding_window {d.sliding_window} != target {t.sliding_window}")
    for layer_type in ("sliding_attention", "full_attention"):
        ti = t.layer_types.index(layer_type)
        di = d.layer_types.index(layer_type)
        for attr in ("head_dim", "num_key_value_heads"):
            tv, dv = getattr(t.per_layer_config[ti], attr), getattr(d.per_layer_config[di], attr)
            if tv != dv:
                problems.append(f"{layer_type} {attr} {dv} != target {tv}")
    if problems:
        raise CheckpointError("drafter does not match the target: " + "; ".join(problems) +
                              "; pass the -assistant checkpoint released with this target")


class DraftStep(nn.Module):
    """(target embedding of the newest token, previous activations, pos, store-layer K/V) -> logits, activations.

    inputs_embeds is E_target[token] * sqrt(H_target), looked up by the host in the target's own table.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds, activations, input_pos, full_key, full_value, sliding_key, sliding_value):
        shared = {"full_attention": (full_key, full_value), "sliding_attention": (sliding_key, sliding_value)}
        return draft_forward(self.model, torch.cat([inputs_embeds, activations], dim=-1), input_pos, shared)


def draft_forward(model: nn.Module, embeds_and_activations, input_pos, shared: dict, masks: dict | None = None,
                  selected: bool = False, **layer_kwargs):
    """The drafter's step, shared by the ONNX and LiteRT exports: -> (logits, projected activations).

    shared: layer type -> the target store layer's (K, V); masks: layer type -> additive mask, or None when the
    host passes only visible entries. No soft-cap on drafter logits, whatever the config says (as HF).
    selected: a centroid (ordered-embedding) head returns ((selected logits, their token ids), projected)
    instead of scattering them over the whole vocabulary: at Gemma's 262144 ids the scatter costs more than
    the drafter's four layers (docs/performance.md). A dense head ignores it.
    """
    text = model.model
    cfg = text.config
    hidden = model.pre_projection(embeds_and_activations)
    position_ids = input_pos.view(1, 1)
    for i, layer in enumerate(text.layers[: cfg.num_hidden_layers]):
        layer_type = cfg.layer_types[i]
        rope = text.rotary_emb(hidden, position_ids, layer_type)
        hidden = layer(hidden, None, shared_kv_states=shared, position_embeddings=rope,
                       attention_mask=masks[layer_type] if masks else None, position_ids=position_ids, cache=None,
                       **layer_kwargs)
    hidden = text.norm(hidden)
    projected = model.post_projection(hidden)
    if model.masked_embedding is None:
        return model.lm_head(hidden), projected
    logits, ids = selected_logits(model.masked_embedding, hidden, model.lm_head.weight)
    return ((logits, ids) if selected else scatter_selected(logits, ids, model.masked_embedding.vocab_size)), projected


def selected_logits(head: nn.Module, hidden, lm_head_weight):
    """HF's masked embedder up to its scatter: the logits of the top clusters' tokens [1,1,N] and their ids."""
    centroid_logits = head.centroids(hidden)  # [1,1,C]
    _, top = torch.topk(centroid_logits, k=head.centroid_intermediate_top_k, dim=-1)
    per_cluster = head.token_ordering.long().view(head.num_centroids, head.vocab_size_per_centroid)
    ids = per_cluster[top].reshape(-1)  # [top_k * V/C] canonical token ids
    # a lookup, not indexing: LiteRT lowers it to EMBEDDING_LOOKUP (whose table it quantizes), ONNX to Gather
    rows = torch.nn.functional.embedding(ids, lm_head_weight)  # [N, D]
    return (hidden.reshape(1, -1) @ rows.t()).reshape(1, 1, -1), ids.view(1, 1, -1)


def scatter_selected(logits, ids, vocab_size: int):
    """HF's fill: every other token gets min(selected) - 1 (its data-dependent .item() as a tensor min; no
    one_hot, B8). runtime/backends/litert.py full_logits does the same on the host."""
    out = torch.zeros(1, 1, vocab_size, dtype=logits.dtype) + (logits.min() - 1.0)
    return out.scatter(-1, ids, logits)
