"""A projection of a decode step's few rows, left as fp32 partial sums over K for the norm that follows it.

Contract (shared by the reference and the Triton kernel):
    x        [M, K]  bf16/fp16/fp32, last dimension contiguous (M may be 0)
    weight   [N, K]  x's dtype, last dimension contiguous (as a checkpoint stores a linear's weight)
    splits   S >= 1: K is cut into S ranges of ceil(ceil(K / S) / block_k) * block_k columns (the last shorter,
             trailing ranges possibly empty); the reference cuts the same ranges
Returns parts [S, M, N] float32: parts[s] = x[:, range s] @ weight[:, range s]^T, accumulated in fp32. Their sum
is the projection; `add_rms_norm` takes parts as its update and sums them in order s = 0..S-1, rounding once
(deterministic: no atomics, no dependence on which split finishes first).
Exactness: each partial is an fp32 dot product of 16-bit values; the reference and the kernel add the products
in different orders, so they agree to fp32 accumulation error, not bit for bit.

`SkinnyLinear` is the op the engine calls for the output and down projections (each followed by add+RMSNorm):
per problem it decides once between cuBLAS (`F.linear`, an [M, N] result in x's dtype) and a split-K config of
the Triton kernel (parts), by timing each candidate together with the norm that consumes it
(`_split_k_select`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import bind_backend

MAX_SPLITS = 16
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_ranges(d_in: int, splits: int, block_k: int) -> list[tuple[int, int]]:
    """The S column ranges of K, as the kernel cuts them (empty trailing ranges included)."""
    per_split = _cdiv(_cdiv(d_in, splits), block_k) * block_k
    return [(min(s * per_split, d_in), min((s + 1) * per_split, d_in)) for s in range(splits)]


def split_k_linear_reference(x: torch.Tensor, weight: torch.Tensor, splits: int, block_k: int) -> torch.Tensor:
    """Each range's product in fp32 (16-bit inputs are exact in fp32), stacked."""
    xf, wf = x.float(), weight.float()
    return torch.stack([xf[:, a:b] @ wf[:, a:b].T for a, b in split_ranges(x.shape[1], splits, block_k)])


def check_split_k_linear_inputs(x: torch.Tensor, weight: torch.Tensor, splits: int) -> None:
    """The contract's rules; raises ValueError."""
    if x.dim() != 2 or x.dtype not in _DTYPES or (x.shape[0] and x.stride(1) != 1):
        raise ValueError(f"x must be [M, K] bf16/fp16/fp32 with a contiguous last dimension, got "
                         f"{tuple(x.shape)} {x.dtype}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.dtype != x.dtype or weight.stride(1) != 1:
        raise ValueError(f"weight must be [N, {x.shape[1]}] in x's dtype with a contiguous last dimension, got "
                         f"{tuple(weight.shape)} {weight.dtype} strides {weight.stride()}")
    if not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"splits must be 1..{MAX_SPLITS}, got {splits}")


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, splits: int, *, block_k: int = 64,
                   backend: str = "torch", config=None) -> torch.Tensor:
    """Checked dispatcher: "torch" runs the reference, "triton" the kernel (`config`, a SplitKConfig, picks its
    launch shape; by default a pointer-load one with these splits and block_k)."""
    check_split_k_linear_inputs(x, weight, splits)
    if backend == "torch":
        return split_k_linear_reference(x, weight, splits, block_k)
    run = bind_backend(backend, None, "._split_k_linear_triton", "split_k_linear_triton")
    if config is None:
        from ._split_k_linear_triton import SplitKConfig, block_m_for
        config = SplitKConfig(min(block_m_for(x.shape[0]), 64), 64, block_k, splits, 2, 4, False)
    elif (config.splits, config.block_k) != (splits, block_k):
        raise ValueError(f"config {config} does not cut K into {splits} splits of block_k {block_k}")
    return run(x, weight, config)


class SkinnyLinear:
    """out = x @ weight^T for a projection that add_rms_norm consumes: cuBLAS's [M, N] or split-K parts [S, M, N],
    whichever `_split_k_select` chose for the problem (always cuBLAS on the torch backend). A steady call looks
    its launcher up and launches: no checks, timing or descriptor building, so it can be captured in a CUDA
    graph after one eager call with the same buffers."""

    def __init__(self, backend: str):
        self.backend = backend
        self._triton = None
        if backend == "triton":
            from ._split_k_select import SkinnyLinearTriton
            self._triton = SkinnyLinearTriton()
        elif backend != "torch":
            raise ValueError(f"unknown kernel backend {backend!r}")

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._triton is None:
            return F.linear(x, weight)
        return self._triton(x, weight)

    def bound_choice(self, x: torch.Tensor, weight: torch.Tensor):
        """The config a call on these tensors launches now ("cublas" or a SplitKConfig), None before binding."""
        return None if self._triton is None else self._triton.bound_choice(x, weight)
