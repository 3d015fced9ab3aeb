"""A choice made once per problem between cuBLAS and the configs of one of our kernels, and the launchers a
later call only launches: what the split-K projections (`_split_k_select`) and the fused gate/up activation
(`_gate_up_select`) share.

On a GPU, the first eager call of a problem checks each config against cuBLAS on the call's own inputs (a
kernel that computes wrong on some GPU or compiler is dropped with a warning, never chosen), times every
candidate together with what consumes its output, and keeps the fastest; choices are process-wide and kept on
disk (`_tuning_store`). The interpreter, where nothing can be timed, takes the first candidate (cuBLAS).
FLASH_DLLM_PROJECTIONS=cublas (read once per op) leaves every such projection to cuBLAS; `Family.forced` lets
tests and benchmarks force a choice or time other candidates.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from . import gpu_time_ms, interpreting
from ._tuning_store import DOES_NOT_FIT, TuningStore, default_store, matching_config

CUBLAS = "cublas"
REQUEST_ENV = "FLASH_DLLM_PROJECTIONS"
REQUESTS = ("auto", CUBLAS)
_MAX_X_SHAPES = 16  # row counts an op keeps launchers for (the engine's step shapes are a handful)


def read_request(environ=os.environ) -> str:
    """FLASH_DLLM_PROJECTIONS: "auto" (default: time cuBLAS against our kernels) or "cublas"; ValueError
    otherwise."""
    value = environ.get(REQUEST_ENV, "auto").strip().lower() or "auto"
    if value not in REQUESTS:
        raise ValueError(f"{REQUEST_ENV}={value!r} is not a projection path; choose one of: {', '.join(REQUESTS)}")
    return value


@dataclass(frozen=True)
class Forcing:
    """choice: CUBLAS or a config to run without timing; candidates: what to time instead of the defaults;
    measure: the timer (a callable like gpu_time_ms); store: where choices go."""

    choice: object = None
    candidates: tuple | None = None
    measure: Callable | None = None
    store: TuningStore | None = None


@dataclass
class Counters:
    resolutions: int = 0  # problems decided
    measurements: int = 0  # candidates timed
    stored_choices_read: int = 0


NOT_FORCED = Forcing()


class Family:
    """What every op of one kind shares: the forcing in effect, the choices made, the counters."""

    def __init__(self, store_name: str, label: str):
        self.store_name = store_name  # the tuning store's file prefix
        self.label = label  # how warnings name the kernel
        self.forcing = NOT_FORCED
        self.choices: dict = {}
        self.counters = Counters()

    @contextlib.contextmanager
    def forced(self, choice=None, *, candidates=None, measure=None, store=None):
        """Within the block, ops of this family bind to `choice`, or time `candidates` with `measure`; bound
        launchers are rebuilt on entry and exit."""
        previous = self.forcing
        self.forcing = Forcing(choice, tuple(candidates) if candidates else None, measure, store)
        try:
            yield
        finally:
            self.forcing = previous

    def choose(self, problem_parts: list[str], candidates: tuple, bind: Callable, verify: Callable,
               timed: Callable):
        """The choice for one problem. bind(candidate) -> launcher (None for CUBLAS); verify(launcher) -> whether
        it computes right (it warns when not); timed(launcher) -> a no-argument callable to time."""
        forcing = self.forcing
        if forcing.choice is not None:
            return forcing.choice
        if forcing.candidates is not None:
            candidates = forcing.candidates
        measure = forcing.measure or (None if interpreting() else gpu_time_ms)
        if len(candidates) == 1 or measure is None:
            return candidates[0]
        store = forcing.store if forcing.store is not None else (default_store() if forcing == NOT_FORCED else None)
        store_key = [*problem_parts, repr(candidates)]
        if store is not None:
            stored = (store.load(self.store_name, store_key) or {}).get("choice")
            configs = tuple(c for c in candidates if c != CUBLAS)
            chosen = CUBLAS if stored == CUBLAS and CUBLAS in candidates else (
                matching_config(stored, configs) if isinstance(stored, dict) else None)
            if chosen is not None:
                self.counters.stored_choices_read += 1
                return chosen
        times = {}
        for candidate in candidates:
            self.counters.measurements += 1
            try:
                launcher = bind(candidate)
                if launcher is not None and not verify(launcher):
                    continue
                times[candidate] = measure(timed(launcher))
            except DOES_NOT_FIT:
                continue
            except Exception as exc:  # noqa: BLE001 - any failure of an optional kernel leaves cuBLAS the work
                if candidate == CUBLAS:
                    raise
                warnings.warn(f"{self.label} config {candidate} failed ({type(exc).__name__}: {exc}); not used")
                continue
        best = min(times, key=times.get) if times else CUBLAS
        if store is not None and times:
            store.save(self.store_name, store_key,
                       {"choice": best if best == CUBLAS else dataclasses.asdict(best),
                        "us": {str(c): round(t * 1e3, 2) for c, t in times.items()}})
        return best

    def agrees(self, got: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> bool:
        """Whether got is expected to within tolerance of its largest magnitude (warns when not)."""
        ok, error = within(got, expected, tolerance)
        if not ok:
            warnings.warn(f"{self.label} config {what} disagrees with cuBLAS (max error {error:.3g}); not used")
        return ok


def within(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> tuple[bool, float]:
    """Whether got equals expected to within tolerance of expected's largest magnitude, and the largest error (a
    candidate kernel's outputs against the reference on the call it is tuned on; non-finite errors never pass)."""
    error = (got.float() - expected.float()).abs().max()
    ok = bool(torch.isfinite(error)) and float(error) <= tolerance * float(expected.float().abs().max()) + 1e-6
    return ok, float(error)


