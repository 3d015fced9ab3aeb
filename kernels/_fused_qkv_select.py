"""Which fused QKV kernel runs, decided once per problem, and the launchers that make a later call only launch.

Paths: "pointer" (any CUDA GPU, and the interpreter), "tma" and "streamk" (compute capability >= 9, head dim
128, TMA-compatible x / w_qkv; the interpreter runs them too), and "cublas" (the vendor GEMM, then RoPE and the
cache write in a small kernel: _fused_qkv_cublas.py; anywhere). A request is "auto" or one path; it comes from
FLASH_DLLM_FUSED_QKV_PATH, read once when an op is built, unless `forced_fused_qkv` (tests, benchmarks) names
a path.

The first call of a problem key (`fused_qkv_problem_key`: device, token bucket, geometry, dtype, bias) tunes:
each path the request allows times its candidate configs on that call and keeps the fastest, and auto keeps the
fastest path (every path is exact to within its rounding, so the choice only moves time; no fixed rule fits the
H200 numbers in the README's kernel table). Before a candidate is timed it runs once into scratch outputs and must
match the torch reference on the call's own inputs (`_fused_qkv_check.ReferenceCheck`): one that computes wrong on this GPU or
compiler is dropped with a warning, never chosen. Re-running a kernel rewrites the same K/V cache rows with the same
values, so timing on the real call is harmless. Choices are process-wide, and timed ones are kept on disk
(`_tuning_store`): a later process on the same GPU and kernels reads them instead of timing again (an app
start no longer re-tunes its first answers). Forced candidates or a forced measure keep their choices to
themselves unless the forcing names a store.

`FusedQKVTriton` is one op's launcher cache: per (x buffer, w_qkv) a launcher bound to its problem (grid,
constexprs, TMA descriptors, stream-K buffers). A steady call computes two dict keys and launches; it never
times, tunes, synchronises, allocates persistent memory or builds a descriptor, so after one eager call with
the same buffers it can be captured in a CUDA graph.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from triton.compiler.errors import CompilationError

from . import gpu_time_ms, interpreting
from . import _fused_qkv_common, _fused_qkv_cublas, _fused_qkv_pointer, _fused_qkv_streamk, _fused_qkv_tma
from . import _rope_cache_write_triton
from ._fused_qkv_check import ReferenceCheck
from ._fused_qkv_common import COUNTERS, TMA_HEAD_DIM, FusedQKVCounters, FusedQKVProblem, m_bucket, tma_available
from ._fused_qkv_cublas import CublasLauncher
from ._fused_qkv_pointer import PointerLauncher
from ._fused_qkv_streamk import StreamKLauncher
from ._fused_qkv_tma import TMALauncher
from ._tuning_store import (DOES_NOT_FIT, TuningStore, default_store, device_description, matching_config,
                            source_digest)

PATH_ENV = "FLASH_DLLM_FUSED_QKV_PATH"
PATHS = ("auto", "pointer", "tma", "streamk", "cublas")
KERNEL_PATHS = ("pointer", "tma", "streamk", "cublas")  # what auto measures on Hopper
OTHER_GPU_PATHS = ("pointer", "cublas")  # what auto measures on any other CUDA GPU
TMA_PATHS = ("tma", "streamk")  # both read x and w_qkv through tensor descriptors
# x buffers whose launchers an op keeps: TMA descriptors hold their tensor, so an eager caller that passes a
# fresh x each call keeps at most this many alive (the engine's preallocated buffers need one per bucket).
MAX_X_BUFFERS = 8
_CONFIG_MODULES = {"pointer": _fused_qkv_pointer, "tma": _fused_qkv_tma, "streamk": _fused_qkv_streamk,
                   "cublas": _fused_qkv_cublas}


def read_path_request(environ=os.environ) -> str:
    """FLASH_DLLM_FUSED_QKV_PATH (auto when unset); ValueError naming the choices for anything else."""
    value = environ.get(PATH_ENV, "auto").strip().lower() or "auto"
    if value not in PATHS:
        raise ValueError(f"{PATH_ENV}={value!r} is not a fused QKV kernel path; choose one of: {', '.join(PATHS)}")
    return value


@functools.lru_cache(maxsize=None)
def _compute_capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def tma_blocker(x: torch.Tensor, w_qkv: torch.Tensor, head_dim: int, interpreter: bool | None = None) -> str | None:
    """Why the TMA kernels cannot run on these inputs, or None when they can (interpreter: TRITON_INTERPRET)."""
    interpreter = interpreting() if interpreter is None else interpreter
    if not tma_available():
        return "this triton has no tensor descriptors (triton.tools.tensor_descriptor)"
    if not interpreter:
        if not x.is_cuda:
            return f"x is on {x.device}, not a CUDA device"
        if _compute_capability(x.device.index if x.device.index is not None else torch.cuda.current_device())[0] < 9:
            return "TMA needs a GPU of compute capability >= 9.0 (Hopper)"
    if head_dim != TMA_HEAD_DIM:
        return f"the TMA kernel is built for head dim {TMA_HEAD_DIM}, got {head_dim}"
    for name, t in (("x", x), ("w_qkv", w_qkv)):
        if not t.is_contiguous():
            return f"{name} must be contiguous"
        if (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return f"{name} needs a 16-byte aligned base and row stride"
    return None


def fused_qkv_paths(request: str, x: torch.Tensor, w_qkv: torch.Tensor, head_dim: int,
                    interpreter: bool | None = None, auto_paths: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The kernel paths a request may run on these inputs: one path, or the candidates auto measures.

      pointer, cublas ("pointer",), ("cublas",)
      tma / streamk   that path; ValueError saying why if it cannot run
      auto            all four on a CUDA device of compute capability >= 9, fp16/bf16, head dim 128 and
                      TMA-compatible x / w_qkv; pointer and cublas on any other CUDA device with fp16/bf16;
                      ("pointer",) otherwise (always under the interpreter, where nothing can be timed).
                      auto_paths (forced_fused_qkv) replaces the four, less the TMA paths TMA cannot run.
    """
    if request in ("pointer", "cublas"):
        return (request,)
    interpreter = interpreting() if interpreter is None else interpreter
    blocker = tma_blocker(x, w_qkv, head_dim, interpreter)
    if request in TMA_PATHS:
        if blocker is not None:
            raise ValueError(f"fused QKV path {request} requested ({PATH_ENV} or forced_fused_qkv), but {blocker}")
        return (request,)
    if request != "auto":
        raise ValueError(f"unknown fused QKV kernel path {request!r}; choose one of: {', '.join(PATHS)}")
    if auto_paths is not None:
        return tuple(path for path in auto_paths if path not in TMA_PATHS or blocker is None)
    if interpreter or not x.is_cuda or x.dtype not in (torch.float16, torch.bfloat16):
        return ("pointer",)
    return KERNEL_PATHS if blocker is None else OTHER_GPU_PATHS


