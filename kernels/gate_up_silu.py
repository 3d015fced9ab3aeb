"""The MLP's gate/up projection and its SwiGLU activation in one pass: act = silu(x @ Wg^T) * (x @ Wu^T).

Contract (shared by the reference and the Triton kernel):
    x        [M, K]   bf16/fp16/fp32, last dimension contiguous (M may be 0)
    weight   [2F, K]  x's dtype, gate rows [0, F) then up rows [F, 2F) (the stacked w_gate_up); stored either
                      with K contiguous (as a checkpoint holds it) or transposed ([K, 2F] storage, the engine's
                      layout on Hopper)
Returns act [M, F] in x's dtype, rounded as the unfused pipeline `silu_mul(F.linear(x, weight))` rounds: gate and
up rounded to the dtype, then silu_mul's contract (silu in fp32 rounded, times up rounded).
Exactness: the gate and up sums are fp32 dot products of 16-bit values added in another order than cuBLAS's, so
they agree with the unfused pipeline to fp32 accumulation error (then one bf16 rounding may differ), not bit for
bit; the activation of equal gate/up values is bit-exact (as silu_mul's kernel is).

`GateUpSilu` is the op the engine calls for a dense layer's MLP: per problem it decides once between cuBLAS plus
the activation kernel and a config of the fused kernel, by timing both (`_gate_up_select`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import bind_backend
from .silu_mul import SiluMul, silu_mul_reference

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def gate_up_silu_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The unfused pipeline: the projection, rounded, then the activation."""
    return silu_mul_reference(F.linear(x, weight))


def check_gate_up_silu_inputs(x: torch.Tensor, weight: torch.Tensor) -> None:
    """The contract's rules; raises ValueError."""
    if x.dim() != 2 or x.dtype not in _DTYPES or (x.shape[0] and x.stride(1) != 1):
        raise ValueError(f"x must be [M, K] bf16/fp16/fp32 with a contiguous last dimension, got "
                         f"{tuple(x.shape)} {x.dtype}")
    if (weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.shape[0] % 2 or weight.dtype != x.dtype
            or 1 not in weight.stride()):
        raise ValueError(f"weight must be [2F, {x.shape[1]}] in x's dtype with one contiguous dimension, got "
                         f"{tuple(weight.shape)} {weight.dtype} strides {weight.stride()}")


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, *, backend: str = "torch", config=None) -> torch.Tensor:
    """Checked dispatcher: "torch" runs the reference, "triton" the fused kernel (`config`, a GateUpConfig, picks
    its launch shape; by default a pointer-load one)."""
    check_gate_up_silu_inputs(x, weight)
    if backend == "torch":
        return gate_up_silu_reference(x, weight)
    run = bind_backend(backend, None, "._gate_up_silu_triton", "gate_up_silu_triton")
    if config is None:
        from ._gate_up_silu_triton import GateUpConfig, block_m_for
        config = GateUpConfig(min(block_m_for(x.shape[0]), 64), 32, 64, 2, 4, False)
    return run(x, weight, config)


class GateUpSilu:
    """act = silu_mul(x @ weight^T) for a dense MLP: cuBLAS then the activation kernel, or the fused kernel,
    whichever `_gate_up_select` chose for the problem (always the former on the torch backend). A steady call
    looks its launcher up and launches: no checks, timing or descriptor building, so it can be captured in a
    CUDA graph after one eager call with the same buffers."""

    def __init__(self, backend: str, silu_mul: SiluMul | None = None):
        self.backend = backend
        self.silu_mul = silu_mul or SiluMul(backend)
        self._triton = None
        if backend == "triton":
            from ._gate_up_select import GateUpSiluTriton
            self._triton = GateUpSiluTriton(self.silu_mul)
        elif backend != "torch":
            raise ValueError(f"unknown kernel backend {backend!r}")

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._triton is None:
            return self.silu_mul(F.linear(x, weight))
        return self._triton(x, weight)

    def bound_choice(self, x: torch.Tensor, weight: torch.Tensor):
        """The config a call on these tensors launches now ("cublas" or a GateUpConfig), None before binding."""
        return None if self._triton is None else self._triton.bound_choice(x, weight)