class BoundLaunchers:
    """The GPU side of one op: a launcher (None = cuBLAS) per (x shape and stride, weight), bound on first use
    and rebound when the family's forcing changes. Launchers do not hold x, so a fresh x buffer per call (an
    eager step) finds its launcher bound. `resolve(x, weight)` makes a problem's choice, `bind(choice, x,
    weight)` its launcher, `problem_key(x, weight)` names the problem."""

    def __init__(self, family: Family, problem_key: Callable, resolve: Callable, bind: Callable):
        self.family, self.problem_key, self.resolve, self.bind = family, problem_key, resolve, bind
        self._forcing = family.forcing
        self._by_x: dict = {}

    def launcher(self, x: torch.Tensor, weight: torch.Tensor, request: str):
        family = self.family
        if family.forcing is not self._forcing:
            self._forcing, self._by_x = family.forcing, {}
        x_key = (x.shape, x.stride(), x.dtype, x.device)
        w_key = (weight.data_ptr(), weight.shape, weight.stride())
        launchers = self._by_x.get(x_key)
        if launchers is not None and w_key in launchers:
            return launchers[w_key]
        key = self.problem_key(x, weight)
        choice_key = (family.forcing, request, key)
        choice = family.choices.get(choice_key)
        if choice is None:
            if x.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{family.label}: the first call of problem {key} is inside CUDA graph "
                                   "capture, where it cannot tune; call the op once eagerly first")
            choice = family.choices[choice_key] = self.resolve(key, x, weight)
            family.counters.resolutions += 1
        launcher = self.bind(choice, x, weight)
        if launchers is None:
            if len(self._by_x) >= _MAX_X_SHAPES:
                del self._by_x[next(iter(self._by_x))]
            launchers = self._by_x[x_key] = {}
        launchers[w_key] = launcher
        return launcher

    def bound_choice(self, x: torch.Tensor, weight: torch.Tensor):
        """The config a call on these tensors launches now (CUBLAS or a config), None before binding."""
        if self.family.forcing is not self._forcing:
            return None
        launchers = self._by_x.get((x.shape, x.stride(), x.dtype, x.device), {})
        w_key = (weight.data_ptr(), weight.shape, weight.stride())
        if w_key not in launchers:
            return None
        launcher = launchers[w_key]
        return CUBLAS if launcher is None else launcher.config


class TunedOp:
    """The GPU side of one op: cuBLAS's path (`fallback`, also for empty calls) or the bound launcher of the
    problem's choice. Subclasses give `fallback(x, weight)` and `choose(key, x, weight)`; `bind` makes a choice's
    launcher (None for cuBLAS). The projection request (FLASH_DLLM_PROJECTIONS) is read once, here."""

    def __init__(self, family: Family, problem_key: Callable, bind: Callable, request: str | None = None):
        self.request = read_request() if request is None else request
        if self.request not in REQUESTS:
            raise ValueError(f"unknown projection path {self.request!r}; choose one of: {', '.join(REQUESTS)}")
        self._launchers = BoundLaunchers(family, problem_key, self.choose, bind)

    def fallback(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def choose(self, key: tuple, x: torch.Tensor, weight: torch.Tensor):
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return self.fallback(x, weight)
        launcher = self._launchers.launcher(x, weight, self.request)
        return self.fallback(x, weight) if launcher is None else launcher(x, weight)

    def bound_choice(self, x: torch.Tensor, weight: torch.Tensor):
        return self._launchers.bound_choice(x, weight)
