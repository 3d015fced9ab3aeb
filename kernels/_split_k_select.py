"""Which projection `SkinnyLinear` runs, decided once per problem, and the launchers a later call only launches.

A problem is (device, row bucket, N, K, dtype). Up to MAX_ROWS rows on a GPU, the first eager call of a problem
times cuBLAS and each split-K config of `default_configs`, each followed by the add+RMSNorm that consumes it in
the engine (split-K leaves its partials for that norm to sum, so the norm's extra reads are part of the price),
and keeps the fastest. Every candidate is exact to within fp32 accumulation order, so the choice only moves
time; before a config is timed its parts are checked against cuBLAS's product on the call's own x (once per
problem, not on the hot path), so a kernel that computes wrong on some GPU or compiler is dropped with a
warning instead of chosen. Choices are process-wide and kept on disk (`_tuning_store`), as the fused QKV
kernel's are. Larger problems, the interpreter (where nothing can be timed) and FLASH_DLLM_PROJECTIONS=cublas
(read once per op) take cuBLAS unless `forced_skinny_linear` says otherwise (tests, benchmarks). The choosing
and binding are `_tuned_choice`'s, shared with the fused gate/up activation.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

from . import _add_rms_norm_triton, _split_k_linear_triton
from ._add_rms_norm_triton import add_rms_norm_triton
from ._fused_qkv_common import m_bucket, tma_available
from ._split_k_linear_triton import SplitKLauncher, default_configs
from ._tuned_choice import CUBLAS, REQUEST_ENV, REQUESTS, Family, TunedOp, read_request  # noqa: F401
from ._tuning_store import device_description, source_digest
from . import interpreting

CHECK_TOLERANCE = 1e-2  # of the product's largest magnitude: bf16 rounding of cuBLAS's output is ~4e-3
MAX_ROWS = 256  # above this a projection is compute-bound and cuBLAS's own tiles are the right ones

FAMILY = Family("skinny_linear", "split-K linear")
COUNTERS = FAMILY.counters
_CHOICES = FAMILY.choices
forced_skinny_linear = FAMILY.forced


def skinny_linear_problem_key(x: torch.Tensor, weight: torch.Tensor) -> tuple:
    return (x.device, m_bucket(x.shape[0]), weight.shape[0], weight.shape[1], x.dtype)


def _tma_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the weight can be read through a tensor descriptor (16-byte aligned base and row stride)."""
    if not tma_available() or weight.data_ptr() % 16 or weight.stride(0) * weight.element_size() % 16:
        return False
    if interpreting():
        return True
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9


def _candidates(x: torch.Tensor, weight: torch.Tensor, request: str) -> tuple:
    if request == CUBLAS or x.shape[0] > MAX_ROWS or not x.is_contiguous():
        return (CUBLAS,)
    return (CUBLAS, *default_configs(x.shape[0], _tma_usable(x, weight)))


def _bind(choice, x: torch.Tensor, weight: torch.Tensor):
    """The launcher of a choice for this weight (None: cuBLAS); a weight that a descriptor cannot address (a
    checkpoint's tensor at an odd offset) is read through pointers instead."""
    if choice == CUBLAS:
        return None
    if choice.tma and not _tma_usable(x, weight):
        choice = dataclasses.replace(choice, tma=False)
    return SplitKLauncher(choice, x, weight)


def _with_norm(launcher, x: torch.Tensor, weight: torch.Tensor) -> Callable[[], None]:
    """One candidate and the add+RMSNorm after it, on scratch buffers."""
    residual = torch.zeros((x.shape[0], weight.shape[0]), device=x.device, dtype=x.dtype)
    gain = torch.ones(weight.shape[0], device=x.device, dtype=x.dtype)
    normed = torch.empty_like(residual)
    if launcher is None:
        return lambda: add_rms_norm_triton(residual, F.linear(x, weight), gain, 1e-6, normed, True)
    parts = torch.empty(launcher.parts_shape, device=x.device, dtype=torch.float32)
    return lambda: add_rms_norm_triton(residual, launcher(x, weight, parts), gain, 1e-6, normed, True)


def _choose(key: tuple, x: torch.Tensor, weight: torch.Tensor, request: str):
    device, *problem = key
    sources = [module.__file__ for module in (_split_k_linear_triton, _add_rms_norm_triton)]  # both are timed
    parts = [device_description(device), source_digest(*sources), repr(tuple(problem))]
    expected = None

    def verify(launcher) -> bool:
        nonlocal expected
        if expected is None:
            expected = F.linear(x, weight).float()
        return FAMILY.agrees(launcher(x, weight).sum(0), expected, CHECK_TOLERANCE,
                             f"{launcher.config} on a [{x.shape[0]}, {weight.shape[0]}, {weight.shape[1]}] problem")

    return FAMILY.choose(parts, _candidates(x, weight, request), lambda c: _bind(c, x, weight), verify,
                         lambda launcher: _with_norm(launcher, x, weight))


class SkinnyLinearTriton(TunedOp):
    """The GPU side of one SkinnyLinear op (launchers bound per x shape and weight: `BoundLaunchers`)."""

    def __init__(self, request: str | None = None):
        super().__init__(FAMILY, skinny_linear_problem_key, _bind, request)

    def fallback(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)

    def choose(self, key: tuple, x: torch.Tensor, weight: torch.Tensor):
        return _choose(key, x, weight, self.request)
