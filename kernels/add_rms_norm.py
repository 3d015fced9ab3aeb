"""Residual add + RMSNorm in one pass (the pre-attention and pre-MLP norms of a decoder layer).

Contract (shared by the reference and the Triton kernel):
    residual  [N, D]  the hidden stream h (bf16/fp16/fp32), last dimension contiguous
    update    [N, D] in residual's dtype, or None (then the op is a plain RMSNorm of residual), or [P, N, D]
              float32 partial sums (a split-K projection's parts, see split_k_linear.py): the update is then
              their sum in order p = 0..P-1 in fp32, rounded once to residual's dtype (as a GEMM's output is)
    weight    [D]     the norm's gain, any float dtype (read as fp32)
    eps       float
Returns (new_residual, normed), both [N, D] in residual's dtype:
    new_residual = residual + update, rounded once to residual's dtype (the torch expression `residual + update`)
    normed       = RMSNorm(new_residual), from the *rounded* new_residual, exactly the engine's formula:
                   xf = new_residual.float(); r = rsqrt(mean(xf * xf) + eps)  (one fp32 factor per row)
                   normed = ((xf * r) * weight.float()).to(dtype)             (one rounding at the end)
inplace=True writes new_residual into `residual` itself and returns it (the engine keeps h in a preallocated
buffer); out= receives normed. update=None leaves residual untouched and returns it as new_residual.
`out` must not overlap residual or update.
rows      [R] int64 indices into residual's rows, or None. Given, the op reads only those rows (any order,
          repeats allowed: a gather, as `residual.index_select(0, rows)` and the same of update) and both results
          are new [R, D] tensors (the engine's final norm, over the few rows the LM head reads). Not with inplace.

Exactness: new_residual is bit-exact. normed is bit-exact given the row factor r; r itself can differ from
torch's by an fp32 ulp or two, because torch and the kernel sum the squares in different orders (no
reduction order is reproducible across torch versions and devices). The mean divides by D on the CPU and
multiplies by the fp32 reciprocal on CUDA, as torch's own mean does on each device.
"""
from __future__ import annotations

import torch

from . import bind_backend

MAX_PARTS = 16  # split-K partials the kernel sums (an unrolled loop)
MAX_TRITON_WIDTH = 8192  # one program holds whole rows in registers; wider rows would spill
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The engine's RMSNorm formula: fp32 inside, one rounding to x's dtype at the end."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def sum_parts_reference(parts: torch.Tensor) -> torch.Tensor:
    """parts[0] + parts[1] + ... in that order, in fp32 (the kernel's order)."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total


def add_rms_norm_reference(
    residual: torch.Tensor,
    update: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    inplace: bool = False,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused torch sequence: the rows gathered (if asked), `residual + update` (or `add_`), then the
    RMSNorm formula."""
    if update is not None and update.dim() == 3:
        update = sum_parts_reference(update).to(residual.dtype)
    if rows is not None:
        residual = residual.index_select(0, rows)
        update = update.index_select(0, rows) if update is not None else None
    if update is None:
        new_residual = residual
    elif inplace:
        new_residual = residual.add_(update)
    else:
        new_residual = residual + update
    normed = rms_norm_reference(new_residual, weight, eps)
    if out is not None:
        normed = out.copy_(normed)
    return new_residual, normed


def check_add_rms_norm_inputs(residual, update, weight, out, backend: str, inplace: bool = False,
                              rows: torch.Tensor | None = None) -> None:
    """The contract's shape/dtype/layout rules; raises ValueError. Run by the dispatcher, not by AddRMSNorm
    (the row range check reads the indices back to the host)."""
    if residual.dim() != 2 or residual.dtype not in _DTYPES:
        raise ValueError(f"residual must be [N, D] bf16/fp16/fp32, got {tuple(residual.shape)} {residual.dtype}")
    n, d = residual.shape
    if residual.stride(1) != 1:
        raise ValueError("residual must be contiguous in its last dimension")
    if update is not None and update.dim() == 3:
        if (update.shape[1:] != residual.shape or update.dtype != torch.float32 or update.stride(2) != 1
                or not 1 <= update.shape[0] <= MAX_PARTS):
            raise ValueError(f"update parts must be [P, {n}, {d}] float32 with 1 <= P <= {MAX_PARTS}, last "
                             f"dimension contiguous, got {tuple(update.shape)} {update.dtype}")
    elif update is not None and (update.shape != residual.shape or update.dtype != residual.dtype
                                 or update.stride(1) != 1):
        raise ValueError("update must match residual's shape and dtype, last dimension contiguous")
    if weight.shape != (d,) or not weight.is_floating_point():
        raise ValueError(f"weight must be a float [{d}] vector, got {tuple(weight.shape)} {weight.dtype}")
    if rows is not None:
        if rows.dim() != 1 or rows.dtype != torch.int64 or rows.device != residual.device:
            raise ValueError(f"rows must be a 1-D int64 tensor on {residual.device}, got {tuple(rows.shape)} "
                             f"{rows.dtype} on {rows.device}")
        if inplace:
            raise ValueError("rows (a gather into new tensors) cannot be combined with inplace")
        if rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < n):
            raise ValueError(f"rows must index residual's {n} rows, got {int(rows.min())}..{int(rows.max())}")
        n = rows.numel()
    if out is not None and (out.shape != (n, d) or out.dtype != residual.dtype or out.stride(1) != 1):
        raise ValueError("out must be [N, D] (N = len(rows) when given) in residual's dtype, last dimension "
                         "contiguous")
    if backend == "triton" and d > MAX_TRITON_WIDTH:
        raise ValueError(f"the Triton add_rms_norm handles rows up to {MAX_TRITON_WIDTH} wide, got {d}")


def _bind(backend: str):
    return bind_backend(backend, add_rms_norm_reference, "._add_rms_norm_triton", "add_rms_norm_triton")


def add_rms_norm(residual: torch.Tensor, update: torch.Tensor | None, weight: torch.Tensor, eps: float, *,
                 out: torch.Tensor | None = None, inplace: bool = False, rows: torch.Tensor | None = None,
                 backend: str = "torch") -> tuple[torch.Tensor, torch.Tensor]:
    """Checked dispatcher: "torch" runs the reference, "triton" the fused kernel (see module docstring)."""
    check_add_rms_norm_inputs(residual, update, weight, out, backend, inplace, rows)
    return _bind(backend)(residual, update, weight, eps, out, inplace, rows)


class AddRMSNorm:
    """add_rms_norm bound to one backend at construction. A call only launches: no checks, no environment
    reads, no imports, no host synchronisation, so a decode step built from it can be captured as a CUDA graph.
    Inputs must already satisfy the contract (check_add_rms_norm_inputs); the engine checks its buffers once."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = _bind(backend)

    def __call__(self, residual: torch.Tensor, update: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None, inplace: bool = False,
                 rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._run(residual, update, weight, eps, out, inplace, rows)
