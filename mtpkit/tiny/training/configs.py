"""Configs of the trained pair (built by make.py's text_config / assistant_config) and the drafter's token clusters."""

from __future__ import annotations

from ..make import assistant_config, text_config


def target_config(vocab: int, hidden: int, intermediate: int, window: int) -> dict:
    """E2B-like: (4 sliding + 1 full) x 2, the last 5 layers KV-shared (store layers 3 and 4), 1 kv head,
    PLE, double-wide MLP on shared layers, proportional RoPE on full layers, logit softcap."""
    cfg = text_config(vocab=vocab, hidden=hidden, intermediate=intermediate, window=window)
    return {"model_type": cfg.pop("model_type"), "architectures": ["Gemma4ForCausalLM"], **cfg}


def drafter_config(target: dict, hidden: int, intermediate: int, num_centroids: int, top_k: int) -> dict:
    """4 layers [s,s,s,f] reading the target's store-layer K/V, with a centroid head."""
    return assistant_config(target, hidden=hidden, intermediate=intermediate, heads=4, centroid=True,
                            num_centroids=num_centroids, top_k=top_k)


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
