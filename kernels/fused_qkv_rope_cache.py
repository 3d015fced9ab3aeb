"""Fused QKV projection + rotary embedding + KV-cache write (Flash-Cache's IO-aware projection).

Contract (shared by the reference and the Triton kernel):
    x           [N, D]                 normed hidden states of the packed query tokens (bf16/fp16/fp32)
    w_qkv       [(Hq + 2*Hkv) * Dh, D] the layer's q, k and v weights stacked by rows (nn.Linear layout)
    b_qkv       [(Hq + 2*Hkv) * Dh] or None  (Dream has q/k/v bias, LLaDA has none)
    cos, sin    [P, Dh // 2] fp32      rotary tables for positions 0..P-1 (rotate-half convention)
    positions   [N] int                rotary position of each token
    cache_rows  [N] int                row of k_cache / v_cache that receives the token's K and V
    k_cache     [R, Hkv * Dh]          written in place: K after RoPE
    v_cache     [R, Hkv * Dh]          written in place: V
Returns q [N, Hq * Dh] in x's dtype, RoPE applied. K and V never exist as separate activation tensors on the
Triton path; rows of the cache that no token names are left untouched.

Rotate-half RoPE on a head vector h = [h1, h2] (two halves of Dh/2):
    rot(h) = [h1 * cos - h2 * sin,  h2 * cos + h1 * sin]
computed in fp32 and rounded once to the output dtype.

Two ways in:
  * `FusedQKVRopeCache(backend, n_heads, n_kv_heads)`, built once (per engine or per layer): the backend, the
    Triton kernel path (FLASH_DLLM_FUSED_QKV_PATH) and whether inputs are checked are decided at construction,
    and on the Triton backend the first call per problem and buffers tunes and binds a launcher
    (_fused_qkv_select.py), so later calls only launch. After one eager call, a call with the same buffers
    and token count may be captured in a CUDA graph (refill x / positions / cache_rows in place to replay).
  * `fused_qkv_rope_cache(..., backend=...)`, the functional form: one shared op per (backend, heads), inputs
    always checked on the Triton backend.
Tests and benchmarks steer the Triton selection with `forced_fused_qkv` and read it with `fused_qkv_choice`
(both from _fused_qkv_select.py, re-exported here; importing this module does not import triton).
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from .rope_cache_write import rope_cache_write_reference

CHECK_ENV = "FLASH_DLLM_CHECK_KERNELS"  # "1": ops built from then on check their inputs on every call
# The selection's public surface, imported from _fused_qkv_select (and triton) on first use.
_SELECT_EXPORTS = ("PATH_ENV", "PATHS", "KERNEL_PATHS", "FusedQKVChoice", "FusedQKVForcing", "forced_fused_qkv",
                   "current_fused_qkv_forcing", "fused_qkv_choice", "fused_qkv_problem_key", "fused_qkv_counters",
                   "fused_qkv_paths", "read_path_request", "tma_blocker", "TuningStore")


def fused_qkv_rope_cache_reference(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    cache_rows: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
) -> torch.Tensor:
    """The unfused path a careful engineer writes in torch: one matmul on the stacked weight (fp32
    accumulation inside the BLAS), RoPE from precomputed tables in fp32, `index_copy_` into the cache."""
    return rope_cache_write_reference(F.linear(x, w_qkv, b_qkv), cos, sin, positions, cache_rows, k_cache, v_cache,
                                      n_heads, n_kv_heads)


def check_fused_qkv_inputs(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache, n_heads: int,
                           n_kv_heads: int, out: torch.Tensor | None = None) -> None:
    """ValueError saying what breaks the contract (shapes, dtypes, contiguity the kernels rely on)."""
    n_qkv_heads = n_heads + 2 * n_kv_heads
    if x.dim() != 2 or w_qkv.dim() != 2 or x.shape[1] != w_qkv.shape[1]:
        raise ValueError(f"x [N, D] and w_qkv [rows, D] must share D, got {tuple(x.shape)} / {tuple(w_qkv.shape)}")
    if w_qkv.shape[0] % n_qkv_heads:
        raise ValueError(f"w_qkv must have (n_heads + 2*n_kv_heads) * head_dim rows: {w_qkv.shape[0]} rows for "
                         f"{n_qkv_heads} heads")
    head_dim = w_qkv.shape[0] // n_qkv_heads
    if x.dtype != w_qkv.dtype:
        raise ValueError(f"x ({x.dtype}) and w_qkv ({w_qkv.dtype}) must share a dtype")
    if head_dim % 2:
        raise ValueError(f"rotate-half RoPE needs an even head dim, got {head_dim}")
    if cos.shape[-1] != head_dim // 2 or sin.shape[-1] != head_dim // 2:
        raise ValueError(f"cos/sin must be [P, {head_dim // 2}], got {tuple(cos.shape)} / {tuple(sin.shape)}")
    for name, t in (("cos", cos), ("sin", sin), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.shape[1] != n_kv_heads * head_dim:
            raise ValueError(f"{name} must be [R, {n_kv_heads * head_dim}], got {tuple(cache.shape)}")
    if b_qkv is not None and b_qkv.shape != (w_qkv.shape[0],):
        raise ValueError(f"b_qkv must be [{w_qkv.shape[0]}], got {tuple(b_qkv.shape)}")
    if positions.shape != (x.shape[0],) or cache_rows.shape != (x.shape[0],):
        raise ValueError("positions and cache_rows must have one entry per token")
    q_shape = (x.shape[0], n_heads * head_dim)
    if out is not None and (out.shape != q_shape or out.dtype != x.dtype or out.stride(-1) != 1):
        raise ValueError(f"out must be {list(q_shape)} {x.dtype}, contiguous in its last dimension; got "
                         f"{tuple(out.shape)} {out.dtype}")


class FusedQKVRopeCache:
    """The op with its constant decisions made once: call it like `fused_qkv_rope_cache` (same contract, plus
    an optional `out` for q; returns q).

    backend "torch" runs the reference; "triton" the fused kernels (triton imported here, at construction).
    check_inputs, or FLASH_DLLM_CHECK_KERNELS=1 at construction, checks every call's inputs (tests, debugging);
    otherwise nothing is checked on the hot path.

    CUDA graphs (triton): the first call of each token bucket tunes and binds; make it eagerly, with the
    buffers (x, w_qkv) and token count the captured calls will use. Captured calls then only launch (q is
    allocated per call from the graph's pool unless `out` is given). A first call inside capture raises.
    """

    def __init__(self, backend: str, n_heads: int, n_kv_heads: int, check_inputs: bool = False):
        if backend not in ("torch", "triton"):
            raise ValueError(f"unknown kernel backend {backend!r}")
        self.backend, self.n_heads, self.n_kv_heads = backend, n_heads, n_kv_heads
        self.check_inputs = check_inputs or os.environ.get(CHECK_ENV, "0") == "1"
        self._triton = None
        if backend == "triton":
            from ._fused_qkv_select import FusedQKVTriton, read_path_request

            self._triton = FusedQKVTriton(n_heads, n_kv_heads, read_path_request())

    def __call__(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        if self.check_inputs:
            check_fused_qkv_inputs(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache, self.n_heads,
                                   self.n_kv_heads, out)
        if self._triton is not None:
            return self._triton(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache, out)
        q = fused_qkv_rope_cache_reference(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache,
                                           self.n_heads, self.n_kv_heads)
        return q if out is None else out.copy_(q)

    def bound_choice(self, x, w_qkv, b_qkv):
        """The FusedQKVChoice (path, config) a triton call on these tensors launches without binding first;
        None before that (and on the torch backend)."""
        return None if self._triton is None else self._triton.bound_choice(x, w_qkv, b_qkv)


@functools.lru_cache(maxsize=None)
def _shared_op(backend: str, n_heads: int, n_kv_heads: int) -> FusedQKVRopeCache:
    return FusedQKVRopeCache(backend, n_heads, n_kv_heads, check_inputs=True)


def fused_qkv_rope_cache(
    x: torch.Tensor,
    w_qkv: torch.Tensor,
    b_qkv: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    cache_rows: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
    backend: str = "torch",
) -> torch.Tensor:
    """Dispatcher: backend "torch" runs the reference; "triton" the fused kernel through a shared, input-checking
    FusedQKVRopeCache (FLASH_DLLM_FUSED_QKV_PATH read once per process). Hot loops build their own op."""
    if backend == "torch":
        return fused_qkv_rope_cache_reference(
            x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache, n_heads, n_kv_heads
        )
    if backend == "triton":
        return _shared_op(backend, n_heads, n_kv_heads)(
            x, w_qkv, b_qkv, cos, sin, positions, cache_rows, k_cache, v_cache
        )
    raise ValueError(f"unknown kernel backend {backend!r}")


def __getattr__(name: str):
    if name in _SELECT_EXPORTS:
        from . import _fused_qkv_select

        return getattr(_fused_qkv_select, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
