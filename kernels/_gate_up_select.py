"""Which path `GateUpSilu` runs, decided once per problem: cuBLAS's gate/up product then the activation kernel,
or a config of the fused kernel (kernels/_gate_up_silu_triton.py).

A problem is (device, row bucket, 2F, K, dtype, weight storage). Up to MAX_ROWS rows on a GPU the first eager
call times both paths end to end (the activation kernel is part of cuBLAS's price) after checking each config
against the unfused pipeline on the call's own x, and keeps the fastest (`_tuned_choice`: choices kept on disk,
FLASH_DLLM_PROJECTIONS=cublas to turn our kernels off, `forced_gate_up_silu` for tests and benchmarks).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn.functional as F

from . import _gate_up_silu_triton, _silu_mul_triton, interpreting
from ._fused_qkv_common import m_bucket, tma_available
from ._gate_up_silu_triton import GateUpLauncher, default_configs, kn_storage
from ._tuned_choice import CUBLAS, Family, TunedOp
from ._tuning_store import device_description, source_digest

CHECK_TOLERANCE = 2e-2  # of the activation's largest magnitude: a gate/up value one bf16 ulp apart moves it ~1e-2
MAX_ROWS = 256  # above this the product is compute-bound and cuBLAS's own tiles are the right ones

FAMILY = Family("gate_up_silu", "fused gate/up")
COUNTERS = FAMILY.counters
forced_gate_up_silu = FAMILY.forced


def gate_up_problem_key(x: torch.Tensor, weight: torch.Tensor) -> tuple:
    return (x.device, m_bucket(x.shape[0]), weight.shape[0], weight.shape[1], x.dtype, kn_storage(weight))


def _tma_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the weight's storage can be read through a tensor descriptor (16-byte aligned base and rows)."""
    leading = max(weight.stride())
    if not tma_available() or weight.data_ptr() % 16 or leading * weight.element_size() % 16:
        return False
    if interpreting():
        return True
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9


def _bind(choice, x: torch.Tensor, weight: torch.Tensor):
    if choice == CUBLAS:
        return None
    if choice.tma and not _tma_usable(x, weight):
        choice = dataclasses.replace(choice, tma=False)
    return GateUpLauncher(choice, x, weight)


class GateUpSiluTriton(TunedOp):
    """The GPU side of one GateUpSilu op (launchers bound per x shape and weight: `BoundLaunchers`)."""

    def __init__(self, silu_mul, request: str | None = None):
        self.silu_mul = silu_mul
        super().__init__(FAMILY, gate_up_problem_key, _bind, request)

    def fallback(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.silu_mul(F.linear(x, weight))

    def _timed(self, launcher, x: torch.Tensor, weight: torch.Tensor) -> Callable[[], None]:
        if launcher is None:
            return lambda: self.fallback(x, weight)
        act = torch.empty(launcher.act_shape, device=x.device, dtype=x.dtype)
        return lambda: launcher(x, weight, act)

    def choose(self, key: tuple, x: torch.Tensor, weight: torch.Tensor):
        device, *problem = key
        sources = [module.__file__ for module in (_gate_up_silu_triton, _silu_mul_triton)]  # both are timed
        parts = [device_description(device), source_digest(*sources), repr(tuple(problem))]
        if self.request == CUBLAS or x.shape[0] > MAX_ROWS or not x.is_contiguous():
            candidates = (CUBLAS,)
        else:
            candidates = (CUBLAS, *default_configs(x.shape[0], _tma_usable(x, weight)))
        expected = None

        def verify(launcher) -> bool:
            nonlocal expected
            if expected is None:
                expected = self.fallback(x, weight).float()
            return FAMILY.agrees(launcher(x, weight), expected, CHECK_TOLERANCE,
                                 f"{launcher.config} on a [{x.shape[0]}, {weight.shape[0]}, {weight.shape[1]}] "
                                 "problem")

        return FAMILY.choose(parts, candidates, lambda c: _bind(c, x, weight), verify,
                             lambda launcher: self._timed(launcher, x, weight))
