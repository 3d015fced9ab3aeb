"""Triton kernel behind `split_k_linear` (contract: split_k_linear.py).

A skinny GEMM for the few rows of a decode step, where the cost is streaming the weight, not the multiplies:
one program owns BLOCK_N output columns (weight rows) over one of the S ranges of K and writes its fp32
partial; nothing is summed here (the norm that consumes the projection sums the S partials in a fixed order,
so the result is deterministic and needs no atomics or second pass). The weight tile is the MMA's M side and
the tokens its N side ("swap AB"), so a step of 16-48 rows is not padded to a 64-row MMA.

The weight is read through a tensor descriptor (TMA) on Hopper and through pointers elsewhere; x, a few
hundred KB that every program reads from L2, always through pointers, so a launcher is bound to its weight and
row count only, not to the x buffer of a call (an eager step allocates a new one every layer).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import interpreting
from ._fused_qkv_common import dot_precision, make_descriptor

SHARED_MEMORY_BUDGET = 200 * 1024  # bytes of pipelined tiles a config may ask for (sm_90 has 228 KB per SM)


@dataclass(frozen=True)
class SplitKConfig:
    """One launch shape. block_m covers the call's rows in one tile (a power of two, 16 .. 256)."""

    block_m: int
    block_n: int
    block_k: int
    splits: int
    stages: int
    warps: int
    tma: bool

    def shared_memory(self) -> int:
        return self.stages * (self.block_n + self.block_m) * self.block_k * 2

    def k_per_split(self, d_in: int) -> int:
        """K range of one split, a multiple of block_k so that no tile straddles two splits."""
        return triton.cdiv(triton.cdiv(d_in, self.splits), self.block_k) * self.block_k


def block_m_for(n_tokens: int) -> int:
    return max(16, triton.next_power_of_2(max(n_tokens, 1)))


def default_configs(n_tokens: int, tma: bool) -> tuple[SplitKConfig, ...]:
    """What the selector times for a call of n_tokens rows: the fastest shapes of benchmarks/probe_skinny_gemm.py
    on an H200 at 48 and 128 rows (2026-12-07), and their neighbours in tile width, depth and split count."""
    block_m = block_m_for(n_tokens)
    shapes = ((64, 128, 2, 4, 4), (128, 128, 4, 4, 4), (64, 128, 4, 4, 4), (128, 64, 2, 4, 4), (64, 64, 2, 6, 4),
              (128, 64, 4, 4, 8), (64, 256, 2, 3, 4))
    configs = []
    for block_n, block_k, splits, stages, warps in shapes:
        config = SplitKConfig(block_m, block_n, block_k, splits, stages, warps, tma)
        while config.shared_memory() > SHARED_MEMORY_BUDGET and config.block_k > 32:
            config = SplitKConfig(block_m, block_n, config.block_k // 2, splits, stages, warps, tma)
        if config.shared_memory() <= SHARED_MEMORY_BUDGET and config not in configs:
            configs.append(config)
    return tuple(configs)


@triton.jit(do_not_specialize=["n_tokens"])
def _split_k_linear_kernel(x_ptr, w_ptr, w_desc, parts_ptr, n_tokens, d_out, d_in, k_per_split,
                           stride_x, stride_w,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                           TMA: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    pid_m = tl.program_id(2)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, d_in)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in tl.range(k_begin, k_end, BLOCK_K, num_stages=STAGES):
        k_in = (k + ks)[None, :] < d_in  # ranges are block_k aligned, so only the end of K cuts a tile
        if TMA:  # out-of-range weight rows and columns arrive as zeros
            w = w_desc.load([pid_n * BLOCK_N, k])
        else:
            w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + (k + ks)[None, :],
                        mask=(cols[:, None] < d_out) & k_in, other=0.0)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + (k + ks)[None, :],
                    mask=(rows[:, None] < n_tokens) & k_in, other=0.0)
        if UPCAST:  # the interpreter multiplies bf16 bit patterns; do its math in fp32
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, x.T, acc, input_precision=DOT_PRECISION)
    offsets = (split * n_tokens + rows[None, :]).to(tl.int64) * d_out + cols[:, None]
    tl.store(parts_ptr + offsets, acc, mask=(rows[None, :] < n_tokens) & (cols[:, None] < d_out))


class SplitKLauncher:
    """The kernel bound to one config, one weight and one x shape and row stride: grid, constexprs and the
    weight's descriptor made once, so a call only allocates its output and launches (capturable in a CUDA
    graph). The weight passed to a call must be the bound one (the descriptor holds it)."""

    def __init__(self, config: SplitKConfig, x: torch.Tensor, weight: torch.Tensor):
        self.config = config
        n_tokens, d_in = x.shape
        d_out = weight.shape[0]
        self.parts_shape = (config.splits, n_tokens, d_out)
        self.sizes = (n_tokens, d_out, d_in, config.k_per_split(d_in), x.stride(0), weight.stride(0))
        self.grid = (triton.cdiv(d_out, config.block_n), config.splits, triton.cdiv(n_tokens, config.block_m))
        self.w_desc = make_descriptor(weight, [config.block_n, config.block_k]) if config.tma else None
        self.meta = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                     "STAGES": config.stages, "TMA": config.tma, "UPCAST": interpreting(),
                     "DOT_PRECISION": dot_precision(x.dtype), "num_warps": config.warps}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        parts = torch.empty(self.parts_shape, device=x.device, dtype=torch.float32) if out is None else out
        _split_k_linear_kernel[self.grid](x, weight, self.w_desc, parts, *self.sizes, **self.meta)
        return parts


def split_k_linear_triton(x: torch.Tensor, weight: torch.Tensor, config: SplitKConfig) -> torch.Tensor:
    """One unbound call (tests, the dispatcher): builds the launcher, then launches."""
    return SplitKLauncher(config, x, weight)(x, weight)
