"""The MTP drafter's LiteRT graph, converted by hand: LiteRT-LM's drafter contract (signature 0 "draft") plus
"draft_masked", read through the drafter's model adapter (its draft_forward) over the target's LiteRT KV caches."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from ...scoped import patched_all
from . import graft
from .describe import MASK_HIDDEN, cache_indices, draft_signature, draft_windows, drafter_window
from .patches import import_export_hf
from .sources import StateSource


class LiteRTDraftStep(nn.Module):
    """Gemma 4 assistant step over the target's LiteRT KV caches (K [1,h,C,d], V transposed [1,h,d,C]).

    Attention is litert-torch's "lrt_transposed_attention": HF's eager repeat_kv attention is mis-compiled by
    the converter (B5). The "clean" hand-off is computed in-graph from input_pos: full layers see j < pos,
    sliding layers pos-(W+1) <= j < pos (HF shows the drafter the last W+1 entries of what it is handed).
    """

    def __init__(self, adapter, drafter: nn.Module, cache_index: dict[str, int], window: int, cache_len: int):
        super().__init__()
        self.adapter = adapter  # the drafter's model adapter: its draft_forward is the step
        self.drafter = drafter
        self.cache_index = cache_index  # layer type -> the target's cache index of its store layer (cache names)
        self.window = window
        self.register_buffer("slots", torch.arange(cache_len, dtype=torch.int32).view(1, 1, 1, -1), persistent=False)

    def clean_masks(self, input_pos):
        pos = input_pos.view(1, 1, 1, 1)
        seen = self.slots < pos
        recent = seen & (self.slots >= pos - (self.window + 1))
        zero, hidden = torch.zeros((), dtype=torch.float32), torch.full((), MASK_HIDDEN, dtype=torch.float32)
        return {"full_attention": torch.where(seen, zero, hidden),
                "sliding_attention": torch.where(recent, zero, hidden)}

    def forward(self, activations, input_pos, **named):
        lite_rt_lm = "mask" in named  # LiteRT-LM's contract: causal mask (j <= pos), vocabulary-wide logits
        if lite_rt_lm:  # intersecting with the clean view keeps the clean view and uses the mask
            masks = {t: torch.minimum(m, named["mask"]) for t, m in self.clean_masks(input_pos).items()}
        else:
            masks = {"full_attention": named["full_mask"], "sliding_attention": named["sliding_mask"]}
        shared = {t: _store(named, n) for t, n in self.cache_index.items()}
        logits, projected = self.adapter.draft_forward(self.drafter, activations, input_pos, shared, masks,
                                                       selected=not lite_rt_lm, k_ts_idx=2, v_ts_idx=3)
        if isinstance(logits, tuple):  # draft_masked of a centroid head: the selected tokens only
            return {"selected_logits": logits[0], "selected_ids": logits[1].to(torch.int32),
                    "projected_activations": projected}
        return {"logits": logits, "projected_activations": projected}


def _store(named: dict, n: int) -> tuple:
    """A store layer's (K, V): draft_masked reads the sliding one through a window of its last W+1 slots and the full
    one through a prefix of the cache (one signature per prefix length, draft_windows)."""
    if f"window_k_{n}" in named:
        return named[f"window_k_{n}"], named[f"window_v_{n}"]
    return named[f"kv_cache_k_{n}"], named[f"kv_cache_v_{n}"]


@contextlib.contextmanager
def _attn_implementation(model: nn.Module, name: str):
    """Switch a loaded HF model's attention function for the export only (the caller's model is restored)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values()
    with patched_all(configs, "_attn_implementation", name):
        yield


def drafter_samples(target_adapter, target_config, cache_index: dict[str, int], cache_len: int) -> dict[str, dict]:
    """Sample inputs of both drafter signatures; their keys become the .tflite input names."""
    kv = {}
    owners = target_adapter.kv_layers(target_config)
    for n in sorted(cache_index.values()):
        d = owners[n]
        kv[f"kv_cache_k_{n}"] = torch.randn(1, d.kv_heads, cache_len, d.head_dim)
        kv[f"kv_cache_v_{n}"] = torch.randn(1, d.kv_heads, d.head_dim, cache_len)
    common = {"activations": torch.randn(1, 1, 2 * target_config.hidden_size),
              "input_pos": torch.tensor([3], dtype=torch.int32)}
    mask = torch.zeros(1, 1, 1, cache_len)
    samples = {"draft": {**common, "mask": mask, **kv}}
    w = drafter_window(target_config, cache_len)
    for slots in draft_windows(cache_len):
        shown = {"sliding_attention": w, "full_attention": slots}
        windows = {}
        for layer_type, n in cache_index.items():
            if shown[layer_type] < cache_len or layer_type == "sliding_attention":
                windows[f"window_k_{n}"] = kv[f"kv_cache_k_{n}"][:, :, :shown[layer_type]].clone()
                windows[f"window_v_{n}"] = kv[f"kv_cache_v_{n}"][..., :shown[layer_type]].clone()
            else:
                windows |= {k: kv[k] for k in (f"kv_cache_k_{n}", f"kv_cache_v_{n}")}
        samples[draft_signature(slots, cache_len)] = {**common, "full_mask": mask[..., :slots].clone(),
                                                      "sliding_mask": mask[..., :w].clone(), **windows}
    return samples


def export_drafter(drafter_model: nn.Module, target_config, path: Path, cache_len: int, scratch: Path, *,
                   target_adapter, drafter_adapter) -> None:
    """Convert the drafter to `path` with signatures draft (index 0, LiteRT-LM's contract) and draft_masked:
    converted without its weights, which are grafted in afterwards (graft.py), as for the target."""
    import litert_torch

    import_export_hf()  # registers lrt_transposed_attention
    cache_index = cache_indices(target_adapter, target_config)
    step = LiteRTDraftStep(drafter_adapter, drafter_model, cache_index, target_config.sliding_window,
                           cache_len).eval()
    state = step.state_dict()
    weights = graft.WeightInputs(buffer_kept=lambda name: name in state)
    converter = litert_torch.Converter()
    with weights.converting():
        for name, sample in drafter_samples(target_adapter, target_config, cache_index, cache_len).items():
            converter.signature(name, step, sample_kwargs=sample)
    skeleton = scratch / "drafter.skeleton.tflite"
    with _attn_implementation(drafter_model, "lrt_transposed_attention"), torch.no_grad():
        converter.convert(strict_export=False).export(str(skeleton))
    graft.graft(skeleton, path, StateSource(state), graft.unquantized, names=weights.names)
