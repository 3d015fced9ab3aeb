"""The pointer kernel behind `fused_qkv_rope_cache` (contract: see fused_qkv_rope_cache.py): any CUDA GPU
(the RTX 3090 path) and the interpreter.

One GEMM over the stacked weight whose output columns are walked as rotary *pairs*: pair p is column d of
head g's first half together with its partner column d + Dh/2. A program owns BLOCK_M tokens x BLOCK_P
pairs; its weight tile gathers the rows pair-interleaved (lo, hi, lo, hi, ...), so a single fp32 accumulator
splits in registers into `lo` and `hi` and rotate-half RoPE is plain element-wise math in the epilogue.
Because tiles are cut in pair space, a tile may cover part of a head, one head or several heads, and q/k/v
is decided per column: q columns go to the q output, k columns (rotated) and v columns (not rotated) go
straight to their cache rows.

Token count is a runtime argument (never a constexpr, and not specialised), so any N reuses the compiled
kernel. Configs are chosen per token bucket by _fused_qkv_select (timed once); a `PointerLauncher` binds one
config to one problem, so a call only launches.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from . import interpreting
from ._fused_qkv_common import FusedQKVProblem, configs_for_bucket, dot_precision, grouped_tile, store_halves


@dataclass(frozen=True)
class PointerConfig:
    block_m: int
    block_p: int  # rotary pairs per program: 2 * block_p output columns
    block_k: int
    stages: int
    warps: int
    group_m: int = 8

    @property
    def meta(self) -> dict:
        return {"BLOCK_M": self.block_m, "BLOCK_P": self.block_p, "BLOCK_K": self.block_k, "GROUP_M": self.group_m}


# Per size class. Small M streams the weight: narrow column tiles give >= 1 program per SM and deep K tiles
# keep many loads in flight. Large M is compute bound: 128 x 256 tiles (two heads) with grouped ordering so a
# group of row tiles shares each weight slice in L2; smaller tiles are there for narrow weights (Dream: 4608
# columns), where big tiles leave the last wave of programs mostly empty.
CUDA_CANDIDATES = {
    "small": [PointerConfig(bm, bp, bk, s, 4) for bm in (16, 32)
              for bp, bk, s in ((32, 128, 4), (16, 256, 4), (64, 128, 4), (32, 256, 3))],
    "medium": [PointerConfig(*row) for row in ((64, 32, 128, 4, 4), (64, 32, 128, 3, 4), (64, 64, 128, 4, 4),
                                               (128, 32, 128, 3, 8), (128, 32, 128, 2, 8), (128, 64, 64, 4, 8),
                                               (128, 64, 128, 3, 8), (64, 16, 256, 3, 4))],
    "large": [PointerConfig(*row) for row in ((128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 64, 64, 4, 8),
                                              (256, 64, 64, 3, 8), (64, 128, 64, 4, 4), (64, 64, 64, 4, 4))],
}
INTERPRETER_CONFIG = PointerConfig(64, 64, 64, 1, 4)  # big tiles = few interpreted programs


def default_configs(bucket: int) -> tuple[PointerConfig, ...]:
    """What the tuner tries for a token bucket (small M: exactly one tile of the bucket)."""
    if interpreting():
        return (INTERPRETER_CONFIG,)
    return configs_for_bucket(CUDA_CANDIDATES, bucket, (bucket,))


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qkv_pointer_kernel(
    x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    n_tokens, d_model, n_pairs, n_heads, n_kv_heads,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_cos, stride_sin, stride_q, stride_kc, stride_vc,
    HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    pid_m, pid_p = grouped_tile(tl.program_id(0), n_tokens, n_pairs, BLOCK_M, BLOCK_P, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    head = offs_p // HALF
    col_lo = head * HEAD_DIM + offs_p % HALF  # weight row / packed qkv column of the pair's first half

    # Tile column c computes pair c // 2, first half when c is even, its partner when odd: one dot as wide
    # as the tile (the widest tensor-core shape), and both members of a pair land in the same thread.
    offs_c = tl.arange(0, 2 * BLOCK_P)
    pair_c = pid_p * BLOCK_P + offs_c // 2
    w_rows = (pair_c // HALF) * HEAD_DIM + pair_c % HALF + (offs_c % 2) * HALF
    acc = _project(x_ptr, w_ptr, offs_m % n_tokens, w_rows % (2 * n_pairs), d_model, stride_xm, stride_xk,
                   stride_wn, stride_wk, UPCAST, DOT_PRECISION, EVEN_K, BLOCK_M, 2 * BLOCK_P, BLOCK_K)
    if HAS_BIAS:
        acc += tl.load(b_ptr + w_rows, mask=pair_c < n_pairs, other=0.0).to(tl.float32)[None, :]
    acc_lo, acc_hi = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_P, 2]))

    m_ok = offs_m < n_tokens
    pos = tl.load(pos_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
    cos = tl.load(cos_ptr + pos[:, None] * stride_cos + (offs_p % HALF)[None, :])
    sin = tl.load(sin_ptr + pos[:, None] * stride_sin + (offs_p % HALF)[None, :])
    kv_first = n_heads + n_kv_heads  # first v head in the stacked order q | k | v
    rotate = (head < kv_first)[None, :]
    out_lo = tl.where(rotate, acc_lo * cos - acc_hi * sin, acc_lo)
    out_hi = tl.where(rotate, acc_hi * cos + acc_lo * sin, acc_hi)

    # Each column lands in exactly one of q, k_cache, v_cache; row/column offsets stay vectors until the
    # store so the big epilogue keeps no [BLOCK_M, BLOCK_P] pointer tiles alive.
    q_row = offs_m.to(tl.int64) * stride_q
    cache_row = tl.load(rows_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
    is_q = (head < n_heads)[None, :] & m_ok[:, None]
    store_halves(q_ptr, q_row, col_lo, out_lo, out_hi, is_q, HALF)
    is_k = ((head >= n_heads) & (head < kv_first))[None, :] & m_ok[:, None]
    store_halves(k_cache_ptr, cache_row * stride_kc, col_lo - n_heads * HEAD_DIM, out_lo, out_hi, is_k, HALF)
    is_v = ((head >= kv_first) & (offs_p < n_pairs))[None, :] & m_ok[:, None]
    store_halves(v_cache_ptr, cache_row * stride_vc, col_lo - kv_first * HEAD_DIM, out_lo, out_hi, is_v, HALF)


@triton.jit
def _project(x_ptr, w_ptr, rows_x, rows_w, d_model, stride_xm, stride_xk, stride_wn, stride_wk,
             UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 x[rows_x] @ W[rows_w]^T over the full d_model (W rows gathered: any order, any spacing).

    Row indices arrive already wrapped into range, so only a K tail would need a mask: out-of-range tokens
    and pairs compute duplicates that the epilogue never stores.
    """
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows_x.to(tl.int64)[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + rows_w.to(tl.int64)[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, d_model, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = offs_k < d_model - k0
            a = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:  # the interpreter multiplies bf16 bit patterns; do its math in fp32
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    return acc


class PointerLauncher:
    """The pointer kernel bound to one config and one problem (grid and constexprs fixed); x and w_qkv are
    read through pointers, so one launcher serves any buffers of the problem's shape."""

    path = "pointer"

    def __init__(self, config: PointerConfig, problem: FusedQKVProblem):
        self.config = config
        self.q_shape = problem.q_shape
        n_pairs = problem.n_qkv_heads * problem.head_dim // 2
        self.grid = (triton.cdiv(problem.n_tokens, config.block_m) * triton.cdiv(n_pairs, config.block_p),)
        self.sizes = (problem.n_tokens, problem.d_model, n_pairs, problem.n_heads, problem.n_kv_heads)
        self.meta = {**config.meta, "EVEN_K": problem.d_model % config.block_k == 0, "HEAD_DIM": problem.head_dim,
                     "HAS_BIAS": problem.has_bias, "UPCAST": interpreting(),
                     "DOT_PRECISION": dot_precision(problem.dtype), "num_stages": config.stages,
                     "num_warps": config.warps}

    def __call__(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache) -> None:
        _fused_qkv_pointer_kernel[self.grid](
            x, w_qkv, b_qkv if b_qkv is not None else w_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache,
            *self.sizes,
            x.stride(0), x.stride(1), w_qkv.stride(0), w_qkv.stride(1), cos.stride(0), sin.stride(0), q.stride(0),
            k_cache.stride(0), v_cache.stride(0),
            **self.meta,
        )
