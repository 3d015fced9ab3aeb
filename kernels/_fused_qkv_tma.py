"""Hopper (sm90+) kernel behind `fused_qkv_rope_cache`: TMA tile loads of x and the unpermuted stacked weight.

The pointer kernel (_fused_qkv_pointer.py) gathers weight rows pair-interleaved, which rules out TMA. Here the
weight is read as contiguous row blocks through a tensor descriptor and a program owns BLOCK_M tokens x whole
rotary halves, in one of two shapes (both constexpr):

* WIDE (BLOCK_H == Dh/2): HEADS whole heads (1 or 2). Per K step one [HEADS*Dh, BLOCK_K] weight tile and one
  dot as wide as the tile (the widest tensor-core shape); after the loop the [BLOCK_M, HEADS*Dh] fp32
  accumulator is split into lo = columns [0, Dh/2) and hi = [Dh/2, Dh) of each head (reshape/permute/split:
  register renaming on sm90, no data movement).
* SPLIT (BLOCK_H < Dh/2, one head): columns [d0, d0+BLOCK_H) of the head's lo half and the matching columns
  of its hi half, two [BLOCK_H, BLOCK_K] tiles and two dots per K step. Narrow column blocks give enough
  programs to stream the weight at small token counts (Dream has only 36 heads).

Epilogue (_fused_qkv_common.epilogue) one head at a time: bias, rotate-half RoPE for q and k heads, q to the q
output, k/v to their cache rows. TMA zero-fills rows past the token count, past the last head and past
d_model, so no load needs a mask; stores are masked by token < n_tokens.

A `TMALauncher` binds one config to one problem and one (x, w_qkv) pair: it builds the two tensor descriptors
with the config's block shapes once, so a call only launches.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from . import interpreting
from ._fused_qkv_common import (TMA_HEAD_DIM, FusedQKVProblem, configs_for_bucket, dot_precision, epilogue,
                                grouped_tile, make_descriptor, wide_epilogue, wide_mainloop)


@dataclass(frozen=True)
class TMAConfig:
    block_m: int
    heads: int  # whole heads per WIDE tile (1 or 2); 1 for SPLIT
    block_h: int  # lo columns per tile: Dh/2 is WIDE, smaller is SPLIT
    block_k: int
    stages: int
    warps: int
    group_m: int = 8

    @property
    def meta(self) -> dict:
        return {"BLOCK_M": self.block_m, "HEADS": self.heads, "BLOCK_H": self.block_h, "BLOCK_K": self.block_k,
                "GROUP_M": self.group_m}


# BLOCK_H == 64 is WIDE (whole heads), smaller is SPLIT (one head's BLOCK_H lo columns + their hi partners).
# Small M streams the weight (33 MB for Dream, 100 MB for LLaDA): narrow SPLIT blocks (Dream: 36 heads x 4
# blocks of 16 = 144 programs) and deep pipelines; BLOCK_M 64 pads the tokens to one warpgroup MMA. Medium M is
# still mostly weight traffic: enough programs for every SM. Large M is compute bound: 128 x 256 tiles (two
# heads) with grouped ordering so a group of row tiles shares each weight slice in L2; one-head, 64-row and
# SPLIT tiles trade tile efficiency for a fuller last wave (Dream at 1000 tokens: 144 two-head tiles on 132
# SMs). 128 x 128 tiles on one warpgroup with five or six stages: the best at LLaDA's 128 tokens
# (benchmarks/probe_splitk.py, probe_fused_schedules.py).
CUDA_CANDIDATES = {
    "small": [TMAConfig(bm, 1, bh, 128, s, 4) for bm in (16, 32, 64) for bh, s in ((16, 6), (32, 5), (64, 4))],
    "medium": [TMAConfig(*row) for row in ((64, 1, 16, 128, 5, 4), (64, 1, 32, 128, 4, 4), (64, 1, 64, 64, 4, 4),
                                           (64, 2, 64, 64, 3, 4), (128, 1, 32, 64, 4, 8), (128, 1, 64, 64, 4, 8),
                                           (128, 2, 64, 64, 3, 8), (128, 1, 64, 64, 5, 4), (128, 1, 64, 64, 6, 4))],
    "large": [TMAConfig(*row) for row in ((128, 2, 64, 64, 3, 8), (128, 2, 64, 64, 4, 8), (128, 1, 64, 64, 4, 8),
                                          (128, 1, 64, 128, 3, 8), (128, 1, 32, 64, 4, 8), (64, 2, 64, 64, 4, 4),
                                          (64, 1, 64, 64, 4, 4), (128, 1, 64, 64, 4, 4))],
}

# Interpreter: the default runs "wide2"; tests force the others (forced_fused_qkv(tma_configs=...)).
INTERPRETER_CONFIGS = {
    "wide1": TMAConfig(32, 1, 64, 64, 1, 4),
    "wide2": TMAConfig(64, 2, 64, 32, 1, 4),
    "split": TMAConfig(16, 1, 16, 64, 1, 4),
}


def default_configs(bucket: int) -> tuple[TMAConfig, ...]:
    """What the tuner tries for a token bucket (small M: BLOCK_M == bucket, or one 64-row warpgroup MMA)."""
    if interpreting():
        return (INTERPRETER_CONFIGS["wide2"],)
    return configs_for_bucket(CUDA_CANDIDATES, bucket, (bucket, 64))


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qkv_tma_kernel(
    x_desc, w_desc, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads,
    stride_cos, stride_sin, stride_q, stride_kc, stride_vc,
    HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    WIDE: tl.constexpr = BLOCK_H == HALF
    tl.static_assert(HEADS == 1 or HEADS == 2, "a program covers one or two heads")
    tl.static_assert(WIDE or HEADS == 1, "column blocks narrower than a half head cover one head")
    tl.static_assert(HALF % BLOCK_H == 0, "BLOCK_H must divide Dh/2")
    SLICES: tl.constexpr = HALF // BLOCK_H  # column blocks per head (1 when WIDE)
    n_col_tiles = tl.cdiv(n_qkv_heads, HEADS) * SLICES
    pid_m, pid_n = grouped_tile(tl.program_id(0), n_tokens, n_col_tiles, BLOCK_M, 1, GROUP_M)
    head0 = (pid_n // SLICES) * HEADS
    d0 = (pid_n % SLICES) * BLOCK_H  # first lo column of the block within its head
    w_row = head0 * HEAD_DIM + d0
    off_m = pid_m * BLOCK_M

    ctx = (n_tokens, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
           n_heads, n_kv_heads, n_qkv_heads, stride_cos, stride_sin, stride_q, stride_kc, stride_vc)

    if WIDE:
        acc = wide_mainloop(x_desc, w_desc, off_m, w_row, 0, d_model, UPCAST, DOT_PRECISION, BLOCK_M,
                            HEADS * HEAD_DIM, BLOCK_K)
        wide_epilogue(acc, head0, off_m, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M, HEADS)
    else:
        acc_lo = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
        acc_hi = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
        for k in range(0, d_model, BLOCK_K):
            a = x_desc.load([off_m, k])
            w_lo = w_desc.load([w_row, k])
            w_hi = w_desc.load([w_row + HALF, k])
            if UPCAST:
                a, w_lo, w_hi = a.to(tl.float32), w_lo.to(tl.float32), w_hi.to(tl.float32)
            acc_lo = tl.dot(a, w_lo.T, acc_lo, input_precision=DOT_PRECISION)
            acc_hi = tl.dot(a, w_hi.T, acc_hi, input_precision=DOT_PRECISION)
        epilogue(acc_lo, acc_hi, head0, off_m, d0, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M, BLOCK_H)


class TMALauncher:
    """The TMA kernel bound to one config, one problem and one (x, w_qkv) pair: the descriptors hold those
    tensors (x and w_qkv passed to a call are not read; the caller keys launchers on them)."""

    path = "tma"

    def __init__(self, config: TMAConfig, problem: FusedQKVProblem, x, w_qkv):
        self.config = config
        self.q_shape = problem.q_shape
        wide = 2 * config.block_h == TMA_HEAD_DIM
        self.x_desc = make_descriptor(x, [config.block_m, config.block_k])
        self.w_desc = make_descriptor(w_qkv, [config.heads * TMA_HEAD_DIM if wide else config.block_h,
                                              config.block_k])
        col_tiles = triton.cdiv(problem.n_qkv_heads, config.heads) * (TMA_HEAD_DIM // 2 // config.block_h)
        self.grid = (triton.cdiv(problem.n_tokens, config.block_m) * col_tiles,)
        self.sizes = (problem.n_tokens, problem.d_model, problem.n_heads, problem.n_kv_heads, problem.n_qkv_heads)
        self.meta = {**config.meta, "HEAD_DIM": TMA_HEAD_DIM, "HAS_BIAS": problem.has_bias, "UPCAST": interpreting(),
                     "DOT_PRECISION": dot_precision(problem.dtype), "num_stages": config.stages,
                     "num_warps": config.warps}

    def __call__(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache) -> None:
        _fused_qkv_tma_kernel[self.grid](
            self.x_desc, self.w_desc, b_qkv if b_qkv is not None else w_qkv, cos, sin, positions, cache_rows, q,
            k_cache, v_cache, *self.sizes,
            cos.stride(0), sin.stride(0), q.stride(0), k_cache.stride(0), v_cache.stride(0),
            **self.meta,
        )
