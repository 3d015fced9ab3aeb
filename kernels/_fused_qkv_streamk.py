"""Hopper (sm90+) "data-parallel + stream-K tail" schedule of the fused QKV kernel: no ragged last wave.

Why: with whole-head tiles (what the TMA kernel's wide dots and the RoPE epilogue want) Dream-7B has only 36
column tiles, so at 128 tokens a data-parallel grid keeps 36..72 of 132 SMs busy, and at 1024 tokens its 144
two-head tiles leave a second wave of 12. Narrow column tiles fill the SMs but make every program re-read x.

Schedule (grid = P programs, one per SM; the host computes it, `schedule`): tiles are numbered in the TMA
kernel's grouped order. The first n_full = (tiles // P) * P are data-parallel (program p takes tiles p, p + P,
...; full K loop, fused epilogue straight away). The K steps of the remaining tail tiles, laid end to end,
are cut into G equal ranges, one per tail program:
  * aligned (G = tail x S with S = min(P // tail, K steps)): each range is 1/S of one tile;
  * balanced (G = P): every program gets the same number of K steps, so a range may end inside one tile and
    go on into the next (stream-K proper: all SMs busy to the end, more partial sums).
A piece that covers a whole tile gets the fused epilogue at once. A partial piece stores its fp32 sum in the
workspace (slot 2p for a program's first piece, 2p + 1 for a later one; lo/hi halves of each head apart, the
epilogue's layout) and counts itself in on the tile's arrival counter; the program that arrives last sums
the tile's partials in contributor order -- its own re-read too -- so the result is bitwise reproducible
whatever the arrival order, runs the epilogue (bias, RoPE, q / k-cache / v-cache stores) and resets the
counter for the next launch. Nobody waits on anybody (no spinning, so no co-residency assumption, and the
interpreter's one-program-at-a-time run is valid), and there is no second kernel: the separate reduce kernel
this replaced measured slower on the H200 at every Dream size (Dream 128: 24.2 against 22.5 us). Finishing is
still the costly part at small token counts: dependent L2 round trips, README "Where Dream's time goes".
K and V still never exist as activation tensors; only partial sums pass through the workspace (L2-resident).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import interpreting
from ._fused_qkv_common import (TMA_HEAD_DIM, FusedQKVProblem, dot_precision, epilogue, grouped_tile, head_halves,
                                make_descriptor, wide_epilogue, wide_mainloop)


@triton.jit(do_not_specialize=["n_tokens", "n_full", "tail_tiles", "tail_programs", "iters"])
def _fused_qkv_streamk_kernel(
    x_desc, w_desc, ws_ptr, arrivals_ptr, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr,
    v_cache_ptr, n_tokens, d_model, n_heads, n_kv_heads, n_qkv_heads, n_full, tail_tiles, tail_programs, iters,
    stride_cos, stride_sin, stride_q, stride_kc, stride_vc,
    HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, HEADS: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FIX_ROWS: tl.constexpr,
):
    BLOCK_N: tl.constexpr = HEADS * HEAD_DIM
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    n_col_tiles = tl.cdiv(n_qkv_heads, HEADS)
    ctx = (n_tokens, b_ptr, cos_ptr, sin_ptr, pos_ptr, rows_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
           n_heads, n_kv_heads, n_qkv_heads, stride_cos, stride_sin, stride_q, stride_kc, stride_vc)

    for tile in range(pid, n_full, n_programs):  # data-parallel waves
        pid_m, pid_n = grouped_tile(tile, n_tokens, n_col_tiles, BLOCK_M, 1, GROUP_M)
        acc = wide_mainloop(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, d_model, UPCAST, DOT_PRECISION,
                            BLOCK_M, BLOCK_N, BLOCK_K)
        wide_epilogue(acc, pid_n * HEADS, pid_m * BLOCK_M, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M, HEADS)

    if pid < tail_programs:  # this program's range of the tail's K steps, tile by tile
        work = tail_tiles * iters
        start = _range_start(pid, work, tail_programs)
        end = _range_start(pid + 1, work, tail_programs)
        step = start
        while step < end:
            tile = step // iters
            tile_begin = tile * iters
            piece_end = tl.minimum(end - tile_begin, iters)  # K steps within the tile
            pid_m, pid_n = grouped_tile(n_full + tile, n_tokens, n_col_tiles, BLOCK_M, 1, GROUP_M)
            acc = wide_mainloop(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, (step - tile_begin) * BLOCK_K,
                                piece_end * BLOCK_K, UPCAST, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)
            first = _range_owner(tile_begin, work, tail_programs)
            last = _range_owner(tile_begin + iters - 1, work, tail_programs)
            if first == last:  # the whole tile: no partial sums
                wide_epilogue(acc, pid_n * HEADS, pid_m * BLOCK_M, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M, HEADS)
            else:
                _share_partial(acc, ws_ptr, arrivals_ptr + tile, pid, first, last, tile_begin, work,
                               tail_programs, pid_n * HEADS, pid_m * BLOCK_M, ctx, HEAD_DIM, HAS_BIAS, BLOCK_M,
                               HEADS, FIX_ROWS)
            step = tile_begin + piece_end


@triton.jit
def _range_start(program, work, n_ranges):
    """First tail K step of `program`'s range (ranges: `work` steps cut into n_ranges equal parts)."""
    return program * work // n_ranges