@dataclass(frozen=True)
class FusedQKVChoice:
    path: str  # "pointer" | "tma" | "streamk"
    config: object  # PointerConfig | TMAConfig | StreamKConfig


@dataclass(frozen=True)
class FusedQKVForcing:
    """What forced_fused_qkv overrides; None keeps the default."""

    path: str | None = None  # replaces every op's request
    pointer_configs: tuple | None = None  # the tuner's candidates of each path
    tma_configs: tuple | None = None
    streamk_configs: tuple | None = None
    cublas_configs: tuple | None = None
    auto_paths: tuple[str, ...] | None = None  # what auto measures (default: fused_qkv_paths)
    measure: Callable | None = None  # measure(fn) -> ms; default gpu_time_ms (none under the interpreter)
    store: TuningStore | None = None  # where timed choices persist; default: on disk unless anything is forced

    def configs(self, path: str) -> tuple | None:
        return {"pointer": self.pointer_configs, "tma": self.tma_configs, "streamk": self.streamk_configs,
                "cublas": self.cublas_configs}[path]


_NOT_FORCED = FusedQKVForcing()
_forcing = _NOT_FORCED
_CHOICES: dict = {}  # (forcing less its path, request, problem key) -> FusedQKVChoice
_TUNED: dict = {}  # (path, candidate configs, forced measure, problem key) -> (config, ms; nan when untimed)


def current_fused_qkv_forcing() -> FusedQKVForcing:
    return _forcing


@contextlib.contextmanager
def forced_fused_qkv(path: str | None = None, *, pointer_configs=None, tma_configs=None, streamk_configs=None,
                     cublas_configs=None, auto_paths=None, measure: Callable | None = None,
                     store: TuningStore | None = None):
    """Inside the block every fused QKV op runs `path` (if given) with these candidate configs (if given);
    the previous forcing is back on exit, an exception's too. Process-wide (not per thread); a nested block
    replaces the outer one whole. Choices made under a forcing serve only an equal forcing, and ops rebind
    their launchers whenever the forcing changes."""
    global _forcing
    if path is not None and path not in PATHS:
        raise ValueError(f"unknown fused QKV kernel path {path!r}; choose one of: {', '.join(PATHS)}")
    as_tuple = (lambda configs: None if configs is None else tuple(configs))
    forcing = FusedQKVForcing(path, pointer_configs=as_tuple(pointer_configs), tma_configs=as_tuple(tma_configs),
                              streamk_configs=as_tuple(streamk_configs), cublas_configs=as_tuple(cublas_configs),
                              auto_paths=as_tuple(auto_paths), measure=measure, store=store)
    previous, _forcing = _forcing, forcing
    try:
        yield forcing
    finally:
        _forcing = previous


