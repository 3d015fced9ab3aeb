"""Triton kernel behind `add_rms_norm` (contract: see add_rms_norm.py).

One program owns ROWS whole rows (ROWS = 1 at model widths), so the row sum needs no cross-program step and
an in-place residual write can never race: every element is read before its program writes it back. With a
row index (HAS_ROWS) output row i is computed from input row rows[i]; the outputs are then separate tensors.

Bitwise agreement with torch's unfused sequence rests on doing the same fp32 operations in the same order:
  * squares rounded before they are summed, and the mean rounded before eps is added, so the kernel is
    compiled with fp fusion off (with it, LLVM folds x*x into the reduction's adds and mean + eps into an FMA);
  * mean = sum * fl32(1/D) on CUDA (torch's CUDA MeanOps multiplies by that factor), sum / D in the
    interpreter (torch's CPU mean divides);
  * rsqrt as its own step (CUDA rsqrtf and Triton's rsqrt are the same approximate instruction; the
    interpreter's 1/sqrt is numpy's, like torch's CPU rsqrt), then (x * r) * w, rounded once.
Only the order in which the squares are summed differs from torch's (see the contract).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import interpreting

# The interpreter converts fp32 -> bf16 by truncation; rounding on the bits there keeps interpreted tests
# bit-comparable with torch. Compiled kernels use the hardware's round-to-nearest-even conversion.
_INTERPRETED = interpreting()
_ROW_TILE_ELEMENTS = 2048  # narrow rows are packed ROWS to a program up to this many elements


@triton.jit
def round_to_storage(x, dtype: tl.constexpr, ROUND_BF16_BY_BITS: tl.constexpr):
    """x (fp32) rounded to nearest-even in `dtype`, as torch's `.to(dtype)` rounds."""
    if ROUND_BF16_BY_BITS and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)  # carries into the kept half exactly when RNE rounds up
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        result = tl.where(x != x, x.to(tl.bfloat16), rounded)  # NaN must not carry into the sign bit
    else:
        result = x.to(dtype)
    return result


@triton.jit(do_not_specialize=["n_rows"])  # the step's token count changes every call; one compile serves all
def _add_rms_norm_kernel(
    residual_ptr, update_ptr, weight_ptr, new_residual_ptr, normed_ptr, rows_ptr,
    n_rows, stride_residual, stride_update, stride_part, stride_new_residual, stride_normed, inv_d, eps,
    D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, HAS_UPDATE: tl.constexpr, PARTS: tl.constexpr,
    HAS_ROWS: tl.constexpr,
    MEAN_TIMES_RECIPROCAL: tl.constexpr, ROUND_BF16_BY_BITS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # output rows
    cols = tl.arange(0, BLOCK_D)
    in_bounds = (rows < n_rows)[:, None] & (cols < D)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    if HAS_ROWS:
        source64 = tl.load(rows_ptr + rows, mask=rows < n_rows, other=0)[:, None]
    else:
        source64 = rows64
    x = tl.load(residual_ptr + source64 * stride_residual + cols[None, :], mask=in_bounds, other=0.0)
    if HAS_UPDATE:
        u = tl.load(update_ptr + source64 * stride_update + cols[None, :], mask=in_bounds, other=0.0)
        if PARTS > 0:  # fp32 split-K partials: summed in order, rounded once as the projection's output would be
            for part in tl.static_range(1, PARTS):
                u += tl.load(update_ptr + tl.cast(stride_part, tl.int64) * part + source64 * stride_update + cols[None, :],
                             mask=in_bounds, other=0.0)
            u = round_to_storage(u, new_residual_ptr.dtype.element_ty, ROUND_BF16_BY_BITS)
        new_residual = round_to_storage(x.to(tl.float32) + u.to(tl.float32), new_residual_ptr.dtype.element_ty,
                                        ROUND_BF16_BY_BITS)
        tl.store(new_residual_ptr + rows64 * stride_new_residual + cols[None, :], new_residual, mask=in_bounds)
        x = new_residual  # the norm reads the rounded sum, as torch's second kernel does
    elif HAS_ROWS:  # the gathered rows are the new residual
        tl.store(new_residual_ptr + rows64 * stride_new_residual + cols[None, :], x, mask=in_bounds)
    x = x.to(tl.float32)

    sum_squares = tl.sum(x * x, axis=1)  # padding lanes load 0 and add nothing
    if MEAN_TIMES_RECIPROCAL:
        mean = sum_squares * inv_d
    else:
        mean = tl.math.div_rn(sum_squares, tl.full([ROWS], D, tl.float32))
    row_factor = tl.math.rsqrt(mean + eps)
    w = tl.load(weight_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    normed = (x * row_factor[:, None]) * w[None, :]
    normed = round_to_storage(normed, normed_ptr.dtype.element_ty, ROUND_BF16_BY_BITS)
    tl.store(normed_ptr + rows64 * stride_normed + cols[None, :], normed, mask=in_bounds)


@dataclass(frozen=True)
class NormLaunch:
    """Compile-time shape of the launch for one row width D (fixed per model, so built once per width)."""

    block_d: int  # D rounded up to a power of two
    rows_per_program: int
    num_warps: int
    inv_d: float  # fl32(1/D), the factor torch's CUDA mean multiplies by


@functools.lru_cache(maxsize=None)
def norm_launch(d: int) -> NormLaunch:
    block_d = triton.next_power_of_2(d)
    rows = max(1, _ROW_TILE_ELEMENTS // block_d)
    # ~8-16 fp32 values per thread: whole 4096/8192 rows stay in registers without spilling
    num_warps = min(16, max(1, rows * block_d // 512))
    inv_d = (torch.ones((), dtype=torch.float32) / d).item()  # fp32 division, exactly as torch forms it
    return NormLaunch(block_d=block_d, rows_per_program=rows, num_warps=num_warps, inv_d=inv_d)


def add_rms_norm_triton(residual, update, weight, eps: float, out=None, inplace: bool = False, rows=None):
    """Launch the fused kernel; inputs must satisfy the contract (nothing is checked here)."""
    n_rows, d = residual.shape
    launch = norm_launch(d)
    if rows is not None:
        n_rows = rows.shape[0]
        new_residual = residual.new_empty((n_rows, d))
    else:
        new_residual = residual if (inplace or update is None) else torch.empty_like(residual)
    normed = torch.empty_like(new_residual) if out is None else out
    if n_rows == 0:
        return new_residual, normed
    has_update = update is not None
    update = update if has_update else residual  # never read
    parts = update.shape[0] if update.dim() == 3 else 0
    stride_part = update.stride(0) if parts else 0
    stride_update = update.stride(-2)
    _add_rms_norm_kernel[(triton.cdiv(n_rows, launch.rows_per_program),)](
        residual, update, weight, new_residual, normed, rows if rows is not None else residual,
        n_rows, residual.stride(0), stride_update, stride_part, new_residual.stride(0), normed.stride(0),
        launch.inv_d, eps, D=d, BLOCK_D=launch.block_d, ROWS=launch.rows_per_program, HAS_UPDATE=has_update,
        PARTS=parts,
        HAS_ROWS=rows is not None,
        MEAN_TIMES_RECIPROCAL=not _INTERPRETED, ROUND_BF16_BY_BITS=_INTERPRETED,
        num_warps=launch.num_warps, enable_fp_fusion=False,
    )
    return new_residual, normed
