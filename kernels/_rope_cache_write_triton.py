"""Triton kernel behind `rope_cache_write` (contract: see rope_cache_write.py).

Program (token t, head block b) reads BLOCK_H heads of t's projected row as two half-head tiles [BLOCK_H, Dh/2],
rotates the q and k heads with t's cos/sin row (fp32, one rounding) and stores each head where it belongs: q
heads to the q output, k heads (rotated) and v heads (as projected) to cache row cache_rows[t]. A head block
may straddle q, k and v heads, so the destination is chosen per head. Token count and head counts are runtime
values: one compiled variant per head dim and dtype.
"""
from __future__ import annotations

import triton
import triton.language as tl

BLOCK_H = 8  # heads per program: LLaDA-8B's 96 heads in 12 programs per token


@triton.jit(do_not_specialize=["n_heads", "n_kv_heads"])
def _rope_cache_write_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    n_heads, n_kv_heads, stride_qkv, stride_cos, stride_sin, stride_q, stride_kc, stride_vc,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    token = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HALF
    n_rotated = n_heads + n_kv_heads
    ok = (heads < n_rotated + n_kv_heads)[:, None] & d_ok[None, :]
    src = qkv_ptr + token.to(tl.int64) * stride_qkv + heads[:, None] * HEAD_DIM + d[None, :]
    lo = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    hi = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    c = tl.load(cos_ptr + pos * stride_cos + d, mask=d_ok, other=0.0)[None, :]
    s = tl.load(sin_ptr + pos * stride_sin + d, mask=d_ok, other=0.0)[None, :]
    rotated = (heads < n_rotated)[:, None]
    out_lo = tl.where(rotated, lo * c - hi * s, lo)
    out_hi = tl.where(rotated, hi * c + lo * s, hi)

    row = tl.load(rows_ptr + token).to(tl.int64)
    is_q = (heads < n_heads)[:, None]
    _store_halves(q_ptr + token.to(tl.int64) * stride_q + heads[:, None] * HEAD_DIM + d[None, :],
                  out_lo, out_hi, ok & is_q, HALF)
    _store_halves(k_cache_ptr + row * stride_kc + (heads - n_heads)[:, None] * HEAD_DIM + d[None, :],
                  out_lo, out_hi, ok & rotated & ~is_q, HALF)
    _store_halves(v_cache_ptr + row * stride_vc + (heads - n_rotated)[:, None] * HEAD_DIM + d[None, :],
                  out_lo, out_hi, ok & ~rotated, HALF)


@triton.jit
def _store_halves(ptrs, lo, hi, mask, HALF: tl.constexpr):
    tl.store(ptrs, lo.to(ptrs.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, hi.to(ptrs.dtype.element_ty), mask=mask)


def rope_cache_write_triton(qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache, n_heads: int,
                            n_kv_heads: int) -> None:
    n_tokens = qkv.shape[0]
    if n_tokens == 0:
        return
    n_qkv_heads = n_heads + 2 * n_kv_heads
    head_dim = qkv.shape[1] // n_qkv_heads
    grid = (n_tokens, triton.cdiv(n_qkv_heads, BLOCK_H))
    _rope_cache_write_kernel[grid](
        qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache, n_heads, n_kv_heads,
        qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), k_cache.stride(0), v_cache.stride(0),
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim // 2), BLOCK_H=BLOCK_H, num_warps=4)