def fused_qkv_problem_key(x: torch.Tensor, w_qkv: torch.Tensor, has_bias: bool, n_heads: int) -> tuple:
    """What a choice is keyed on: device, token-count bucket, layer geometry, dtype, bias."""
    return (x.device, m_bucket(x.shape[0]), x.shape[1], w_qkv.shape[0], n_heads, x.dtype, has_bias)


def fused_qkv_choice(key: tuple, path: str = "auto") -> FusedQKVChoice | None:
    """What was chosen for a problem key under the current forcing for a request of `path` (a forced path
    replaces it); None before the first call of that key."""
    return _CHOICES.get((dataclasses.replace(_forcing, path=None), _forcing.path or path, key))


def fused_qkv_counters() -> FusedQKVCounters:
    """A snapshot of the process-wide counters of slow steps (compare two snapshots)."""
    return dataclasses.replace(COUNTERS)


def _build_launcher(path: str, config, problem: FusedQKVProblem, x, w_qkv):
    COUNTERS.launchers_built += 1
    if path == "pointer":
        return PointerLauncher(config, problem)
    if path == "tma":
        return TMALauncher(config, problem, x, w_qkv)
    if path == "cublas":
        return CublasLauncher(config, problem)
    return StreamKLauncher(config, problem, x, w_qkv)


def _fastest(launchers: list, call_args: tuple, measure: Callable, check: ReferenceCheck) -> tuple[object, float]:
    """(config, ms) of the launcher that `measure` times fastest on call_args, among those whose outputs match
    the reference (`check`); configs that do not fit are skipped (a compiler failure with a warning)."""
    times = {}
    for launcher in launchers:
        COUNTERS.measurements += 1
        try:
            if not check.accepts(launcher):
                continue
            times[launcher.config] = measure(functools.partial(launcher, *call_args))
        except DOES_NOT_FIT:
            continue
        except (CompilationError, RuntimeError) as exc:
            warnings.warn(f"fused QKV {launcher.path} config {launcher.config} failed: {exc}")
            continue
    if not times:
        raise RuntimeError(f"no fused QKV {launchers[0].path} config runs here ({len(launchers)} tried)")
    best = min(times, key=times.get)
    return best, times[best]


def _choose(paths: tuple[str, ...], key: tuple, problem: FusedQKVProblem, call_args: tuple) -> FusedQKVChoice:
    """Tune each path on the call (call_args: the launch arguments) and keep the fastest path. A choice timed
    by an earlier process for the same GPU, kernels, problem and candidates is read back instead."""
    forcing = _forcing
    measure = forcing.measure or (None if interpreting() else gpu_time_ms)
    x, w_qkv = call_args[0], call_args[1]
    candidates = {path: forcing.configs(path) or _CONFIG_MODULES[path].default_configs(key[1]) for path in paths}
    store = _store(forcing) if measure is not None else None
    if store is not None:
        stored = _stored_choice(store, key, candidates)
        if stored is not None:
            COUNTERS.stored_choices_read += 1
            return stored
    timed, check = {}, None
    for path, configs in candidates.items():
        tuned_key = (path, configs, forcing.measure, key)
        must_time = measure is not None and (len(configs) > 1 or len(paths) > 1)
        entry = _TUNED.get(tuned_key)
        if entry is None or (must_time and math.isnan(entry[1])):
            if must_time:
                launchers = [_build_launcher(path, config, problem, x, w_qkv) for config in configs]
                check = check or ReferenceCheck(call_args, problem)
                try:
                    entry = _fastest(launchers, call_args, measure, check)
                except RuntimeError as exc:  # auto goes on without a path that cannot run here
                    if len(paths) == 1:
                        raise
                    warnings.warn(f"fused QKV auto skips {path} for {key}: {exc}")
                    continue
            else:  # nothing to compare, or nothing to time with (the interpreter): the first candidate
                entry = (configs[0], math.nan)
            _TUNED[tuned_key] = entry
        timed[path] = entry
    if not timed:
        raise RuntimeError(f"no fused QKV path of {paths} runs here for {key}")
    fastest = next(iter(timed))
    if not any(math.isnan(ms) for _, ms in timed.values()):
        fastest = min(timed, key=lambda path: timed[path][1])
        if store is not None:
            store.save("fused_qkv", _store_key(key, candidates),
                       {"path": fastest, "config": dataclasses.asdict(timed[fastest][0]),
                        "ms": {path: ms for path, (_, ms) in timed.items()}})
    return FusedQKVChoice(fastest, timed[fastest][0])


