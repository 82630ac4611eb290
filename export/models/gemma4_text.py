"""Gemma 4 text target (E2B/E4B): loading, KV layout and the exportable step.

The step reuses HF's own decoder layers (so PLE, KV sharing, attention_k_eq_v and layer_scalar come along)
and replaces the HF cache with explicit tensors: the host passes the past K/V window of each KV-owning layer
and gets back only the new entries, which it writes into its preallocated buffers at `pos`.
"""

from __future__ import annotations

import torch
from torch import nn

from mtpkit.runtime.manifest import KVLayer

from ..checkpoint import CheckpointError, Source, assign_state, load_tensors

MODEL_TYPES = ("gemma4", "gemma4_text")
NEG = torch.finfo(torch.float32).min


def text_config(source: Source) -> dict:
    cfg = source.config
    if cfg.get("model_type") == "gemma4":
        if not isinstance(cfg.get("text_config"), dict):
            raise CheckpointError(f"{source.folder}/config.json is a gemma4 config without a text_config")
        return cfg["text_config"]
    return cfg


def hf_config(source: Source):
    """The transformers text config, from either hub layout."""
    from transformers import AutoConfig

    text = {**text_config(source), "model_type": "gemma4_text"}
    try:
        config = AutoConfig.for_model(**text)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"target config in {source.folder} is not a valid Gemma 4 text config: {e}") from e
    config._attn_implementation = "eager"
    return config


def load(source: Source) -> nn.Module:
    """Build Gemma4ForCausalLM in fp32 from either hub layout, loading only the text weights."""
    from transformers import Gemma4ForCausalLM

    config = hf_config(source)
    with torch.device("meta"):
        model = Gemma4ForCausalLM(config)
    # gemma4 (multimodal) checkpoints keep the text model under model.language_model.
    prefix = "model.language_model." if source.config.get("model_type") == "gemma4" else "model."
    state = load_tensors(source.folder, prefix, "model.")
    _load_state(model, state, source)
    return model.float().eval()


def _load_state(model: nn.Module, state: dict, source: Source) -> None:
    ignored = set(model.model._keys_to_ignore_on_load_unexpected)  # k/v weights of KV-shared layers
    state = {k: v for k, v in state.items() if k.removeprefix("model.").rsplit(".", 1)[0] not in ignored}
    assign_state(model, state, "target", source.folder)
    model.model.rotary_emb = type(model.model.rotary_emb)(model.config)  # meta-built buffers -> real
    model.model.embed_tokens.embed_scale = torch.tensor(model.config.hidden_size**0.5)
    if model.model.hidden_size_per_layer_input:
        ple = model.model.embed_tokens_per_layer
        ple.embed_scale = torch.tensor(model.config.hidden_size_per_layer_input**0.5)


def kv_layers(config) -> tuple[KVLayer, ...]:
    """The layers that own a KV cache (all others reuse a store layer's K/V in the same pass)."""
    return tuple(KVLayer(i, config.layer_types[i], config.per_layer_config[i].num_key_value_heads,
                         config.per_layer_config[i].head_dim)
                 for i, mode in enumerate(config.kv_sharing_modes) if mode != "reuse")


def store_layers(config) -> dict[str, int]:
    """The last KV owner of each type: the only K/V the drafter reads."""
    return {config.layer_types[i]: i for i, m in enumerate(config.kv_sharing_modes) if m == "store"}


class TargetStep(nn.Module):
    """(input_ids [1,T], input_pos [1], past K/V windows) -> logits, final-norm hidden, new K/V [1,h,T,d].

    Sliding layers may be given any suffix of their past (the runtime passes the last W-1 entries); full
    layers are given all past entries. Past entries sit at positions input_pos-P .. input_pos-1.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config
        self.owners = [d.layer for d in kv_layers(model.config)]

    def forward(self, input_ids, input_pos, *past):
        text = self.model.model
        cfg = self.config
        past_kv = {layer: (past[2 * j], past[2 * j + 1]) for j, layer in enumerate(self.owners)}
        ones = torch.ones_like(input_ids[0])
        q_pos = input_pos + ones.cumsum(0) - 1  # [T]
        hidden = text.embed_tokens(input_ids)
        ple = None
        if text.hidden_size_per_layer_input:
            ple = text.project_per_layer_inputs(hidden, text.get_per_layer_inputs(input_ids, None))
        position_ids = q_pos.unsqueeze(0)
        masks, rope = {}, {}
        for layer_type in set(cfg.layer_types):
            first = next(i for i in self.owners if cfg.layer_types[i] == layer_type)
            masks[layer_type] = self._mask(q_pos, input_pos, past_kv[first][0], layer_type)
            rope[layer_type] = text.rotary_emb(hidden, position_ids, layer_type)
        cache = _StepCache(past_kv)
        shared = {}
        for i, layer in enumerate(text.layers[: cfg.num_hidden_layers]):
            layer_type = cfg.layer_types[i]
            hidden = layer(hidden, ple[:, :, i, :] if ple is not None else None, shared_kv_states=shared,
                           position_embeddings=rope[layer_type], attention_mask=masks[layer_type],
                           position_ids=position_ids, cache=cache)
        hidden = text.norm(hidden)
        logits = self.model.lm_head(hidden)
        if cfg.final_logit_softcapping is not None:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        present = [t for layer in self.owners for t in cache.new[layer]]
        return (logits, hidden, *present)

    def _mask(self, q_pos, input_pos, past_k, layer_type):
        """Additive [1,1,T,P+T] mask from absolute positions only, so stale buffer slots are never visible."""
        n_past = torch.ones_like(past_k[0, 0, :, 0], dtype=torch.int64).cumsum(0)  # 1..P
        past_pos = input_pos - n_past.flip(0)  # input_pos-P .. input_pos-1
        kv_pos = torch.cat([past_pos, q_pos])
        diff = q_pos.unsqueeze(1) - kv_pos.unsqueeze(0)  # [T, P+T]
        visible = diff >= 0
        if layer_type == "sliding_attention":
            visible = visible & (diff < self.config.sliding_window)
        zero = torch.zeros((), dtype=torch.float32)
        return torch.where(visible, zero, torch.full((), NEG)).unsqueeze(0).unsqueeze(0)


class _StepCache:
    """Duck-typed HF cache: update() returns past + new and remembers the new entries as graph outputs."""

    def __init__(self, past: dict):
        self.past = past
        self.new = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.new[layer_idx] = (key_states, value_states)
        past_k, past_v = self.past[layer_idx]
        return torch.cat([past_k, key_states], dim=2), torch.cat([past_v, value_states], dim=2)
