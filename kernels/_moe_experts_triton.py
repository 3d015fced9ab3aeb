"""The Triton path behind `MoEExperts` (contract: see moe_experts.py): route, two grouped GEMMs, one reduction.

Pairs: the T * K (token, slot) pairs, pair p = t * K + k, routed to expert topk_ids[t, k]. One call runs

  1. a stable sort of the flat expert ids (torch, on the device, no host sync) gives `sorted_ids` and
     `sorted_pairs` (pair ids grouped by expert: sorted row r holds pair sorted_pairs[r]);
  2. `_tile_schedule_kernel` (one program) finds each expert's rows start_e .. end_e - 1 by a binary search
     of sorted_ids; expert e needs cdiv(end_e - start_e, BLOCK_M) M tiles, and the tiles of all experts are
     numbered in expert order, each with its (expert, first row, end row);
  3. `_gate_up_kernel`: each program owns one M tile (up to BLOCK_M rows of ONE expert) and BLOCK_F columns
     of F. It gathers its tokens' x rows and multiplies them by the expert's gate and up rows, read
     interleaved (gate f, up f, gate f+1, ...) so one dot as wide as the tile yields both and the epilogue
     splits them in registers: act = silu(gate) * up, stored in x's dtype at the sorted row;
  4. `_down_kernel`: the same M tiles times the expert's w_down, fp32, stored at the *pair's* row of a
     [T * K, D] fp32 buffer (not the sorted row), so
  5. `_sum_pairs_kernel` adds each token's K rows in slot order k = 0 .. K-1, weighted, and rounds once:
     no atomics anywhere, so the result is bit-reproducible.

The GEMM grids are sized for the worst case, `max_m_tiles` (a static bound, so CUDA graphs can capture them);
programs past the real tile count return at once. Experts with no rows get no tile, so their weights are never
read, and an expert's weights are read once per column block whatever its token count (several times only
when its rows span several M tiles, i.e. at prefill sizes where the GEMM is compute bound).

Launch sizes (`MoETiles`) are picked per call shape by `choose_tiles` from the average rows per expert and
cached; tests and benchmarks pass their own. Interpreted runs upcast bf16 after loads (the interpreter's bf16
arithmetic is wrong) and round bf16 stores on the bits (it truncates).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import interpreting
from ._add_rms_norm_triton import round_to_storage
from ._fused_qkv_common import dot_precision

_INTERPRETED = interpreting()
_MAX_SUM_BLOCK = 1024  # columns per reduction program


@dataclass(frozen=True)
class MoETiles:
    """Block sizes of one launch (both GEMMs share block_m and block_k)."""

    block_m: int  # sorted rows (token-expert pairs) of one expert per program
    block_f: int  # gate/up GEMM: columns of F per program (it reads 2 * block_f weight rows: gate and up)
    block_d: int  # down GEMM: columns of D per program
    block_k: int  # reduction step of both GEMMs
    warps: int = 4
    stages: int = 3


# Decode (a few rows per expert) streams weights: 16-row tiles, narrow columns so many programs are in
# flight, deep K steps. Prefill (hundreds of rows per expert) is compute bound: taller tiles reuse each
# weight tile over more rows. Untuned guesses until benchmarks/bench_moe.py has been swept on the GPU.
GPU_TILES = {
    16: MoETiles(block_m=16, block_f=32, block_d=128, block_k=128, warps=4, stages=3),
    32: MoETiles(block_m=32, block_f=32, block_d=128, block_k=128, warps=4, stages=3),
    64: MoETiles(block_m=64, block_f=64, block_d=128, block_k=64, warps=4, stages=3),
}
INTERPRETER_TILES = MoETiles(block_m=32, block_f=64, block_d=128, block_k=128, warps=4, stages=1)  # few programs


def choose_tiles(n_pairs: int, n_experts: int) -> MoETiles:
    """The tile sizes for a call, from the mean rows per expert that got any (pairs spread evenly). Routing is
    uneven, so block_m is meant to hold 1.5x the mean: most experts then fit one M tile and each weight block
    is read once (an expert spilling into a second tile reads it again, mostly from L2)."""
    if _INTERPRETED:
        return INTERPRETER_TILES
    rows_wanted = 1.5 * n_pairs / max(1, min(n_experts, n_pairs))
    return GPU_TILES[16 if rows_wanted <= 16 else 32 if rows_wanted <= 32 else 64]


def max_m_tiles(n_pairs: int, n_experts: int, block_m: int) -> int:
    """An upper bound on sum_e cdiv(count_e, block_m) over every split of n_pairs rows among n_experts.

    Each expert with rows adds at most (count_e + block_m - 1) / block_m, so the sum is at most
    floor((n_pairs + used * (block_m - 1)) / block_m) <= n_pairs // block_m + used, with used <= min(E, pairs);
    and no tile is empty, so it is also at most n_pairs."""
    return min(n_pairs, n_pairs // block_m + min(n_experts, n_pairs))


@triton.jit
def _first_row_of(sorted_ids_ptr, n_pairs, search_steps, expert):
    """Per lane: how many sorted ids are below `expert` (its first sorted row): lower_bound by bisection."""
    lo = tl.zeros_like(expert)
    hi = lo + n_pairs
    for _ in range(search_steps):  # ceil(log2(n_pairs + 1)) halvings close every interval
        open_ = lo < hi
        mid = (lo + hi) // 2
        below = tl.load(sorted_ids_ptr + mid, mask=open_, other=0) < expert
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
    return lo


@triton.jit
def _tile_schedule_kernel(sorted_ids_ptr, schedule_ptr, n_pairs, search_steps, n_experts, m_tiles,
                          BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr):
    """One program: for every M tile i < m_tiles, schedule[0, i] = its expert (n_experts past the last real
    tile), schedule[1, i] = its first sorted row, schedule[2, i] = its expert's end row.

    Every expert writes its own tiles, one tile of each expert per step, so the work is E lanes times the most
    tiles any expert has (1 or 2 at decode sizes) plus one pass that marks the unused tail of the grid."""
    e = tl.arange(0, BLOCK_E)
    real = e < n_experts
    start = _first_row_of(sorted_ids_ptr, n_pairs, search_steps, e)
    end = _first_row_of(sorted_ids_ptr, n_pairs, search_steps, e + 1)
    tiles = tl.where(real, (end - start + BLOCK_M - 1) // BLOCK_M, 0)
    first_tile = tl.cumsum(tiles, axis=0) - tiles
    n_real = tl.sum(tiles, axis=0)
    for chunk in range(0, m_tiles, CHUNK):
        tile = chunk + tl.arange(0, CHUNK)
        past = (tile >= n_real) & (tile < m_tiles)
        tl.store(schedule_ptr + tile, tl.full([CHUNK], 0, tl.int32) + n_experts, mask=past)
    for j in range(0, tl.max(tiles, axis=0)):
        has = j < tiles
        slot = first_tile + j
        tl.store(schedule_ptr + slot, e, mask=has)
        tl.store(schedule_ptr + m_tiles + slot, start + j * BLOCK_M, mask=has)
        tl.store(schedule_ptr + 2 * m_tiles + slot, end, mask=has)


@triton.jit
def _scheduled_tile(schedule_ptr, m_tiles, n_blocks):
    """(expert, first sorted row, end sorted row, column block) of this program. The column blocks of one M tile
    are consecutive programs, so its gathered x rows are read from memory once and then hit L2 (at prefill
    sizes x is tens of MB); the weights do not care (each column block of an expert is read by its own tiles)."""
    tile = tl.program_id(0) // n_blocks
    expert = tl.load(schedule_ptr + tile)
    row0 = tl.load(schedule_ptr + m_tiles + tile)
    row_end = tl.load(schedule_ptr + 2 * m_tiles + tile)
    return expert, row0, row_end, tl.program_id(0) % n_blocks


@triton.jit
def _rows_dot(a_rows, w_cols, k_size, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, EVEN_K: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N] = A @ W^T over k_size, from row pointers a_rows [BLOCK_M] and w_cols [BLOCK_N]
    (both point at element 0 of a contiguous row). Rows arrive wrapped into range; only a K tail is masked."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_rows[:, None] + offs_k[None, :]
    w_ptrs = w_cols[None, :] + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k_size, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = offs_k < k_size - k0
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:  # the interpreter multiplies bf16 bit patterns; do its math in fp32
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    return acc


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, schedule_ptr, sorted_pairs_ptr, act_ptr,
    n_experts, m_tiles, n_blocks, d_model, ffn, top_k, stride_x, stride_we, stride_wn, stride_act,
    BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, ROUND_BF16_BY_BITS: tl.constexpr,
):
    expert, row0, row_end, f_block = _scheduled_tile(schedule_ptr, m_tiles, n_blocks)
    if expert >= n_experts:
        return
    rows = row0 + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pairs_ptr + tl.minimum(rows, row_end - 1))  # tail rows repeat the last real one
    tokens = (pairs // top_k).to(tl.int64)
    # Tile column c: F column f = c // 2; even c reads gate row f, odd c reads up row F + f.
    offs_c = tl.arange(0, 2 * BLOCK_F)
    f_c = f_block * BLOCK_F + offs_c // 2
    w_rows = f_c % ffn + (offs_c % 2) * ffn
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    acc = _rows_dot(x_ptr + tokens * stride_x, w_expert + w_rows.to(tl.int64) * stride_wn, d_model,
                    UPCAST, DOT_PRECISION, EVEN_K, BLOCK_M, 2 * BLOCK_F, BLOCK_K)
    gate, up = tl.split(tl.reshape(acc, [BLOCK_M, BLOCK_F, 2]))
    act = gate / (1.0 + tl.exp(-gate)) * up
    act = round_to_storage(act, act_ptr.dtype.element_ty, ROUND_BF16_BY_BITS)
    offs_f = f_block * BLOCK_F + tl.arange(0, BLOCK_F)
    store_ok = (rows < row_end)[:, None] & (offs_f < ffn)[None, :]
    tl.store(act_ptr + rows.to(tl.int64)[:, None] * stride_act + offs_f[None, :], act, mask=store_ok)


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, schedule_ptr, sorted_pairs_ptr, y_ptr,
    n_experts, m_tiles, n_blocks, d_model, ffn, stride_act, stride_we, stride_wn, stride_y,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    expert, row0, row_end, d_block = _scheduled_tile(schedule_ptr, m_tiles, n_blocks)
    if expert >= n_experts:
        return
    rows = row0 + tl.arange(0, BLOCK_M)
    rows_in = tl.minimum(rows, row_end - 1)
    offs_d = d_block * BLOCK_D + tl.arange(0, BLOCK_D)
    w_expert = w_ptr + expert.to(tl.int64) * stride_we
    acc = _rows_dot(act_ptr + rows_in.to(tl.int64) * stride_act, w_expert + (offs_d % d_model).to(tl.int64) * stride_wn,
                    ffn, UPCAST, DOT_PRECISION, EVEN_K, BLOCK_M, BLOCK_D, BLOCK_K)
    pairs = tl.load(sorted_pairs_ptr + rows_in).to(tl.int64)
    store_ok = (rows < row_end)[:, None] & (offs_d < d_model)[None, :]
    tl.store(y_ptr + pairs[:, None] * stride_y + offs_d[None, :], acc, mask=store_ok)


@triton.jit(do_not_specialize=["n_tokens"])
def _sum_pairs_kernel(
    y_ptr, weights_ptr, out_ptr, n_tokens, d_model, stride_y, stride_tw_t, stride_tw_k, stride_out,
    TOP_K: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_BF16_BY_BITS: tl.constexpr,
):
    tokens = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    token_ok = tokens < n_tokens
    tokens = tl.minimum(tokens, n_tokens - 1).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_ok = cols < d_model
    total = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(TOP_K):  # slot order, one fp32 sum: the same bits on every run
        weight = tl.load(weights_ptr + tokens * stride_tw_t + k * stride_tw_k).to(tl.float32)
        rows = tl.load(y_ptr + (tokens * TOP_K + k)[:, None] * stride_y + cols[None, :], mask=col_ok[None, :],
                       other=0.0)
        total += weight[:, None] * rows
    total = round_to_storage(total, out_ptr.dtype.element_ty, ROUND_BF16_BY_BITS)
    tl.store(out_ptr + tokens[:, None] * stride_out + cols[None, :], total, mask=token_ok[:, None] & col_ok[None, :])


@dataclass(frozen=True)
class MoELaunch:
    """Grids and constexprs of one call shape (tokens, top-k, experts, widths, dtype), built once per shape."""

    tiles: MoETiles
    m_tiles: int  # M tiles the GEMM grids cover: max_m_tiles(...)
    schedule_meta: dict
    f_blocks: int  # gate/up GEMM column blocks (its grid: m_tiles * f_blocks programs)
    d_blocks: int  # down GEMM column blocks
    sum_grid: tuple[int, int]
    sum_meta: dict
    gemm_meta: dict  # constexprs shared by the two GEMMs


@functools.lru_cache(maxsize=256)
def moe_launch(n_tokens: int, top_k: int, n_experts: int, d_model: int, ffn: int, dtype: torch.dtype,
               tiles: MoETiles | None = None) -> MoELaunch:
    n_pairs = n_tokens * top_k
    tiles = tiles or choose_tiles(n_pairs, n_experts)
    m_tiles = max_m_tiles(n_pairs, n_experts, tiles.block_m)
    schedule_meta = {"BLOCK_M": tiles.block_m, "BLOCK_E": triton.next_power_of_2(n_experts),
                     "CHUNK": min(1024, triton.next_power_of_2(m_tiles)), "num_warps": 4}
    sum_block = min(_MAX_SUM_BLOCK, triton.next_power_of_2(d_model))
    sum_rows = min(_MAX_SUM_BLOCK // sum_block, triton.next_power_of_2(n_tokens))  # narrow rows: several a program
    sum_meta = {"TOP_K": top_k, "ROWS": sum_rows, "BLOCK_D": sum_block, "ROUND_BF16_BY_BITS": _INTERPRETED,
                "num_warps": 4}
    gemm_meta = {"BLOCK_M": tiles.block_m, "BLOCK_K": tiles.block_k, "UPCAST": _INTERPRETED,
                 "DOT_PRECISION": dot_precision(dtype), "num_warps": tiles.warps, "num_stages": tiles.stages}
    return MoELaunch(tiles, m_tiles, schedule_meta,
                     f_blocks=triton.cdiv(ffn, tiles.block_f), d_blocks=triton.cdiv(d_model, tiles.block_d),
                     sum_grid=(triton.cdiv(n_tokens, sum_rows), triton.cdiv(d_model, sum_block)),
                     sum_meta=sum_meta, gemm_meta=gemm_meta)


def tile_schedule(sorted_ids: torch.Tensor, launch: MoELaunch, n_experts: int) -> torch.Tensor:
    """[3, m_tiles] int32 from the expert-sorted ids: per M tile its expert (E past the last real tile), first
    sorted row, end row. One launch, no host sync."""
    schedule = torch.empty((3, launch.m_tiles), dtype=torch.int32, device=sorted_ids.device)
    n_pairs = sorted_ids.numel()
    _tile_schedule_kernel[(1,)](sorted_ids, schedule, n_pairs, n_pairs.bit_length(), n_experts, launch.m_tiles,
                                **launch.schedule_meta)
    return schedule


def moe_experts_triton(x, topk_ids, topk_weights, w_gate_up, w_down, out=None, tiles: MoETiles | None = None):
    """Launch the routing and the four kernels; inputs must satisfy the contract (nothing is checked here)."""
    n_tokens, d_model = x.shape
    top_k = topk_ids.shape[1]
    n_experts, ffn = w_down.shape[0], w_down.shape[2]
    out = x.new_empty((n_tokens, d_model)) if out is None else out
    if n_tokens == 0:
        return out
    launch = moe_launch(n_tokens, top_k, n_experts, d_model, ffn, x.dtype, tiles)
    tiles, meta = launch.tiles, launch.gemm_meta
    sorted_ids, sorted_pairs = torch.sort(topk_ids.reshape(-1), stable=True)
    schedule = tile_schedule(sorted_ids, launch, n_experts)
    act = x.new_empty((n_tokens * top_k, ffn))
    y = torch.empty((n_tokens * top_k, d_model), dtype=torch.float32, device=x.device)
    _gate_up_kernel[(launch.m_tiles * launch.f_blocks,)](
        x, w_gate_up, schedule, sorted_pairs, act,
        n_experts, launch.m_tiles, launch.f_blocks, d_model, ffn, top_k, x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1),
        act.stride(0), BLOCK_F=tiles.block_f, EVEN_K=d_model % tiles.block_k == 0, ROUND_BF16_BY_BITS=_INTERPRETED,
        **meta,
    )
    _down_kernel[(launch.m_tiles * launch.d_blocks,)](
        act, w_down, schedule, sorted_pairs, y,
        n_experts, launch.m_tiles, launch.d_blocks, d_model, ffn, act.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
        BLOCK_D=tiles.block_d, EVEN_K=ffn % tiles.block_k == 0, **meta,
    )
    _sum_pairs_kernel[launch.sum_grid](
        y, topk_weights, out, n_tokens, d_model, y.stride(0), topk_weights.stride(0), topk_weights.stride(1),
        out.stride(0), **launch.sum_meta,
    )
    return out
