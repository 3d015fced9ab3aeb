"""Rotary embedding + KV-cache write of a finished QKV projection: the second half of the unfused
fused_qkv_rope_cache pipeline, for when a vendor GEMM computes the projection faster than the fused kernel
(the "cublas" path of _fused_qkv_select.py, timed against the fused kernels on the user's GPU).

Contract (shared by the reference and the Triton kernel):
    qkv         [N, (Hq + 2*Hkv) * Dh]  the projection's output, bias included (x @ w_qkv.T + b), q | k | v columns
    cos, sin    [P, Dh // 2] fp32       rotary tables for positions 0..P-1 (rotate-half convention)
    positions   [N] int                 rotary position of each token
    cache_rows  [N] int                 row of k_cache / v_cache that receives the token's K and V
    k_cache     [R, Hkv * Dh]           written in place: K after RoPE
    v_cache     [R, Hkv * Dh]           written in place: V as projected
    out         [N, Hq * Dh] or None    q after RoPE (allocated in qkv's dtype when None); returned
Rotate-half RoPE in fp32 from the projection's rounded values, rounded once to the output dtype: exactly what
fused_qkv_rope_cache_reference does after its matmul (which calls this reference).
"""
from __future__ import annotations

import torch


def rope_rotate_half(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotate-half RoPE in fp32. h: [N, H, Dh]; cos/sin: [N, Dh/2] fp32. Returns fp32."""
    h = h.float()
    half = h.shape[-1] // 2
    h1, h2 = h[..., :half], h[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([h1 * c - h2 * s, h2 * c + h1 * s], dim=-1)


def rope_cache_write_reference(qkv, cos, sin, positions, cache_rows, k_cache, v_cache, n_heads: int,
                               n_kv_heads: int, out: torch.Tensor | None = None) -> torch.Tensor:
    n_tokens = qkv.shape[0]
    head_dim = qkv.shape[1] // (n_heads + 2 * n_kv_heads)
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    pos = positions.long()
    c, s = cos.index_select(0, pos), sin.index_select(0, pos)
    q = rope_rotate_half(q.reshape(n_tokens, n_heads, head_dim), c, s).to(qkv.dtype)
    k = rope_rotate_half(k.reshape(n_tokens, n_kv_heads, head_dim), c, s)
    rows = cache_rows.long()
    k_cache.index_copy_(0, rows, k.reshape(n_tokens, -1).to(k_cache.dtype))
    v_cache.index_copy_(0, rows, v.to(v_cache.dtype))
    q = q.reshape(n_tokens, n_heads * head_dim)
    return q if out is None else out.copy_(q)


def rope_cache_write(qkv, cos, sin, positions, cache_rows, k_cache, v_cache, n_heads: int, n_kv_heads: int,
                     out: torch.Tensor | None = None, backend: str = "torch") -> torch.Tensor:
    """Dispatcher: "torch" runs the reference, "triton" the kernel (a CUDA device, or the interpreter)."""
    if backend == "torch":
        return rope_cache_write_reference(qkv, cos, sin, positions, cache_rows, k_cache, v_cache, n_heads,
                                          n_kv_heads, out)
    if backend == "triton":
        from ._rope_cache_write_triton import rope_cache_write_triton

        if out is None:
            head_dim = qkv.shape[1] // (n_heads + 2 * n_kv_heads)
            out = qkv.new_empty(qkv.shape[0], n_heads * head_dim)
        rope_cache_write_triton(qkv, cos, sin, positions, cache_rows, out, k_cache, v_cache, n_heads, n_kv_heads)
        return out
    raise ValueError(f"unknown kernel backend {backend!r}")
