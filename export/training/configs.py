"""Configs of the trained pair (hub spelling, same structure as export/tiny.py) and the drafter's token clusters."""

from __future__ import annotations

from ..tiny import BOS_ID, EOS_ID, PAD_ID, ROPE


def target_config(vocab: int, hidden: int, intermediate: int, window: int) -> dict:
    """E2B-like: (4 sliding + 1 full) x 2, the last 5 layers KV-shared (store layers 3 and 4), 1 kv head,
    PLE, double-wide MLP on shared layers, proportional RoPE on full layers, logit softcap."""
    pattern = ["sliding_attention"] * 4 + ["full_attention"]
    return {
        "model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"], "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": 10,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32, "global_head_dim": 64,
        "sliding_window": window, "layer_types": pattern * 2, "num_kv_shared_layers": 5,
        "hidden_size_per_layer_input": 32, "vocab_size_per_layer_input": vocab, "use_double_wide_mlp": True,
        "final_logit_softcapping": 30.0, "rope_parameters": ROPE, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "attention_k_eq_v": False, "num_global_key_value_heads": None, "initializer_range": 0.02,
        "pad_token_id": PAD_ID, "eos_token_id": EOS_ID, "bos_token_id": BOS_ID,
    }


def drafter_config(target: dict, hidden: int, intermediate: int, num_centroids: int, top_k: int) -> dict:
    """4 layers [s,s,s,f] reading the target's store-layer K/V, so head dims, kv heads and window are the target's."""
    text = {
        "model_type": "gemma4_text", "vocab_size": target["vocab_size"], "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": target["num_key_value_heads"], "head_dim": target["head_dim"],
        "global_head_dim": target["global_head_dim"], "sliding_window": target["sliding_window"],
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "num_kv_shared_layers": 4,
        "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0, "use_double_wide_mlp": False,
        "final_logit_softcapping": None, "rope_parameters": ROPE, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
        "attention_k_eq_v": False, "num_global_key_value_heads": None, "initializer_range": 0.02,
    }
    return {
        "model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"], "text_config": text,
        "backbone_hidden_size": target["hidden_size"], "use_ordered_embeddings": True,
        "num_centroids": num_centroids, "centroid_intermediate_top_k": top_k, "tie_word_embeddings": True,
    }


def balanced_clusters(emb, num_clusters: int, iters: int = 10, seed: int = 0):
    """Cluster embedding rows into equal-size groups (the centroid head views token_ordering as
    [num_clusters, V/num_clusters], so every group must hold exactly V/num_clusters tokens).

    Spherical k-means for the centres, then a greedy balanced assignment: all (token, cluster) pairs in order
    of similarity, each token taking its best cluster that still has room.

    Returns:
        (token_ordering [V] int64: cluster c is rows c*n..(c+1)*n-1, cluster_of [V] int64)
    """
    import torch

    vocab = emb.shape[0]
    if vocab % num_clusters:
        raise ValueError(f"vocab {vocab} is not divisible by {num_clusters} clusters")
    size = vocab // num_clusters
    x = torch.nn.functional.normalize(emb.detach().float(), dim=-1)
    gen = torch.Generator().manual_seed(seed)
    centres = x[torch.randperm(vocab, generator=gen)[:num_clusters]].clone()
    for _ in range(iters):
        assign = (x @ centres.T).argmax(-1)
        for c in range(num_clusters):
            members = x[assign == c]
            if len(members):
                centres[c] = torch.nn.functional.normalize(members.mean(0), dim=-1)
    sims = (x @ centres.T).flatten()
    cluster_of = torch.full((vocab,), -1, dtype=torch.long)
    room = [size] * num_clusters
    for flat in sims.argsort(descending=True).tolist():
        tok, c = divmod(flat, num_clusters)
        if cluster_of[tok] < 0 and room[c]:
            cluster_of[tok] = c
            room[c] -= 1
    ordering = torch.cat([torch.nonzero(cluster_of == c).flatten() for c in range(num_clusters)])
    return ordering, cluster_of
