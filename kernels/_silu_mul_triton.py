"""Triton kernel behind `silu_mul` (contract: see silu_mul.py).

Grid = (rows, column blocks of BLOCK_F). Each program reads BLOCK_F gate values and the matching up values
of one row and writes BLOCK_F outputs: pure streaming, 3 bytes moved per output byte.

Bitwise agreement with torch's `F.silu(gate) * up` on CUDA: torch's silu is x / (1 + expf(-x)) in fp32 with
CUDA's full-precision expf and an IEEE division, rounded to the dtype; its multiply rounds the exact fp32
product once. Triton's tl.exp is the fast ex2-based approximation, so the kernel calls libdevice's expf
(the CUDA math library's own code) and div_rn instead. The interpreter cannot call libdevice; there exp is
numpy's fp64 exp rounded to fp32 (see the contract for what that costs). Fp fusion is off so that `1 + exp`
stays an add of the rounded exp, as in torch (libdevice's expf is written with explicit FMAs, so it compiles
the same either way).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import interpreting
from ._add_rms_norm_triton import round_to_storage

_INTERPRETED = interpreting()
_MAX_BLOCK_F = 1024  # 8 bf16 values (one 16-byte load) per thread per operand at 4 warps


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr, act_ptr, stride_gate_up, stride_act,
    F: tl.constexpr, BLOCK_F: tl.constexpr, LIBDEVICE_EXP: tl.constexpr, ROUND_BF16_BY_BITS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # N * 2F passes 2^31 at prefill sizes
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    in_bounds = cols < F
    gate_ptrs = gate_up_ptr + row * stride_gate_up + cols
    gate = tl.load(gate_ptrs, mask=in_bounds, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + F, mask=in_bounds, other=0.0)
    if LIBDEVICE_EXP:
        exp_neg = libdevice.exp(-gate)
    else:  # numpy's fp32 exp is off by up to ~2.4 ulp; its fp64 exp rounded once is torch CPU's within an ulp
        exp_neg = tl.exp((-gate).to(tl.float64)).to(tl.float32)
    silu = tl.math.div_rn(gate, 1.0 + exp_neg)
    silu = round_to_storage(silu, act_ptr.dtype.element_ty, ROUND_BF16_BY_BITS).to(tl.float32)
    act = round_to_storage(silu * up.to(tl.float32), act_ptr.dtype.element_ty, ROUND_BF16_BY_BITS)
    tl.store(act_ptr + row * stride_act + cols, act, mask=in_bounds)


@dataclass(frozen=True)
class SiluMulLaunch:
    """Compile-time shape of the launch for one MLP width F (fixed per model, so built once per width)."""

    block_f: int
    column_blocks: int
    num_warps: int


@functools.lru_cache(maxsize=None)
def silu_mul_launch(f: int) -> SiluMulLaunch:
    block_f = min(_MAX_BLOCK_F, triton.next_power_of_2(f))
    return SiluMulLaunch(block_f=block_f, column_blocks=triton.cdiv(f, block_f), num_warps=4 if block_f >= 512 else 1)


def silu_mul_triton(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the fused kernel; inputs must satisfy the contract (nothing is checked here)."""
    n_rows, f = gate_up.shape[0], gate_up.shape[1] // 2
    act = gate_up.new_empty((n_rows, f)) if out is None else out
    if n_rows == 0 or f == 0:
        return act
    launch = silu_mul_launch(f)
    _silu_mul_kernel[(n_rows, launch.column_blocks)](
        gate_up, act, gate_up.stride(0), act.stride(0),
        F=f, BLOCK_F=launch.block_f, LIBDEVICE_EXP=not _INTERPRETED, ROUND_BF16_BY_BITS=_INTERPRETED,
        num_warps=launch.num_warps, enable_fp_fusion=False,
    )
    return act
