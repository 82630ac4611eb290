"""The description of a LiteRT export handed to the manifest: every signature's tensors with their roles (from the
tables below, never from the runtime's guesses), static lengths, cache layout and mask conventions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .graft import read_map

MASK_HIDDEN = float(-0.7 * np.finfo(np.float32).max)  # what LiteRT-LM writes (InitializeAttentionMask, fp32)


def draft_windows(cache_len: int) -> list[int]:
    """Cache slots the full store layer shows each draft_masked signature: powers of two from 32 below cache_len,
    then cache_len. The runtime runs the smallest that holds the visible range, so a draft step reads and attends
    over what its position needs, not the whole capacity (at e2b-wide widths, position 256: a 1024-slot cache
    costs a drafter round 2.4x a 288-slot one)."""
    return [s for s in (2 ** i for i in range(5, 32)) if s < cache_len] + [cache_len]


def draft_signature(slots: int, cache_len: int) -> str:
    return "draft_masked" if slots == cache_len else f"draft_masked_{slots}"


def drafter_window(target_config, cache_len: int) -> int:
    """Slots of draft_masked's sliding window inputs: all a sliding layer can show the drafter (W+1 entries,
    handoff.drafter_ranges), so its attention and input copies do not grow with the cache."""
    return min(target_config.sliding_window + 1, cache_len)


def cache_indices(target_adapter, target_config) -> dict[str, int]:
    """Layer type -> cache index of the store layer the drafter reads.

    export_hf numbers the target's caches kv_cache_k_<n> by position among the KV-owning layers, and LiteRT-LM
    hands the drafter the target's caches by those names; n equals the layer id only while every KV owner comes
    before every shared layer.
    """
    owners = [d.layer for d in target_adapter.kv_layers(target_config)]
    return {t: owners.index(i) for t, i in target_adapter.store_layers(target_config).items()}


TARGET_ROLES = {"embeddings": "embeddings", "per_layer_embeddings": "per_layer_embeddings", "input_pos": "input_pos",
                "mask": "mask", "logits": "logits", "activations": "activations"}
DRAFTER_ROLES = {"activations": "embeds_and_activations", "input_pos": "input_pos", "mask": "mask", "full_mask": "mask",
                 "sliding_mask": "mask", "logits": "logits", "projected_activations": "projected_activations",
                 "selected_logits": "selected_logits", "selected_ids": "selected_ids"}
DRAFTER_MASK_TYPES = {"full_mask": "full_attention", "sliding_mask": "sliding_attention"}


def _tensor(name: str, detail: dict, kind: str, owners: list[int], store_types: dict[int, str]) -> dict:
    spec = {"name": name, "shape": [int(x) for x in detail["shape"]], "dtype": np.dtype(detail["dtype"]).name}
    if name.startswith("kv_cache_"):
        k_or_v, index = name.removeprefix("kv_cache_").split("_")
        layer = owners[int(index)]  # target and drafter both name caches by owner index (cache_indices)
        return {**spec, "role": "kv_key" if k_or_v == "k" else "kv_value", "layer": layer,
                "seq_axis": 2 if k_or_v == "k" else 3}
    if name.startswith("window_"):  # draft_masked's store layers: a window of their caches
        k_or_v, index = name.removeprefix("window_").split("_")
        return {**spec, "role": "store_key" if k_or_v == "k" else "store_value", "layer": owners[int(index)],
                "seq_axis": 2 if k_or_v == "k" else 3, "layer_type": store_types[int(index)]}
    if kind == "target":
        role = TARGET_ROLES.get(name)
    elif kind == "drafter":
        role = DRAFTER_ROLES.get(name)
        if name in DRAFTER_MASK_TYPES:
            spec["layer_type"] = DRAFTER_MASK_TYPES[name]
    else:  # embedders: token_ids -> embeddings / per_layer_embeddings (export_hf names both outputs "embeddings")
        role = "token_ids" if name == "token_ids" else kind
    if role is None:
        raise RuntimeError(f"{kind} graph has an unexpected tensor {name!r} (litert-torch changed its IO?)")
    return {**spec, "role": role}


def signature_order(path: Path) -> list[str]:
    """Signature keys in flatbuffer order: LiteRT-LM runs the drafter's signature index 0."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(read_map(path), 0)  # mapped: a large file's weights stay unread
    return [model.SignatureDefs(i).SignatureKey().decode() for i in range(model.SignatureDefsLength())]


