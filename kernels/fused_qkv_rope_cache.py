"""Fused QKV projection + rotary embedding + KV-cache write (Flash-Cache's IO-aware projection).

Contract (shared by the reference and the Triton kernel):
    x           [N, D]                 normed hidden states of the packed query tokens (bf16/fp16/fp32)
    w_qkv       [(Hq + 2*Hkv) * Dh, D] the layer's q, k and v weights stacked by rows (nn.Linear layout)
    b_qkv       [(Hq + 2*Hkv) * Dh] or None  (Dream has q/k/v bias, LLaDA has none)
    cos, sin    [P, Dh // 2] fp32      rotary tables for positions 0..P-1 (rotate-half convention)
    positions   [N] int                rotary position of each token
    cache_rows  [N] int                row of k_cache / v_cache that receives the token's K and V
    k_cache     [R, Hkv * Dh]          written in place: K after RoPE
    v_cache     [R, Hkv * Dh]          written in place: V
Returns q [N, Hq * Dh] in x's dtype, RoPE applied. K and V never exist as separate activation tensors on the
Triton path; rows of the cache that no token names are left untouched.

Rotate-half RoPE on a head vector h = [h1, h2] (two halves of Dh/2):
    rot(h) = [h1 * cos - h2 * sin,  h2 * cos + h1 * sin]
computed in fp32 and rounded once to the output dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rope_rotate_half(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotate-half RoPE in fp32. h: [N, H, Dh]; cos/sin: [N, Dh/2] fp32. Returns fp32."""
    h = h.float()
    half = h.shape[-1] // 2
    h1, h2 = h[..., :half], h[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([h1 * c - h2 * s, h2 * c + h1 * s], dim=-1)


def fused_qkv_rope_cache_reference(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    cache_rows: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
) -> torch.Tensor:
    """The unfused path a careful engineer writes in torch: one matmul on the stacked weight (fp32
    accumulation inside the BLAS), RoPE from precomputed tables in fp32, `index_copy_` into the cache."""
    n_tokens = x.shape[0]
    head_dim = w_qkv.shape[0] // (n_heads + 2 * n_kv_heads)
    qkv = F.linear(x, w_qkv, b_qkv)
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    pos = positions.long()
    c, s = cos.index_select(0, pos), sin.index_select(0, pos)
    q = rope_rotate_half(q.reshape(n_tokens, n_heads, head_dim), c, s).to(x.dtype)
    k = rope_rotate_half(k.reshape(n_tokens, n_kv_heads, head_dim), c, s)
    rows = cache_rows.long()
    k_cache.index_copy_(0, rows, k.reshape(n_tokens, -1).to(k_cache.dtype))
    v_cache.index_copy_(0, rows, v.to(v_cache.dtype))
    return q.reshape(n_tokens, n_heads * head_dim)


def fused_qkv_rope_cache(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    cache_rows: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    backend: str = "torch",
) -> torch.Tensor:
    """Dispatcher: backend "torch" runs the reference; "triton" the fused kernel (see module docstring)."""
    if backend == "torch":
        return fused_qkv_rope_cache_reference(
            x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache, n_heads, n_kv_heads
        )
    if backend == "triton":
        from ._fused_qkv_rope_cache_triton import fused_qkv_rope_cache_triton  # triton imported on first use

        return fused_qkv_rope_cache_triton(
            x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache, n_heads, n_kv_heads
        )
    raise ValueError(f"unknown kernel backend {backend!r}")
