"""Torch custom ops for the blocks a graph backend lowers to single fused kernels: RMSNorm, rotary, attention.

Their PyTorch kernels are the same math as transformers' Gemma 4 modules, so a step module that calls them gives
the same outputs as one that does not; only an exporter with a translation for `mtpkit::*` (the ONNX backend's
fusions.py) sees a difference. A model adapter routes its modules here inside a scoped patch
(export/models/gemma4_text.py `fused_ops`), so nothing changes outside an export.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("mtpkit::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * (mean(x^2, last axis) + eps)^-0.5 * weight (Gemma 4's form; weight is all ones when scale-free)."""
    return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5) * weight


@torch.library.custom_op("mtpkit::rotary", mutates_args=())
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """Rotate-half rotary embedding, as transformers' apply_rotary_pos_emb.

    x: [B,N,S,H]; cos, sin: [1,R,H], whose two halves are equal (cat(f, f), as every transformers rotary module
    builds them), which is what makes this one ORT RotaryEmbedding. x[b, :, s] takes row rows[b, s] of cos/sin,
    or row s when rows is None (B = 1): K/V heads first ([1,N,T,H]), or the query with its positions as the
    batch ([T,N,1,H], rows [T,1] = 0..T-1).
    """
    if rows is None:
        rows = torch.arange(x.shape[2]).unsqueeze(0)
    cos, sin = cos[0][rows].unsqueeze(1), sin[0][rows].unsqueeze(1)  # [B,1,S,H]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@torch.library.custom_op("mtpkit::attention", mutates_args=())
def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
              scale: float, groups: int) -> torch.Tensor:
    """Softmax attention with grouped K/V heads, as transformers' eager attention.

    key/value: [B,N_kv,L,H]; query head (kv, j), j < groups, reads K/V head kv. query: [B,T*groups,N_kv*H], row
    (t, j) holding query heads (0, j) .. (N_kv-1, j) at position t: the layout ORT's MultiHeadAttention reads as
    N_kv heads over T*groups rows. mask: additive [1,1,T,L], or None when every key is visible. Returns the
    query's layout.
    """
    batch, rows, width = query.shape
    kv_heads, dim = key.shape[1], key.shape[3]
    query = query.view(batch, -1, groups, kv_heads, dim).permute(0, 3, 2, 1, 4).reshape(batch, -1, rows // groups, dim)
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scale
    if mask is not None:
        weights = weights + mask
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value)  # [B, N_kv*groups, T, H]
    return out.view(batch, kv_heads, groups, -1, dim).permute(0, 3, 2, 1, 4).reshape(batch, rows, width)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@rotary.register_fake
def _(x, cos, sin, rows):
    return torch.empty_like(x)


@attention.register_fake
def _(query, key, value, mask, scale, groups):
    return torch.empty_like(query)
