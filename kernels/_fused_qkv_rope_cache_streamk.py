"""Hopper (sm90+) "data-parallel + split-K tail" schedule of the fused QKV kernel: no ragged last wave.

Why: with whole-head tiles (what the TMA kernel's wide dots and the RoPE epilogue want) Dream-7B has only 36
column tiles, so at 128 tokens a data-parallel grid keeps 36..72 of 132 SMs busy, and at 1024 tokens its 144
two-head tiles leave a second wave of 12. Narrow column tiles fill the SMs but make every program re-read x.

Schedule (grid = P programs, one per SM): tiles are numbered in the TMA kernel's grouped order; the first
n_full = (tiles // P) * P are data-parallel (program p takes tiles p, p + P, ...; full K loop, fused epilogue
straight away). Each of the remaining tail tiles (fewer than P) is split along K between S = min(P // tail,
K steps) programs, program t*S + s taking K steps [s*iters//S, (s+1)*iters//S) of tail tile t, and storing
its fp32 partial sum in workspace slot p (lo/hi halves of each head apart, the epilogue's layout). With S == 1
a tail tile is whole and gets the fused epilogue at once. (An equal share of all tail K steps per program --
stream-K proper -- measured slower on the H200: ranges straddle two tiles, so twice the partial traffic.)

A second kernel (launched right after, same stream: no atomics, no counters, no spinning) reduces each split
tail tile: it sums its S slots in a fixed order -- so the result is bitwise reproducible -- and runs the same
epilogue (bias, RoPE, q / k-cache / v-cache stores) on row slices. K and V still never exist as activation
tensors; only split tiles' fp32 partial sums pass through the workspace (L2-resident: at most P x 128 x 256
fp32 = 17 MB on a 132-SM H200).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from . import gpu_time_ms, interpreting
from ._fused_qkv_rope_cache_tma import TMA_HEAD_DIM, TensorDescriptor, epilogue, wide_epilogue, wide_mainloop
from ._fused_qkv_rope_cache_triton import _grouped_tile


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qkv_streamk_kernel(
    x_desc, w_desc, ws_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads,
    stride_cos, stride_sin, stride_q, stride_kc, stride_vc,
    HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, HEADS: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    BLOCK_N: tl.constexpr = HEADS * HEAD_DIM
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    n_col_tiles = tl.cdiv(n_qkv_heads, HEADS)
    n_tiles = tl.cdiv(n_tokens, BLOCK_M) * n_col_tiles
    n_full, tail_tiles, splits, iters = _schedule(n_tiles, n_programs, d_model, BLOCK_K)
    ctx = (n_tokens, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
           n_heads, n_kv_heads, n_qkv_heads, stride_cos, stride_sin, stride_q, stride_kc, stride_vc)

    for tile in range(pid, n_full, n_programs):  # data-parallel waves
        pid_m, pid_n = _grouped_tile(tile, n_tokens, n_col_tiles, BLOCK_M, 1, GROUP_M)
        acc = wide_mainloop(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, d_model, UPCAST, DOT_PRECISION,
                            BLOCK_M, BLOCK_N, BLOCK_K)
        wide_epilogue(acc, pid_n * HEADS, pid_m * BLOCK_M, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M, HEADS)

    if pid < tail_tiles * splits:  # one K range of one tail tile
        split = pid % splits
        pid_m, pid_n = _grouped_tile(n_full + pid // splits, n_tokens, n_col_tiles, BLOCK_M, 1, GROUP_M)
        acc = wide_mainloop(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, split * iters // splits * BLOCK_K,
                            (split + 1) * iters // splits * BLOCK_K, UPCAST, DOT_PRECISION, BLOCK_M, BLOCK_N,
                            BLOCK_K)
        if splits == 1:
            wide_epilogue(acc, pid_n * HEADS, pid_m * BLOCK_M, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M, HEADS)
        else:
            _store_partial(ws_ptr + pid.to(tl.int64) * (BLOCK_M * BLOCK_N), acc, HEAD_DIM, BLOCK_M, HEADS)


@triton.jit
def _schedule(n_tiles, n_programs, d_model, BLOCK_K: tl.constexpr):
    """(data-parallel tiles, tail tiles, programs per tail tile, K steps per tile); host mirror: schedule()."""
    n_full = n_tiles // n_programs * n_programs
    tail_tiles = n_tiles - n_full
    iters = tl.cdiv(d_model, BLOCK_K)
    return n_full, tail_tiles, tl.minimum(n_programs // tl.maximum(tail_tiles, 1), iters), iters


@triton.jit
def _store_partial(slot_ptr, acc, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, HEADS: tl.constexpr):
    """Store a [BLOCK_M, HEADS*Dh] fp32 partial as pieces [HEADS, 2 (lo, hi), BLOCK_M, Dh/2] (the epilogue's
    split: no [BLOCK_M, 256] fp32 layout conversion through shared memory)."""
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, BLOCK_M)[:, None] * HALF + tl.arange(0, HALF)[None, :]
    PIECE: tl.constexpr = BLOCK_M * HALF
    if HEADS == 1:
        lo, hi = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, HALF]), (0, 2, 1)))
        tl.store(slot_ptr + offs, lo)
        tl.store(slot_ptr + PIECE + offs, hi)
    else:
        acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, [BLOCK_M, 2, 2, HALF]), (0, 3, 2, 1)))
        lo, hi = tl.split(acc0)
        tl.store(slot_ptr + offs, lo)
        tl.store(slot_ptr + PIECE + offs, hi)
        lo, hi = tl.split(acc1)
        tl.store(slot_ptr + 2 * PIECE + offs, lo)
        tl.store(slot_ptr + 3 * PIECE + offs, hi)


@triton.jit(do_not_specialize=["n_tokens"])
def _fused_qkv_streamk_reduce_kernel(
    ws_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads, n_programs,
    stride_cos, stride_sin, stride_q, stride_kc, stride_vc,
    HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, HEADS: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ROWS: tl.constexpr, CHUNK: tl.constexpr,
):
    """One program per (split tail tile, ROWS-row slice): sum the tile's slots in split order, CHUNK slots per
    load (one memory round trip per chunk instead of one per slot), then the epilogue of each head."""
    HALF: tl.constexpr = HEAD_DIM // 2
    PIECE: tl.constexpr = BLOCK_M * HALF
    SLICES: tl.constexpr = BLOCK_M // ROWS
    tail_tile = tl.program_id(0) // SLICES
    row0 = (tl.program_id(0) % SLICES) * ROWS
    n_col_tiles = tl.cdiv(n_qkv_heads, HEADS)
    n_full, tail_tiles, splits, iters = _schedule(tl.cdiv(n_tokens, BLOCK_M) * n_col_tiles, n_programs, d_model,
                                                  BLOCK_K)
    pid_m, pid_n = _grouped_tile(n_full + tail_tile, n_tokens, n_col_tiles, BLOCK_M, 1, GROUP_M)
    ctx = (n_tokens, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
           n_heads, n_kv_heads, n_qkv_heads, stride_cos, stride_sin, stride_q, stride_kc, stride_vc)
    offs = (row0 + tl.arange(0, ROWS))[:, None] * HALF + tl.arange(0, HALF)[None, :]
    for h in tl.static_range(HEADS):
        lo = tl.zeros([ROWS, HALF], dtype=tl.float32)
        hi = tl.zeros([ROWS, HALF], dtype=tl.float32)
        for first in range(0, splits, CHUNK):
            split = first + tl.arange(0, CHUNK)
            slot = (tail_tile * splits + split).to(tl.int64) * (HEADS * 2 * PIECE) + 2 * h * PIECE
            ptrs = ws_ptr + slot[:, None, None] + offs[None, :, :]
            valid = (split < splits)[:, None, None]
            lo += tl.sum(tl.load(ptrs, mask=valid, other=0.0), axis=0)
            hi += tl.sum(tl.load(ptrs + PIECE, mask=valid, other=0.0), axis=0)
        epilogue(lo, hi, pid_n * HEADS + h, pid_m * BLOCK_M + row0, 0, ctx, HEAD_DIM, HAS_BIAS, ROWS, HALF)


def schedule(n_tiles: int, n_programs: int, d_model: int, block_k: int) -> tuple[int, int, int, int]:
    """Host mirror of _schedule: (data-parallel tiles, tail tiles, programs per tail tile, K steps per tile)."""
    n_full = n_tiles // n_programs * n_programs
    tail_tiles = n_tiles - n_full
    iters = -(-d_model // block_k)
    return n_full, tail_tiles, min(n_programs // max(tail_tiles, 1), iters), iters


# ---- host side ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StreamKConfig:
    block_m: int
    heads: int  # whole heads per tile (1 or 2): tile width heads * 128
    block_k: int
    stages: int
    warps: int

    @property
    def meta(self) -> dict:
        return {"BLOCK_M": self.block_m, "HEADS": self.heads, "BLOCK_K": self.block_k, "GROUP_M": 8}


# Small token counts are weight streams: one-head tiles over all SMs, deep pipelines on one warpgroup (the
# split-K probe's best Dream shape). Large ones are compute bound: two-head 128 x 256 tiles on two warpgroups,
# whose one-wave-plus-a-bit shapes (Dream at 1024 tokens: 144 tiles) are what the tail split is for. The last
# two fit fp32 inputs in shared memory (the others do not; the tuner skips what does not fit).
CUDA_CONFIGS = [StreamKConfig(*c) for c in ((128, 1, 64, 5, 4), (128, 1, 64, 4, 4), (128, 1, 128, 3, 4),
                                            (64, 1, 64, 6, 4), (128, 2, 64, 4, 8), (128, 2, 64, 3, 8),
                                            (64, 1, 32, 3, 4), (128, 2, 32, 2, 8))]
# Interpreter: few, small tiles and a prime number of "SMs", so the tests' small problems have data-parallel
# tiles, whole tail tiles (S == 1) and tail tiles split 2 or 3 ways (more than one chunk with CHUNK 2).
INTERPRETER_CONFIGS = {"one_head": StreamKConfig(16, 1, 32, 1, 4), "two_heads": StreamKConfig(16, 2, 16, 1, 4)}
interpreter_config = INTERPRETER_CONFIGS["one_head"]  # tests swap in the other
INTERPRETER_PROGRAMS = 7
REDUCE_ROWS = 16
REDUCE_CHUNK = 4  # slots summed per load in the reduce kernel

_WORKSPACES: dict = {}


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def n_programs_for(device: torch.device) -> int:
    if interpreting():
        return INTERPRETER_PROGRAMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _workspace(device: torch.device, n_elems: int) -> torch.Tensor:
    """A cached fp32 buffer of at least n_elems on device (grown, never shrunk; no zeros needed: every slot
    the reduce kernel reads was written by the launch before it). One stream per device (the engine's)."""
    ws = _WORKSPACES.get(device)
    if ws is None or ws.numel() < n_elems:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the fused QKV stream-K workspace would grow inside CUDA graph capture: run the same "
                               "call once before capturing it")
        ws = torch.empty(max(n_elems, 1), dtype=torch.float32, device=device)
        _WORKSPACES[device] = ws
    return ws


