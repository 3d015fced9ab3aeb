"""Hopper (sm90+) kernel behind `fused_qkv_rope_cache`: TMA tile loads of x and the unpermuted stacked weight.

The pointer kernel (_fused_qkv_rope_cache_triton.py) gathers weight rows pair-interleaved, which rules out
TMA. Here the weight is read as contiguous row blocks through a tensor descriptor and a program owns
BLOCK_M tokens x whole rotary halves, in one of two shapes (both constexpr):

* WIDE (BLOCK_H == Dh/2): HEADS whole heads (1 or 2). Per K step one [HEADS*Dh, BLOCK_K] weight tile and one
  dot as wide as the tile (the widest tensor-core shape); after the loop the [BLOCK_M, HEADS*Dh] fp32
  accumulator is split into lo = columns [0, Dh/2) and hi = [Dh/2, Dh) of each head (reshape/permute/split:
  register renaming on sm90, no data movement).
* SPLIT (BLOCK_H < Dh/2, one head): columns [d0, d0+BLOCK_H) of the head's lo half and the matching columns
  of its hi half, two [BLOCK_H, BLOCK_K] tiles and two dots per K step. Narrow column blocks give enough
  programs to stream the weight at small token counts (Dream has only 36 heads).

Epilogue as in the pointer kernel, one head at a time: bias, rotate-half RoPE for q and k heads, q to the q
output, k/v to their cache rows. The head is a scalar, so whether it is q, k, v or past the last head is a
branch, not a mask. TMA zero-fills rows past the token count, past the last head and past d_model, so no
load needs a mask; stores are masked by token < n_tokens.

Descriptors are built on the host (triton.tools.tensor_descriptor.TensorDescriptor) with a placeholder
block shape; each autotuning config's pre_hook sets the block shapes it needs before its launch.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import gpu_time_ms, interpreting
from ._fused_qkv_rope_cache_triton import (_grouped_tile, _store_halves, m_bucket, size_class_configs,
                                           size_class_pruner)

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - triton without host tensor descriptors
    TensorDescriptor = None

TMA_HEAD_DIM = 128  # the only head dim this path compiles for (LLaDA-8B and Dream-7B)


def tma_available() -> bool:
    """Whether this triton install has host-side tensor descriptors."""
    return TensorDescriptor is not None


def _set_block_shapes(nargs):
    """Autotune pre_hook: give the descriptors the tile shapes of the config about to run."""
    block_h, head_dim = nargs["BLOCK_H"], nargs["HEAD_DIM"]
    w_rows = nargs["HEADS"] * head_dim if 2 * block_h == head_dim else block_h
    nargs["x_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["w_desc"].block_shape = [w_rows, nargs["BLOCK_K"]]


def _config(block_m, heads, block_h, block_k, stages, warps, group_m=8):
    meta = {"BLOCK_M": block_m, "HEADS": heads, "BLOCK_H": block_h, "BLOCK_K": block_k, "GROUP_M": group_m}
    return triton.Config(meta, num_stages=stages, num_warps=warps, pre_hook=_set_block_shapes)


# (BLOCK_M, HEADS, BLOCK_H, BLOCK_K, num_stages, num_warps); BLOCK_H == 64 is WIDE (whole heads), smaller is
# SPLIT (one head's BLOCK_H lo columns + their hi partners). Small M streams the weight (33 MB for Dream, 100
# MB for LLaDA): narrow SPLIT blocks (Dream: 36 heads x 4 blocks of 16 = 144 programs) and deep pipelines;
# BLOCK_M 64 pads the tokens to one warpgroup MMA. Medium M is still mostly weight traffic: enough programs
# for every SM. Large M is compute bound: 128 x 256 tiles (two heads) with grouped ordering so a group of row
# tiles shares each weight slice in L2; one-head, 64-row and SPLIT tiles trade tile efficiency for a fuller
# last wave (Dream at 1000 tokens: 144 two-head tiles on 132 SMs). 128 x 128 tiles on one warpgroup with five
# or six stages: the best at LLaDA's 128 tokens (benchmarks/probe_splitk.py, probe_fused_schedules.py).
_CUDA_CANDIDATES = {
    "small": [(bm, 1, bh, 128, s, 4) for bm in (16, 32, 64) for bh, s in ((16, 6), (32, 5), (64, 4))],
    "medium": [(64, 1, 16, 128, 5, 4), (64, 1, 32, 128, 4, 4), (64, 1, 64, 64, 4, 4), (64, 2, 64, 64, 3, 4),
               (128, 1, 32, 64, 4, 8), (128, 1, 64, 64, 4, 8), (128, 2, 64, 64, 3, 8), (128, 1, 64, 64, 5, 4),
               (128, 1, 64, 64, 6, 4)],
    "large": [(128, 2, 64, 64, 3, 8), (128, 2, 64, 64, 4, 8), (128, 1, 64, 64, 4, 8), (128, 1, 64, 128, 3, 8),
              (128, 1, 32, 64, 4, 8), (64, 2, 64, 64, 4, 4), (64, 1, 64, 64, 4, 4), (128, 1, 64, 64, 4, 4)],
}

# Interpreter: one config runs (multi-config autotuning needs a driver); tests swap in the others.
INTERPRETER_CONFIGS = {
    "wide1": _config(32, 1, 64, 64, 1, 4),
    "wide2": _config(64, 2, 64, 32, 1, 4),
    "split": _config(16, 1, 16, 64, 1, 4),
}


def _configs() -> list:
    if interpreting():
        return [INTERPRETER_CONFIGS["wide2"]]
    return size_class_configs(_CUDA_CANDIDATES, _config)


# small M: BLOCK_M == bucket, or one 64-row warpgroup MMA
_prune_configs = size_class_pruner(lambda bucket: (bucket, 64))


@triton.autotune(configs=_configs(), key=["M_BUCKET", "d_model", "n_qkv_heads"],
                 prune_configs_by={"early_config_prune": _prune_configs}, do_bench=gpu_time_ms)
@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qkv_rope_cache_tma_kernel(
    x_desc, w_desc, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads,
    stride_cos, stride_sin, stride_q, stride_kc, stride_vc,
    M_BUCKET,
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
    pid_m, pid_n = _grouped_tile(tl.program_id(0), n_tokens, n_col_tiles, BLOCK_M, 1, GROUP_M)
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


@triton.jit
def wide_mainloop(x_desc, w_desc, off_m, w_row, k_begin, k_end, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 x[off_m:+BLOCK_M, k] @ W[w_row:+BLOCK_N, k]^T summed over k in [k_begin, k_end) step BLOCK_K:
    one [BLOCK_N, BLOCK_K] weight tile and one dot as wide as the tile per K step."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        a = x_desc.load([off_m, k])
        w = w_desc.load([w_row, k])
        if UPCAST:  # the interpreter multiplies bf16 bit patterns; do its math in fp32
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w.T, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def head_halves(acc, h: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HEADS: tl.constexpr):
    """Columns [0, Dh/2) and [Dh/2, Dh) (lo, hi) of head h of a [BLOCK_M, HEADS*Dh] accumulator of whole heads:
    reshape/permute/split, register renaming on sm90 (no data movement)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    if HEADS == 1:
        # column s*Dh/2 + d -> (d, s): the pair axis last, so split hands back lo (s=0) and hi (s=1)
        lo, hi = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, HALF]), (0, 2, 1)))
    else:
        # column h*Dh + s*Dh/2 + d -> (d, s, h): split off the head, then the half
        acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, 2, HALF]), (0, 3, 2, 1)))
        if h == 0:
            lo, hi = tl.split(acc0)
        else:
            lo, hi = tl.split(acc1)
    return lo, hi