def describe_file(path: Path, kind: str, owners: list[int], store_types: dict[int, str]) -> dict:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    NO_DELEGATES = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES  # signatures only: XNNPACK would pack weights

    interpreter = Interpreter(model_path=str(path), experimental_op_resolver_type=NO_DELEGATES)
    signatures = {}
    for index, key in enumerate(signature_order(path)):
        runner = interpreter.get_signature_runner(key)
        ins = [_tensor(n, d, kind, owners, store_types) for n, d in sorted(runner.get_input_details().items())]
        outs = [_tensor(n, d, kind, owners, store_types) for n, d in sorted(runner.get_output_details().items())]
        pos = next((t for t in ins if t["role"] in ("input_pos", "token_ids")), None)
        signatures[key] = {"index": index, "num_tokens": pos["shape"][-1] if pos else None, "inputs": ins,
                           "outputs": outs}
    return {"file": path.name, "bytes": path.stat().st_size, "signatures": signatures}


def describe(out_dir: Path, target_adapter, target_config, *, prefill_len: int, cache_len: int,
             max_draft: int) -> dict:
    layers = target_adapter.kv_layers(target_config)
    owners = [d.layer for d in layers]
    store_types = {n: t for t, n in cache_indices(target_adapter, target_config).items()}
    files = {key: describe_file(out_dir / f"{key}.tflite", kind, owners, store_types) for key, kind in
             (("target", "target"), ("embedder", "embeddings"), ("per_layer_embedder", "per_layer_embeddings"),
              ("drafter", "drafter"))}
    if signature_order(out_dir / "drafter.tflite")[0] != "draft":
        raise RuntimeError("drafter.tflite: signature 0 must be 'draft' (LiteRT-LM runs index 0)")
    window = target_config.sliding_window
    layer_names = [{**dataclasses.asdict(d), "key": f"kv_cache_k_{n}", "value": f"kv_cache_v_{n}"}
                   for n, d in enumerate(layers)]
    return {
        "backend": "litert", "files": files,
        "bundle": {"file": "model.litertlm", "bytes": (out_dir / "model.litertlm").stat().st_size,
                   "sections": ["llm_metadata", "executor_metadata", "hf_tokenizer", "tf_lite_prefill_decode",
                                "tf_lite_embedder", "tf_lite_per_layer_embedder", "tf_lite_mtp_drafter"]},
        "signatures": {"prefill": [{"num_tokens": prefill_len, "signature": f"prefill_{prefill_len}"}],
                       "decode": "decode", "verify": "verify", "draft": "draft", "draft_masked": "draft_masked",
                       "draft_windows": [{"full_slots": n, "signature": draft_signature(n, cache_len)}
                                         for n in draft_windows(cache_len)],
                       "embed_prefill": [{"num_tokens": prefill_len, "signature": f"prefill_embedder_{prefill_len}"}],
                       "embed_decode": "decode_embedder",
                       "per_layer_embed_prefill": [{"num_tokens": prefill_len,
                                                    "signature": f"prefill_per_layer_embedder_{prefill_len}"}],
                       "per_layer_embed_decode": "decode_per_layer_embedder"},
        "prefill_lens": [prefill_len], "max_draft": max_draft,  # verify takes max_draft + 1 tokens
        "kv_cache": {"layers": layer_names, "store_layers": target_adapter.store_layers(target_config),
                     "dtype": "float32",
                     "key_layout": "[1, kv_heads, cache_len, head_dim]", "key_seq_axis": 2,
                     "value_layout": "[1, kv_heads, head_dim, cache_len] (transposed)", "value_seq_axis": 3,
                     "state": "every target signature takes all caches and returns the updated copies"},
        "mask": mask_conventions(window),
        "drafter_visibility": {"full_attention": "j < input_pos",
                               "sliding_attention": f"input_pos-{window + 1} <= j < input_pos"},
        "embedding_scale_included": True,  # embedder.tflite returns E[ids] * sqrt(H), the drafter's input half
    }


def mask_conventions(window: int) -> dict:
    return {"dtype": "float32", "visible": 0.0, "hidden": MASK_HIDDEN, "combine": "additive",
            "target": "[1,1,T,cache_len]; row i (query at input_pos[i]) is causal: visible j <= input_pos[i]; "
                      f"sliding layers add the window (j > input_pos[i]-{window}) in-graph",
            "draft": "[1,1,1,cache_len] LiteRT-LM's causal row (visible j <= input_pos); the graph takes "
                     "min() with the clean visibility, so any mask at least that permissive gives clean",
            "draft_masked": "full_mask [1,1,1,F] over the first F slots of the full store layer's cache (the "
                            "whole cache, kv_cache_k/v, when F = cache_len; else window_k/window_v), F the "
                            "signature's full_slots in options.draft_windows (run the smallest F >= hi); "
                            "sliding_mask [1,1,1,S] over the sliding store layer's window_k/window_v, the "
                            "S = min(W+1, cache_len) cache slots from window_start = min(max(0, hi - S), "
                            "cache_len - S); hi the end of each layer type's visible range; masks used as given "
                            "(e.g. HF's hand-off)"}