def launch_streamk(x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache, n_heads, n_kv_heads,
                   config: StreamKConfig):
    """Run the stream-K kernel and, when there are tail tiles, its reduce kernel (inputs already checked)."""
    n_tokens, d_model = x.shape
    n_qkv_heads = n_heads + 2 * n_kv_heads
    block_m, heads, block_k = config.block_m, config.heads, config.block_k
    block_n = heads * TMA_HEAD_DIM
    n_programs = n_programs_for(x.device)
    ws = _workspace(x.device, n_programs * block_m * block_n)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w_qkv, [block_n, block_k])
    b = b_qkv if b_qkv is not None else w_qkv
    epilogue_args = (b, cos, sin, positions, cache_rows, q, k_cache, v_cache)
    strides = (cos.stride(0), sin.stride(0), q.stride(0), k_cache.stride(0), v_cache.stride(0))
    flags = {"HEAD_DIM": TMA_HEAD_DIM, "HAS_BIAS": b_qkv is not None}
    _fused_qkv_streamk_kernel[(n_programs,)](
        x_desc, w_desc, ws, *epilogue_args, n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads, *strides,
        **flags, UPCAST=interpreting(), DOT_PRECISION="ieee" if x.dtype.itemsize == 4 else "tf32",
        **config.meta, num_stages=config.stages, num_warps=config.warps,
    )
    n_tiles = triton.cdiv(n_tokens, block_m) * triton.cdiv(n_qkv_heads, heads)
    _, tail_tiles, splits, _ = schedule(n_tiles, n_programs, d_model, block_k)
    if tail_tiles and splits > 1:
        rows = min(REDUCE_ROWS, block_m)
        _fused_qkv_streamk_reduce_kernel[(tail_tiles * (block_m // rows),)](
            ws, *epilogue_args, n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads, n_programs, *strides,
            **flags, **config.meta, ROWS=rows, CHUNK=2 if interpreting() else REDUCE_CHUNK, num_warps=4,
        )
    return q


_BEST: dict = {}


def streamk_config(key: tuple, run) -> StreamKConfig:
    """The stream-K config for this problem key: under the interpreter `interpreter_config`; on a GPU the
    fastest of CUDA_CONFIGS, each timed with its reduce kernel (run(config) launches both), once per key."""
    if interpreting():
        return interpreter_config
    best = _BEST.get(key)
    if best is None:
        if torch.cuda.is_current_stream_capturing():
            return CUDA_CONFIGS[0]  # no timing inside a capture; an eager call first picks the best
        times = {}
        for config in CUDA_CONFIGS:
            try:
                times[config] = gpu_time_ms(lambda: run(config))
            except OutOfResources:  # shared memory: fp32 inputs, or a smaller Hopper part
                continue
        if not times:
            raise RuntimeError(f"no stream-K config of the fused QKV kernel fits this GPU for key {key}")
        best = _BEST[key] = min(times, key=times.get)
    return best


def tuned_streamk_config(key: tuple) -> StreamKConfig | None:
    """The config chosen for key so far (None before the first call), e.g. for a benchmark's report."""
    return interpreter_config if interpreting() else _BEST.get(key)
