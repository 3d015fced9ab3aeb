"""SwiGLU activation: silu(gate) * up in one pass over the gate/up projection's output.

Contract (shared by the reference and the Triton kernel):
    gate_up  [N, 2F]  bf16/fp16/fp32, last dimension contiguous; gate in columns [0, F), up in [F, 2F)
                      (the layout F.linear(x, w_gate_up) produces from the stacked [gate; up] weight)
    out      [N, F] in gate_up's dtype (optional, last dimension contiguous; must not overlap gate_up)
Returns act [N, F] with act = F.silu(gate) * up, rounded exactly as that torch expression rounds:
    s   = gate / (1 + exp(-gate))   in fp32, rounded to the dtype   (F.silu computes in fp32 for bf16/fp16)
    act = s * up                    in fp32, rounded to the dtype   (exact in fp32 for bf16/fp16 operands)

Exactness: on CUDA the kernel uses libdevice's expf (the same code as CUDA's expf, which torch calls) and a
correctly rounded division, so it matches torch bit for bit for every normal input. Two places can differ:
  * in the CPU interpreter exp is numpy's fp64 exp rounded to fp32 and torch's CPU exp is SLEEF's (within
    0.55 ulp), so silu's fp32 value can differ by an ulp or two; after rounding to bf16/fp16 that shows
    only next to a rounding midpoint;
  * gate values that are fp32 subnormals (|gate| < 2^-126): Triton compiles libdevice with flush-to-zero.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import bind_backend

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def silu_mul_reference(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The engine's MLP activation as torch writes it: two kernels, one rounding each."""
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate) * up
    return act if out is None else out.copy_(act)


def check_silu_mul_inputs(gate_up: torch.Tensor, out: torch.Tensor | None) -> None:
    """The contract's shape/dtype/layout rules; raises ValueError. Run by the dispatcher, not by SiluMul."""
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.dtype not in _DTYPES:
        raise ValueError(f"gate_up must be [N, 2F] bf16/fp16/fp32, got {tuple(gate_up.shape)} {gate_up.dtype}")
    if gate_up.stride(1) != 1:
        raise ValueError("gate_up must be contiguous in its last dimension")
    n, f = gate_up.shape[0], gate_up.shape[1] // 2
    if out is not None and (out.shape != (n, f) or out.dtype != gate_up.dtype or out.stride(1) != 1):
        raise ValueError(f"out must be [{n}, {f}] in gate_up's dtype, last dimension contiguous")


def _bind(backend: str):
    return bind_backend(backend, silu_mul_reference, "._silu_mul_triton", "silu_mul_triton")


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None, *, backend: str = "torch") -> torch.Tensor:
    """Checked dispatcher: "torch" runs the reference, "triton" the fused kernel (see module docstring)."""
    check_silu_mul_inputs(gate_up, out)
    return _bind(backend)(gate_up, out)


class SiluMul:
    """silu_mul bound to one backend at construction. A call only launches: no checks, no environment reads,
    no imports, no host synchronisation, so a decode step built from it can be captured as a CUDA graph.
    Inputs must already satisfy the contract (check_silu_mul_inputs)."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = _bind(backend)

    def __call__(self, gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(gate_up, out)