@triton.jit
def wide_epilogue(acc, head0, off_m, ctx, HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                  HEADS: tl.constexpr):
    """Epilogue of a [BLOCK_M, HEADS*Dh] accumulator of whole heads head0.. (one head at a time keeps the
    epilogue's live registers to one head's worth)."""
    for h in tl.static_range(HEADS):
        lo, hi = head_halves(acc, h, HEAD_DIM, BLOCK_M, HEADS)
        epilogue(lo, hi, head0 + h, off_m, 0, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M, HEAD_DIM // 2)


@triton.jit
def epilogue(lo, hi, head, off_m, d0, ctx, HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_H: tl.constexpr):
    """Bias, RoPE (q and k heads) and the store of one head's [BLOCK_M, BLOCK_H] lo/hi column blocks (tokens
    off_m.., lo columns d0.. of the head).

    The head is a scalar, so exactly one of the q / k / v stores is issued (none past the last head).
    """
    (n_tokens, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
     n_heads, n_kv_heads, n_qkv_heads, stride_cos, stride_sin, stride_q, stride_kc, stride_vc) = ctx
    HALF: tl.constexpr = HEAD_DIM // 2
    offs_m = off_m + tl.arange(0, BLOCK_M)
    m_ok = offs_m < n_tokens
    offs_d = d0 + tl.arange(0, BLOCK_H)
    kv_first = n_heads + n_kv_heads  # first v head in the stacked order q | k | v
    col = head * HEAD_DIM + offs_d  # packed qkv column (= weight row) of the lo half
    if HAS_BIAS:
        # == (head < n_qkv_heads) for every column (offs_d + HALF < Dh), as a vector: Triton 3.9's interpreter
        # rejects a scalar mask broadcast over a load
        bias_ok = col < n_qkv_heads * HEAD_DIM
        lo += tl.load(b_ptr + col, mask=bias_ok, other=0.0).to(tl.float32)[None, :]
        hi += tl.load(b_ptr + col + HALF, mask=bias_ok, other=0.0).to(tl.float32)[None, :]
    if head < kv_first:  # q or k: rotate
        pos = tl.load(pos_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
        cos = tl.load(cos_ptr + pos[:, None] * stride_cos + offs_d[None, :])
        sin = tl.load(sin_ptr + pos[:, None] * stride_sin + offs_d[None, :])
        lo, hi = lo * cos - hi * sin, hi * cos + lo * sin
    rows_ok = m_ok[:, None]
    if head < n_heads:
        _store_halves(q_ptr, offs_m.to(tl.int64) * stride_q, col, lo, hi, rows_ok, HALF)
    elif head < kv_first:
        cache_row = tl.load(rows_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
        _store_halves(k_cache_ptr, cache_row * stride_kc, col - n_heads * HEAD_DIM, lo, hi, rows_ok, HALF)
    elif head < n_qkv_heads:
        cache_row = tl.load(rows_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
        _store_halves(v_cache_ptr, cache_row * stride_vc, col - kv_first * HEAD_DIM, lo, hi, rows_ok, HALF)


def launch_tma(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache, n_heads, n_kv_heads):
    """Run the TMA kernel (inputs already checked by the dispatcher; x and w_qkv TMA-compatible)."""
    n_tokens, d_model = x.shape
    n_qkv_heads = n_heads + 2 * n_kv_heads
    x_desc = TensorDescriptor.from_tensor(x, [1, 1])  # placeholder block shapes: the config pre_hook sets them
    w_desc = TensorDescriptor.from_tensor(w_qkv, [1, 1])

    def grid(meta):
        col_tiles = triton.cdiv(n_qkv_heads, meta["HEADS"]) * (TMA_HEAD_DIM // 2 // meta["BLOCK_H"])
        return (triton.cdiv(n_tokens, meta["BLOCK_M"]) * col_tiles,)

    _fused_qkv_rope_cache_tma_kernel[grid](
        x_desc, w_desc, b_qkv if b_qkv is not None else w_qkv, cos, sin, positions, cache_rows, q, k_cache,
        v_cache, n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads,
        cos.stride(0), sin.stride(0), q.stride(0), k_cache.stride(0), v_cache.stride(0),
        m_bucket(n_tokens),
        HEAD_DIM=TMA_HEAD_DIM, HAS_BIAS=b_qkv is not None, UPCAST=interpreting(),
        DOT_PRECISION="ieee" if x.dtype.itemsize == 4 else "tf32",
    )
    return q