@triton.jit
def _range_owner(step, work, n_ranges):
    """The program whose range holds tail K step `step`: the largest p with p * work // n_ranges <= step."""
    return ((step + 1) * n_ranges + work - 1) // work - 1


@triton.jit
def _slot(program, tile_begin, work, n_ranges, SLOT_ELEMS: tl.constexpr):
    """Element offset of `program`'s partial of the tile starting at tail step tile_begin: slot 2p when the
    tile is where its range starts, 2p + 1 when the range started in an earlier tile."""
    later = (_range_start(program, work, n_ranges) < tile_begin).to(tl.int64)
    return (2 * program + later) * SLOT_ELEMS  # int64 through `later`


@triton.jit
def _share_partial(acc, ws_ptr, arrival_ptr, pid, first, last, tile_begin, work, n_ranges, head0, off_m, ctx,
                   HEAD_DIM: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, HEADS: tl.constexpr,
                   FIX_ROWS: tl.constexpr):
    """Publish this program's partial of a split tile; the last of its contributors finishes the tile: per head
    and per FIX_ROWS-row slice (what fits in registers next to the epilogue), the partials in contributor order
    -- its own too, re-read: the same sum whoever arrives last -- then the epilogue."""
    HALF: tl.constexpr = HEAD_DIM // 2
    PIECE: tl.constexpr = BLOCK_M * HALF
    SLOT_ELEMS: tl.constexpr = 2 * HEADS * PIECE
    offs = tl.arange(0, BLOCK_M)[:, None] * HALF + tl.arange(0, HALF)[None, :]
    slot_ptr = ws_ptr + _slot(pid, tile_begin, work, n_ranges, SLOT_ELEMS)
    for h in tl.static_range(HEADS):  # layout [HEADS, 2 (lo, hi), BLOCK_M, Dh/2]
        lo, hi = head_halves(acc, h, HEAD_DIM, BLOCK_M, HEADS)
        tl.store(slot_ptr + 2 * h * PIECE + offs, lo)
        tl.store(slot_ptr + (2 * h + 1) * PIECE + offs, hi)
    # Every warp's stores precede the arrival (one thread's gpu-scope acq_rel atomic after a CTA barrier); the
    # last contributor's loads follow its own acquire and bypass L1 (.cg).
    tl.debug_barrier()
    arrived = tl.atomic_add(arrival_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == last - first:
        tl.store(arrival_ptr, 0)  # every contributor has counted in: ready for the next launch
        slice_offs = tl.arange(0, FIX_ROWS)[:, None] * HALF + tl.arange(0, HALF)[None, :]
        for h in tl.static_range(HEADS):
            for row0 in tl.static_range(0, BLOCK_M, FIX_ROWS):
                lo_sum = tl.zeros([FIX_ROWS, HALF], dtype=tl.float32)
                hi_sum = tl.zeros([FIX_ROWS, HALF], dtype=tl.float32)
                for program in range(first, last + 1):
                    ptr = (ws_ptr + _slot(program, tile_begin, work, n_ranges, SLOT_ELEMS) + 2 * h * PIECE
                           + row0 * HALF + slice_offs)
                    lo_sum += tl.load(ptr, cache_modifier=".cg")
                    hi_sum += tl.load(ptr + PIECE, cache_modifier=".cg")
                epilogue(lo_sum, hi_sum, head0 + h, off_m + row0, 0, ctx, HEAD_DIM, HAS_BIAS, FIX_ROWS, HALF)


# ---- host side ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TailSchedule:
    n_full: int  # data-parallel tiles (a multiple of the program count)
    tail_tiles: int
    tail_programs: int  # G: programs sharing the tail's K steps in equal ranges
    iters: int  # K steps per tile


def schedule(n_tiles: int, n_programs: int, d_model: int, block_k: int, balanced: bool) -> TailSchedule:
    """The data-parallel / tail split of n_tiles over n_programs (see the module docstring)."""
    n_full = n_tiles // n_programs * n_programs
    tail_tiles = n_tiles - n_full
    iters = -(-d_model // block_k)
    if tail_tiles == 0:
        tail_programs = 0
    elif balanced:
        tail_programs = min(n_programs, tail_tiles * iters)
    else:
        tail_programs = tail_tiles * min(n_programs // tail_tiles, iters)
    return TailSchedule(n_full, tail_tiles, tail_programs, iters)


@dataclass(frozen=True)
class StreamKConfig:
    block_m: int
    heads: int  # whole heads per tile (1 or 2): tile width heads * 128
    block_k: int
    stages: int
    warps: int
    balanced: bool = False  # tail K steps in P equal ranges (True) or split tile by tile (False)

    @property
    def meta(self) -> dict:
        # Finishing a split tile: FIX_ROWS rows per slice, 8 per warp (a whole 128-row slice on one warpgroup
        # spilled 1.7 KB at sm90; loading several contributors per round trip measured no faster)
        return {"BLOCK_M": self.block_m, "HEADS": self.heads, "BLOCK_K": self.block_k, "GROUP_M": 8,
                "FIX_ROWS": min(self.block_m, 8 * self.warps)}


# Small token counts are weight streams: one-head tiles over all SMs, deep pipelines on one warpgroup (the
# split-K probe's best Dream shape), or on two (half the rows per warp when a split tile is finished). Large
# ones are compute bound: two-head 128 x 256 tiles on two warpgroups, whose one-wave-plus-a-bit shapes (Dream at
# 1024 tokens: 144 tiles) are what the tail split is for. The last two fit fp32 inputs in shared memory (the
# others do not; the tuner skips what does not fit). Each shape is tried with an aligned and a balanced tail
# (one compiled kernel: the tail split is a runtime argument).
_CUDA_SHAPES = ((128, 1, 64, 5, 4), (128, 1, 64, 4, 4), (128, 1, 128, 3, 4), (64, 1, 64, 6, 4), (128, 2, 64, 4, 8),
                (128, 2, 64, 3, 8), (128, 1, 64, 5, 8), (128, 1, 64, 4, 8), (64, 1, 32, 3, 4), (128, 2, 32, 2, 8))
CUDA_CONFIGS = tuple(StreamKConfig(*shape, balanced) for shape in _CUDA_SHAPES for balanced in (False, True))
# Interpreter: few, small tiles and a prime number of "SMs", so the tests' small problems have data-parallel
# tiles, whole tail tiles, tiles split 2 or 3 ways, and (balanced) ranges that run from one tile into the next.
# The default runs "one_head"; tests force the others (forced_fused_qkv(streamk_configs=...)).
INTERPRETER_CONFIGS = {"one_head": StreamKConfig(16, 1, 32, 1, 4), "two_heads": StreamKConfig(16, 2, 16, 1, 4),
                       "one_head_balanced": StreamKConfig(16, 1, 16, 1, 4, balanced=True)}
INTERPRETER_PROGRAMS = 7


def default_configs(bucket: int) -> tuple[StreamKConfig, ...]:
    """What the tuner tries (every bucket: the tail split adapts the shapes to the token count)."""
    return (INTERPRETER_CONFIGS["one_head"],) if interpreting() else CUDA_CONFIGS


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def n_programs_for(device: torch.device) -> int:
    if interpreting():
        return INTERPRETER_PROGRAMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class StreamKBuffers:
    workspace: torch.Tensor  # fp32 partial sums; no zeros needed: a contributor reads only slots of its launch
    arrivals: torch.Tensor  # int32 arrival counter per tail tile, zeroed once: every launch leaves them zero


_BUFFERS: dict = {}  # device -> StreamKBuffers (grown, never shrunk; one stream per device: the engine's)


def streamk_buffers(device: torch.device) -> StreamKBuffers | None:
    """The device's current workspace and arrival counters (None before the first stream-K launcher)."""
    return _BUFFERS.get(torch.device(device))


def reserve_buffers(device: torch.device, n_elems: int, n_programs: int) -> StreamKBuffers:
    """Buffers of at least n_elems fp32 partials and n_programs counters; grown outside CUDA graph capture only
    (a launcher keeps what it got, so a graph captured with it keeps valid memory)."""
    buffers = _BUFFERS.get(device)
    if buffers is not None and buffers.workspace.numel() >= n_elems and buffers.arrivals.numel() >= n_programs:
        return buffers
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the fused QKV stream-K buffers would grow inside CUDA graph capture: run the same "
                           "call once before capturing it")
    workspace, arrivals = (buffers.workspace, buffers.arrivals) if buffers is not None else (None, None)
    if workspace is None or workspace.numel() < n_elems:
        workspace = torch.empty(max(n_elems, 1), dtype=torch.float32, device=device)
    if arrivals is None or arrivals.numel() < n_programs:
        arrivals = torch.zeros(n_programs, dtype=torch.int32, device=device)
    buffers = _BUFFERS[device] = StreamKBuffers(workspace, arrivals)
    return buffers


class StreamKLauncher:
    """The stream-K kernel bound to one config, one problem and one (x, w_qkv) pair: schedule, descriptors and
    buffers fixed (x and w_qkv passed to a call are not read; the caller keys launchers on them).

    The workspace is reserved for the config's worst tail (every program holding two partial slots), so any
    token count of the bucket fits what an eager call reserved: a captured call never allocates.
    """

    path = "streamk"

    def __init__(self, config: StreamKConfig, problem: FusedQKVProblem, x, w_qkv):
        self.config = config
        self.q_shape = problem.q_shape
        block_n = config.heads * TMA_HEAD_DIM
        n_programs = n_programs_for(problem.device)
        n_tiles = triton.cdiv(problem.n_tokens, config.block_m) * triton.cdiv(problem.n_qkv_heads, config.heads)
        plan = schedule(n_tiles, n_programs, problem.d_model, config.block_k, config.balanced)
        self.buffers = reserve_buffers(problem.device, 2 * n_programs * config.block_m * block_n, n_programs)
        self.x_desc = make_descriptor(x, [config.block_m, config.block_k])
        self.w_desc = make_descriptor(w_qkv, [block_n, config.block_k])
        self.grid = (n_programs,)
        self.sizes = (problem.n_tokens, problem.d_model, problem.n_heads, problem.n_kv_heads, problem.n_qkv_heads,
                      plan.n_full, plan.tail_tiles, plan.tail_programs, plan.iters)
        self.meta = {**config.meta, "HEAD_DIM": TMA_HEAD_DIM, "HAS_BIAS": problem.has_bias, "UPCAST": interpreting(),
                     "DOT_PRECISION": dot_precision(problem.dtype), "num_stages": config.stages,
                     "num_warps": config.warps}

    def __call__(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache) -> None:
        _fused_qkv_streamk_kernel[self.grid](
            self.x_desc, self.w_desc, self.buffers.workspace, self.buffers.arrivals,
            b_qkv if b_qkv is not None else w_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache,
            *self.sizes,
            cos.stride(0), sin.stride(0), q.stride(0), k_cache.stride(0), v_cache.stride(0),
            **self.meta,
        )
