"""What the three fused QKV kernels share (contract: fused_qkv_rope_cache.py): the problem a launcher is bound
to, the token-count bucket and size-class config lists, tensor descriptors, the grouped tile order, and the
TMA kernels' scalar-head epilogue.

Imports nothing of its siblings: _fused_qkv_pointer / _tma / _streamk import from here, _fused_qkv_select
imports all of them, and nothing imports back up.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - triton without host tensor descriptors
    TensorDescriptor = None

MAX_M_BUCKET = 4096
TMA_HEAD_DIM = 128  # the only head dim the TMA kernels compile for (LLaDA-8B and Dream-7B)


def tma_available() -> bool:
    """Whether this triton install has host-side tensor descriptors."""
    return TensorDescriptor is not None


def m_bucket(n_tokens: int) -> int:
    """Power-of-two bucket of the token count (16 .. 4096): what a tuned choice is keyed on."""
    return min(MAX_M_BUCKET, max(16, 1 << max(n_tokens - 1, 0).bit_length()))


def size_class(bucket: int) -> str:
    return "small" if bucket <= 32 else "medium" if bucket <= 256 else "large"


def configs_for_bucket(candidates: dict, bucket: int, small_block_ms: tuple[int, ...]) -> tuple:
    """The candidate configs of the bucket's size class ({size class: [config]}, each with .block_m): small M
    keeps BLOCK_M in small_block_ms, larger classes every BLOCK_M <= bucket (bigger row tiles would be mostly
    padding)."""
    wanted = size_class(bucket)

    def fits(block_m: int) -> bool:
        return block_m in small_block_ms if wanted == "small" else block_m <= bucket

    rows = candidates[wanted]
    return tuple(c for c in rows if fits(c.block_m)) or tuple(rows[:1])


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots (the tests' 1e-5 tolerance); 16-bit inputs the tensor cores."""
    return "ieee" if dtype.itemsize == 4 else "tf32"


@dataclass(frozen=True)
class FusedQKVProblem:
    """One call's geometry, everything a launcher's grid and constexprs depend on."""

    n_tokens: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    has_bias: bool
    device: torch.device

    @property
    def n_qkv_heads(self) -> int:
        return self.n_heads + 2 * self.n_kv_heads

    @property
    def q_shape(self) -> tuple[int, int]:
        return (self.n_tokens, self.n_heads * self.head_dim)


@dataclass
class FusedQKVCounters:
    """How often the slow steps ran (process-wide): a steady call of a bound op adds to none of them."""

    resolutions: int = 0  # path and config chosen for a (forcing, request, problem key)
    measurements: int = 0  # timed launches (config tuning and auto's path measurement)
    stored_choices_read: int = 0  # resolutions answered by a choice an earlier process timed (no measurement)
    launchers_built: int = 0  # launchers bound to a problem and buffers (grid, constexprs, descriptors)
    descriptors_built: int = 0  # TMA tensor descriptors
    rejected: int = 0  # candidates whose outputs did not match the reference on the tuned call (not timed)


COUNTERS = FusedQKVCounters()


def make_descriptor(tensor: torch.Tensor, block_shape: list[int]):
    """A host tensor descriptor of a 2-D tensor (it keeps the tensor alive while a launcher holds it)."""
    COUNTERS.descriptors_built += 1
    return TensorDescriptor.from_tensor(tensor, block_shape)


# ---- device code shared by the kernels ----------------------------------------------------------------------

@triton.jit
def store_halves(base_ptr, row_offsets, col_offsets, lo, hi, mask, HALF: tl.constexpr):
    ptrs = base_ptr + row_offsets[:, None] + col_offsets[None, :]
    tl.store(ptrs, lo.to(base_ptr.dtype.element_ty), mask=mask)
    tl.store(ptrs + HALF, hi.to(base_ptr.dtype.element_ty), mask=mask)


@triton.jit
def grouped_tile(pid, n_tokens, n_pairs, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (row tile, pair tile), walking GROUP_M row tiles per pair tile for L2 reuse of weights."""
    tiles_m = tl.cdiv(n_tokens, BLOCK_M)
    tiles_p = tl.cdiv(n_pairs, BLOCK_P)
    per_group = GROUP_M * tiles_p
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_p = (pid % per_group) // group_rows
    return pid_m, pid_p


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
        store_halves(q_ptr, offs_m.to(tl.int64) * stride_q, col, lo, hi, rows_ok, HALF)
    elif head < kv_first:
        cache_row = tl.load(rows_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
        store_halves(k_cache_ptr, cache_row * stride_kc, col - n_heads * HEAD_DIM, lo, hi, rows_ok, HALF)
    elif head < n_qkv_heads:
        cache_row = tl.load(rows_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
        store_halves(v_cache_ptr, cache_row * stride_vc, col - kv_first * HEAD_DIM, lo, hi, rows_ok, HALF)
