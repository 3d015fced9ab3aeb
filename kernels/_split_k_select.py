"""Which projection `SkinnyLinear` runs, decided once per problem, and the launchers a later call only launches.

A problem is (device, row bucket, N, K, dtype). Up to MAX_ROWS rows on a GPU, the first eager call of a problem
times cuBLAS and each split-K config of `default_configs`, each followed by the add+RMSNorm that consumes it in
the engine (split-K leaves its partials for that norm to sum, so the norm's extra reads are part of the price),
and keeps the fastest. Every candidate is exact to within fp32 accumulation order, so the choice only moves
time; before a config is timed its parts are checked against cuBLAS's product on the call's own x (once per
problem, not on the hot path), so a kernel that computes wrong on some GPU or compiler is dropped with a
warning instead of chosen. Choices are process-wide and kept on disk (`_tuning_store`), as the fused QKV
kernel's are. Larger problems, the interpreter (where nothing can be timed) and FLASH_DLLM_PROJECTIONS=cublas
(read once per op) take cuBLAS unless `forced_skinny_linear` says otherwise (tests, benchmarks).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from . import gpu_time_ms, interpreting
from . import _add_rms_norm_triton, _split_k_linear_triton
from ._add_rms_norm_triton import add_rms_norm_triton
from ._fused_qkv_common import m_bucket, tma_available
from ._split_k_linear_triton import SplitKLauncher, default_configs
from ._tuning_store import (DOES_NOT_FIT, TuningStore, default_store, device_description, matching_config,
                            source_digest)

CUBLAS = "cublas"
REQUEST_ENV = "FLASH_DLLM_PROJECTIONS"
REQUESTS = ("auto", CUBLAS)
CHECK_TOLERANCE = 1e-2  # of the product's largest magnitude: bf16 rounding of cuBLAS's output is ~4e-3
MAX_ROWS = 256  # above this a projection is compute-bound and cuBLAS's own tiles are the right ones
_MAX_X_SHAPES = 16  # row counts an op keeps launchers for (the engine's step shapes are a handful)


@dataclass(frozen=True)
class SkinnyLinearForcing:
    """choice: CUBLAS or a SplitKConfig to run without timing; candidates: what to time instead of the defaults
    (CUBLAS and/or configs); measure: the timer (a callable like gpu_time_ms); store: where choices go."""

    choice: object = None
    candidates: tuple | None = None
    measure: Callable | None = None
    store: TuningStore | None = None


@dataclass
class SkinnyLinearCounters:
    resolutions: int = 0  # problems decided
    measurements: int = 0  # candidates timed
    stored_choices_read: int = 0


COUNTERS = SkinnyLinearCounters()
_NOT_FORCED = SkinnyLinearForcing()
_forcing = _NOT_FORCED
_CHOICES: dict = {}


@contextlib.contextmanager
def forced_skinny_linear(choice=None, *, candidates=None, measure=None, store=None):
    """Within the block, SkinnyLinear ops bind to `choice` (CUBLAS or a SplitKConfig), or time `candidates`
    with `measure`; bound launchers are rebuilt on entry and exit."""
    global _forcing
    previous = _forcing
    _forcing = SkinnyLinearForcing(choice, tuple(candidates) if candidates else None, measure, store)
    try:
        yield
    finally:
        _forcing = previous


def skinny_linear_problem_key(x: torch.Tensor, weight: torch.Tensor) -> tuple:
    return (x.device, m_bucket(x.shape[0]), weight.shape[0], weight.shape[1], x.dtype)


def _tma_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the weight can be read through a tensor descriptor (16-byte aligned base and row stride)."""
    if not tma_available() or weight.data_ptr() % 16 or weight.stride(0) * weight.element_size() % 16:
        return False
    if interpreting():
        return True
    return x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9


def read_request(environ=os.environ) -> str:
    """FLASH_DLLM_PROJECTIONS: "auto" (default: time cuBLAS against split-K) or "cublas"; ValueError otherwise."""
    value = environ.get(REQUEST_ENV, "auto").strip().lower() or "auto"
    if value not in REQUESTS:
        raise ValueError(f"{REQUEST_ENV}={value!r} is not a projection path; choose one of: {', '.join(REQUESTS)}")
    return value


def _candidates(x: torch.Tensor, weight: torch.Tensor, request: str) -> tuple:
    if _forcing.candidates is not None:
        return _forcing.candidates
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


def _store_key(key: tuple, candidates: tuple) -> list[str]:
    device, *problem = key
    sources = [module.__file__ for module in (_split_k_linear_triton, _add_rms_norm_triton)]  # both are timed
    return [device_description(device), source_digest(*sources), repr(tuple(problem)), repr(candidates)]


