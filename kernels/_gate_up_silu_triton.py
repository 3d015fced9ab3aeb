"""Triton kernel behind `gate_up_silu` (contract: gate_up_silu.py).

The MLP's first half for the few rows of a decode step: one program owns BLOCK_N columns of the activation,
streams the matching gate rows and up rows of the stacked weight over all of K (two accumulators sharing each
x tile), and applies silu(gate) * up in its epilogue, so the [M, 2F] gate/up product never goes to memory and
no separate activation kernel runs. As in the split-K kernel, the weight tile is the MMA's M side and the
tokens its N side ("swap AB"), so 16-48 rows are not padded to a 64-row MMA. K is not split: the activation
is not linear, so partial sums could not be left for a later kernel to add.

The weight may be stored as a checkpoint holds it ([2F, K] rows) or transposed ([K, 2F] storage, what the
engine keeps on Hopper for cuBLAS); on Hopper it is read through a tensor descriptor over its storage, elsewhere
through pointers. x (a few hundred KB that every program reads from L2) always goes through pointers, so a
launcher is bound to a weight and a row count, not to the x buffer of a call.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import interpreting
from ._add_rms_norm_triton import round_to_storage
from ._fused_qkv_common import dot_precision, make_descriptor

SHARED_MEMORY_BUDGET = 200 * 1024  # bytes of pipelined tiles a config may ask for (sm_90 has 228 KB per SM)


@dataclass(frozen=True)
class GateUpConfig:
    """One launch shape. block_m covers the call's rows in one tile (a power of two, 16 .. 256); block_n is the
    activation columns of a program (it streams 2 * block_n weight rows)."""

    block_m: int
    block_n: int
    block_k: int
    stages: int
    warps: int
    tma: bool

    def shared_memory(self) -> int:
        return self.stages * (2 * self.block_n + self.block_m) * self.block_k * 2


def block_m_for(n_tokens: int) -> int:
    return max(16, triton.next_power_of_2(max(n_tokens, 1)))


def default_configs(n_tokens: int, tma: bool) -> tuple[GateUpConfig, ...]:
    """What the selector times: tile widths from 32 to 128 activation columns (LLaDA-8B's F = 12288 gives 384 to
    96 programs on 132 SMs), pipeline depths and warps around the split-K kernel's best shapes."""
    block_m = block_m_for(n_tokens)
    shapes = ((64, 128, 4, 4), (32, 128, 4, 4), (64, 64, 6, 4), (128, 64, 4, 8), (64, 128, 3, 8), (32, 256, 3, 4))
    configs = []
    for block_n, block_k, stages, warps in shapes:
        config = GateUpConfig(block_m, block_n, block_k, stages, warps, tma)
        while config.shared_memory() > SHARED_MEMORY_BUDGET and config.block_k > 32:
            config = GateUpConfig(block_m, block_n, config.block_k // 2, stages, warps, tma)
        if config.shared_memory() <= SHARED_MEMORY_BUDGET and config not in configs:
            configs.append(config)
    return tuple(configs)


@triton.jit
def _load_weight_tile(w_ptr, w_desc, first_row, cols, k, ks, d_rows, d_in, stride_wn, stride_wk,
                      BLOCK_N: tl.constexpr, TMA: tl.constexpr, KN_STORAGE: tl.constexpr):
    """[BLOCK_N, BLOCK_K] of the logical [2F, K] weight: rows first_row + cols, columns k + ks."""
    if TMA:  # out-of-range rows and columns arrive as zeros
        if KN_STORAGE:
            tile = w_desc.load([k, first_row]).T
        else:
            tile = w_desc.load([first_row, k])
    else:
        rows = first_row + cols
        mask = (rows[:, None] < d_rows) & ((k + ks)[None, :] < d_in)
        tile = tl.load(w_ptr + rows[:, None].to(tl.int64) * stride_wn + (k + ks)[None, :].to(tl.int64) * stride_wk,
                       mask=mask, other=0.0)
    return tile


@triton.jit
def _silu_times(gate, up, dtype: tl.constexpr, LIBDEVICE_EXP: tl.constexpr, ROUND_BF16_BY_BITS: tl.constexpr):
    """silu(gate) * up with the roundings of the unfused pipeline: gate and up rounded to the dtype (as the
    GEMM stores them), then silu_mul's own (see silu_mul.py)."""
    gate = round_to_storage(gate, dtype, ROUND_BF16_BY_BITS).to(tl.float32)
    up = round_to_storage(up, dtype, ROUND_BF16_BY_BITS).to(tl.float32)
    if LIBDEVICE_EXP:
        exp_neg = libdevice.exp(-gate)
    else:
        exp_neg = tl.exp((-gate).to(tl.float64)).to(tl.float32)
    silu = round_to_storage(tl.math.div_rn(gate, 1.0 + exp_neg), dtype, ROUND_BF16_BY_BITS).to(tl.float32)
    return round_to_storage(silu * up, dtype, ROUND_BF16_BY_BITS)


@triton.jit(do_not_specialize=["n_tokens"])
def _gate_up_silu_kernel(x_ptr, w_ptr, w_desc, act_ptr, n_tokens, d_ff, d_in, stride_x, stride_wn, stride_wk,
                         stride_act,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                         TMA: tl.constexpr, KN_STORAGE: tl.constexpr, UPCAST: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, LIBDEVICE_EXP: tl.constexpr,
                         ROUND_BF16_BY_BITS: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    first = pid_n * BLOCK_N
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    acc_gate = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in tl.range(0, d_in, BLOCK_K, num_stages=STAGES):
        # a gate tile past F reads up rows: those columns are never stored
        gate = _load_weight_tile(w_ptr, w_desc, first, cols, k, ks, 2 * d_ff, d_in, stride_wn, stride_wk,
                                 BLOCK_N, TMA, KN_STORAGE)
        up = _load_weight_tile(w_ptr, w_desc, d_ff + first, cols, k, ks, 2 * d_ff, d_in, stride_wn, stride_wk,
                               BLOCK_N, TMA, KN_STORAGE)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + (k + ks)[None, :],
                    mask=(rows[:, None] < n_tokens) & ((k + ks)[None, :] < d_in), other=0.0)
        if UPCAST:  # the interpreter multiplies bf16 bit patterns; do its math in fp32
            gate, up, x = gate.to(tl.float32), up.to(tl.float32), x.to(tl.float32)
        acc_gate = tl.dot(gate, x.T, acc_gate, input_precision=DOT_PRECISION)
        acc_up = tl.dot(up, x.T, acc_up, input_precision=DOT_PRECISION)
    act = _silu_times(acc_gate, acc_up, act_ptr.dtype.element_ty, LIBDEVICE_EXP, ROUND_BF16_BY_BITS)
    out_cols = first + cols
    offsets = rows[None, :].to(tl.int64) * stride_act + out_cols[:, None]
    tl.store(act_ptr + offsets, act, mask=(rows[None, :] < n_tokens) & (out_cols[:, None] < d_ff))


def kn_storage(weight: torch.Tensor) -> bool:
    """Whether a [2F, K] weight is stored transposed ([K, 2F] in memory, unit stride along 2F)."""
    return weight.stride(0) == 1 and weight.shape[1] > 1


class GateUpLauncher:
    """The kernel bound to one config, one weight and one x shape and row stride: grid, constexprs and the
    weight's descriptor made once, so a call only allocates its output and launches (capturable in a CUDA
    graph). The weight passed to a call must be the bound one (the descriptor holds it)."""

    def __init__(self, config: GateUpConfig, x: torch.Tensor, weight: torch.Tensor):
        self.config = config
        n_tokens, d_in = x.shape
        d_ff = weight.shape[0] // 2
        transposed = kn_storage(weight)
        self.act_shape = (n_tokens, d_ff)
        self.sizes = (n_tokens, d_ff, d_in, x.stride(0), weight.stride(0), weight.stride(1))
        self.grid = (triton.cdiv(d_ff, config.block_n), triton.cdiv(n_tokens, config.block_m))
        self.w_desc = None
        if config.tma:
            storage = weight.t() if transposed else weight  # the [K, 2F] or [2F, K] tensor as laid out
            block = [config.block_k, config.block_n] if transposed else [config.block_n, config.block_k]
            self.w_desc = make_descriptor(storage, block)
        interpreted = interpreting()
        self.meta = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                     "STAGES": config.stages, "TMA": config.tma, "KN_STORAGE": transposed, "UPCAST": interpreted,
                     "DOT_PRECISION": dot_precision(x.dtype), "LIBDEVICE_EXP": not interpreted,
                     "ROUND_BF16_BY_BITS": interpreted, "num_warps": config.warps, "enable_fp_fusion": False}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        act = torch.empty(self.act_shape, device=x.device, dtype=x.dtype) if out is None else out
        _gate_up_silu_kernel[self.grid](x, weight, self.w_desc, act, *self.sizes, act.stride(0), **self.meta)
        return act


def gate_up_silu_triton(x: torch.Tensor, weight: torch.Tensor, config: GateUpConfig) -> torch.Tensor:
    """One unbound call (tests, the dispatcher): builds the launcher, then launches."""
    return GateUpLauncher(config, x, weight)(x, weight)