def _store(forcing: FusedQKVForcing) -> TuningStore | None:
    """A forcing's own store, else the default one when nothing is forced (forced candidates or a forced
    measure make choices of their own, which must not serve a later plain process)."""
    if forcing.store is not None:
        return forcing.store
    return default_store() if forcing == _NOT_FORCED else None


def _store_key(key: tuple, candidates: dict) -> list[str]:
    device, *problem = key
    sources = [module.__file__ for module in (_fused_qkv_common, _rope_cache_write_triton, *_CONFIG_MODULES.values())]
    return [device_description(device), source_digest(*sources), repr(tuple(problem)),
            *(f"{path}: {configs!r}" for path, configs in candidates.items())]


def _stored_choice(store: TuningStore, key: tuple, candidates: dict) -> FusedQKVChoice | None:
    stored = store.load("fused_qkv", _store_key(key, candidates))
    if not stored or stored.get("path") not in candidates or not isinstance(stored.get("config"), dict):
        return None
    config = matching_config(stored["config"], candidates[stored["path"]])
    return None if config is None else FusedQKVChoice(stored["path"], config)


class _NoTokens:
    """An empty call: q has no rows and no cache row is written."""

    path = config = None

    def __init__(self, q_shape):
        self.q_shape = q_shape

    def __call__(self, *args) -> None:
        pass


class FusedQKVTriton:
    """The Triton side of one FusedQKVRopeCache op (contract: fused_qkv_rope_cache.py): its launchers per
    (x buffer, w_qkv), bound on first use and rebound only when the forcing changes."""

    def __init__(self, n_heads: int, n_kv_heads: int, request: str):
        if request not in PATHS:
            raise ValueError(f"unknown fused QKV kernel path {request!r}; choose one of: {', '.join(PATHS)}")
        self.n_heads, self.n_kv_heads, self.request = n_heads, n_kv_heads, request
        self._forcing = _forcing
        self._by_x: dict = {}  # x key -> {w key -> launcher}; insertion order = age

    def __call__(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache, out=None):
        if _forcing is not self._forcing:
            self._forcing, self._by_x = _forcing, {}
        x_key = (x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device())
        w_key = (w_qkv.data_ptr(), w_qkv.shape, w_qkv.stride(), b_qkv is None)
        launchers = self._by_x.get(x_key)
        launcher = None if launchers is None else launchers.get(w_key)
        positions, cache_rows = positions.contiguous(), cache_rows.contiguous()  # no copy when they already are
        if launcher is None:
            launcher = self._bind(x_key, w_key, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache)
        q = x.new_empty(launcher.q_shape) if out is None else out
        launcher(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache)
        return q

    def bound_choice(self, x, w_qkv, b_qkv) -> FusedQKVChoice | None:
        """The path and config that a call on these tensors launches now, or None when it would bind first."""
        if _forcing is not self._forcing:
            return None
        launchers = self._by_x.get((x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device()), {})
        launcher = launchers.get((w_qkv.data_ptr(), w_qkv.shape, w_qkv.stride(), b_qkv is None))
        return None if launcher is None or launcher.path is None else FusedQKVChoice(launcher.path, launcher.config)

    def _bind(self, x_key, w_key, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache):
        n_tokens, d_model = x.shape
        head_dim = w_qkv.shape[0] // (self.n_heads + 2 * self.n_kv_heads)
        request = _forcing.path or self.request
        paths = fused_qkv_paths(request, x, w_qkv, head_dim, auto_paths=_forcing.auto_paths)
        problem = FusedQKVProblem(n_tokens, d_model, self.n_heads, self.n_kv_heads, head_dim, x.dtype,
                                  b_qkv is not None, x.device)
        if n_tokens == 0:
            launcher = _NoTokens(problem.q_shape)
        else:
            key = fused_qkv_problem_key(x, w_qkv, b_qkv is not None, self.n_heads)
            choice_key = (dataclasses.replace(_forcing, path=None), request, key)
            choice = _CHOICES.get(choice_key)
            if choice is None:
                if x.is_cuda and torch.cuda.is_current_stream_capturing():
                    raise RuntimeError(f"fused QKV: the first call of problem {key} is inside CUDA graph capture, "
                                       "where it cannot tune; call the op once eagerly with the same buffers first")
                call_args = (x, w_qkv, b_qkv, cos, sin, positions, cache_rows, x.new_empty(problem.q_shape),
                             k_cache, v_cache)
                choice = _CHOICES[choice_key] = _choose(paths, key, problem, call_args)
                COUNTERS.resolutions += 1
            launcher = _build_launcher(choice.path, choice.config, problem, x, w_qkv)
        launchers = self._by_x.get(x_key)
        if launchers is None:
            if len(self._by_x) >= MAX_X_BUFFERS:
                del self._by_x[next(iter(self._by_x))]
            launchers = self._by_x[x_key] = {}
        launchers[w_key] = launcher
        return launcher