def _computes_right(launcher, x: torch.Tensor, weight: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether a config's parts sum to cuBLAS's product here (warns when not)."""
    parts = launcher(x, weight)
    error = (parts.sum(0) - expected).abs().max()
    if bool(torch.isfinite(error)) and float(error) <= CHECK_TOLERANCE * float(expected.abs().max()) + 1e-6:
        return True
    warnings.warn(f"split-K linear config {launcher.config} disagrees with cuBLAS on a [{x.shape[0]}, "
                  f"{weight.shape[0]}, {weight.shape[1]}] problem (max error {float(error):.3g}); not used")
    return False


def _choose(key: tuple, x: torch.Tensor, weight: torch.Tensor, request: str):
    forcing = _forcing
    if forcing.choice is not None:
        return forcing.choice
    candidates = _candidates(x, weight, request)
    measure = forcing.measure or (None if interpreting() else gpu_time_ms)
    if len(candidates) == 1 or measure is None:
        return candidates[0]
    store = forcing.store if forcing.store is not None else (default_store() if forcing == _NOT_FORCED else None)
    store_key = _store_key(key, candidates)
    if store is not None:
        stored = (store.load("skinny_linear", store_key) or {}).get("choice")
        configs = tuple(c for c in candidates if c != CUBLAS)
        chosen = CUBLAS if stored == CUBLAS and CUBLAS in candidates else (
            matching_config(stored, configs) if isinstance(stored, dict) else None)
        if chosen is not None:
            COUNTERS.stored_choices_read += 1
            return chosen
    times = {}
    expected = F.linear(x, weight).float()
    for candidate in candidates:
        COUNTERS.measurements += 1
        try:
            launcher = _bind(candidate, x, weight)
            if launcher is not None and not _computes_right(launcher, x, weight, expected):
                continue
            times[candidate] = measure(_with_norm(launcher, x, weight))
        except DOES_NOT_FIT:
            continue
        except Exception as exc:  # noqa: BLE001 - any failure of an optional kernel leaves cuBLAS to do the work
            if candidate == CUBLAS:
                raise
            warnings.warn(f"split-K linear config {candidate} failed ({type(exc).__name__}: {exc}); not used")
            continue
    best = min(times, key=times.get) if times else CUBLAS
    if store is not None and times:
        store.save("skinny_linear", store_key,
                   {"choice": best if best == CUBLAS else dataclasses.asdict(best),
                    "us": {str(c): round(t * 1e3, 2) for c, t in times.items()}})
    return best


class SkinnyLinearTriton:
    """The GPU side of one SkinnyLinear op: a launcher (None = cuBLAS) per (x shape and stride, weight), bound on
    first use and rebound when the forcing changes. Launchers do not hold x, so a fresh x buffer per call (an
    eager step) finds its launcher bound."""

    def __init__(self, request: str | None = None):
        self.request = read_request() if request is None else request
        if self.request not in REQUESTS:
            raise ValueError(f"unknown projection path {self.request!r}; choose one of: {', '.join(REQUESTS)}")
        self._forcing = _forcing
        self._by_x: dict = {}

    def _launcher(self, x: torch.Tensor, weight: torch.Tensor):
        if _forcing is not self._forcing:
            self._forcing, self._by_x = _forcing, {}
        x_key = (x.shape, x.stride(), x.dtype, x.device)
        w_key = (weight.data_ptr(), weight.shape, weight.stride())
        launchers = self._by_x.get(x_key)
        if launchers is not None and w_key in launchers:
            return launchers[w_key]
        key = skinny_linear_problem_key(x, weight)
        choice_key = (_forcing, self.request, key)
        choice = _CHOICES.get(choice_key)
        if choice is None:
            if x.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"split-K linear: the first call of problem {key} is inside CUDA graph "
                                   "capture, where it cannot tune; call the op once eagerly first")
            choice = _CHOICES[choice_key] = _choose(key, x, weight, self.request)
            COUNTERS.resolutions += 1
        launcher = _bind(choice, x, weight)
        if launchers is None:
            if len(self._by_x) >= _MAX_X_SHAPES:
                del self._by_x[next(iter(self._by_x))]
            launchers = self._by_x[x_key] = {}
        launchers[w_key] = launcher
        return launcher

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return F.linear(x, weight)
        launcher = self._launcher(x, weight)
        return F.linear(x, weight) if launcher is None else launcher(x, weight)

    def bound_choice(self, x: torch.Tensor, weight: torch.Tensor):
        if _forcing is not self._forcing:
            return None
        launchers = self._by_x.get((x.shape, x.stride(), x.dtype, x.device), {})
        w_key = (weight.data_ptr(), weight.shape, weight.stride())
        if w_key not in launchers:
            return None
        launcher = launchers[w_key]
        return CUBLAS if launcher is None else launcher.config

