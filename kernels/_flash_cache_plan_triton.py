"""Triton kernel behind `flash_cache_plan` (contract: flash_cache_plan.py).

Grid = (sequences,). A program clears its rows, walks its G cells in chunks (a prefix sum ranks the cells still
to decode: the first W are the window, the next A the look-ahead) and sets their positions' flags, then picks the
tracked positions and sets theirs, then writes the final row (everything on a first step). Tracked positions:
all priorities are distinct (newly committed cells by commit order, below every attended position by rank), so
the first `track` are the newly committed cells whose commit order is below the track-th smallest one (found by
sorting the row's commit orders), then the first attended positions in order; each outside the window set
(whose flags the program reads back: a barrier separates the stores from the reads). Replaces ~50 small tensor
operations of the reference (each a kernel launch on a GPU, even inside a CUDA graph) with one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._step_rules_triton import decode_limits, flag
from .flash_cache_plan import NOT_NEW, FlashCachePlan, PlanShape

_BLOCK = 512  # positions or cells per chunk


@triton.jit
def _flash_cache_plan_kernel(
    answer_ptr, newly_rank_ptr, attended_ptr, prompt_len_ptr, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr,
    max_steps_ptr, active_ptr, cells_ptr, in_query_ptr, scored_ptr,
    G, L, T, stride_answer, stride_rank, stride_attended, stride_cells, stride_in_query, stride_scored, not_new,
    WINDOW: tl.constexpr, AHEAD: tl.constexpr, TRACK: tl.constexpr, SHIFT: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_W: tl.constexpr, SORT_G: tl.constexpr, BLOCK_T: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p0 = tl.load(prompt_len_ptr + row)
    gen_len, limit, live = decode_limits(row, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr)
    first_step = (tl.load(steps_ptr + row) == 0).to(tl.int32)
    active = (tl.load(active_ptr + row) != 0).to(tl.int32)
    flags = in_query_ptr + row * stride_in_query
    scored = scored_ptr + row * stride_scored
    answer = answer_ptr + row * stride_answer
    ranks = newly_rank_ptr + row * stride_rank

    # clear: no position chosen, no window cell yet
    for start in range(0, L, BLOCK):
        p = start + tl.arange(0, BLOCK)
        tl.store(flags + p, p < 0, mask=p < L)
        if TRACK > 0:
            tl.store(scored + p, p < 0, mask=p < L)
    w = tl.arange(0, BLOCK_W)
    tl.store(cells_ptr + row * stride_cells + w, tl.zeros([BLOCK_W], dtype=tl.int64) - 1, mask=w < WINDOW)
    tl.debug_barrier()

    # the window and the look-ahead: the first WINDOW + AHEAD cells still to decode
    carry = tl.zeros([], dtype=tl.int64)
    for start in range(0, G, BLOCK):
        c = start + tl.arange(0, BLOCK)
        inside = c < G
        token = tl.load(answer + c, mask=inside, other=0)
        masked = inside & (token < 0) & (c < limit) & flag(live, c)
        rank = carry + tl.cumsum(masked.to(tl.int32), 0).to(tl.int64) - 1
        take = masked & (rank < WINDOW + AHEAD)
        tl.store(flags + p0 + c, take, mask=take)
        in_window = masked & (rank < WINDOW)
        tl.store(cells_ptr + row * stride_cells + rank, c.to(tl.int64), mask=in_window)
        if SHIFT:
            before = p0 + c - 1
            tl.store(flags + before, in_window, mask=in_window & (before >= 0))
        if TRACK > 0:
            tl.store(scored + p0 + c, in_window, mask=in_window)
        carry += tl.sum(masked.to(tl.int64), 0)
    tl.debug_barrier()

    if TRACK > 0:
        # newly committed cells outside the window set, the TRACK with the lowest commit order
        g = tl.arange(0, SORT_G)
        in_g = g < G
        order = tl.load(ranks + g, mask=in_g, other=not_new)
        new_pos = p0 + g
        taken = tl.load(flags + new_pos, mask=in_g & (order < not_new), other=0) != 0
        valid_new = in_g & (order < not_new) & ~taken
        key = tl.where(valid_new, order, not_new)
        kth = tl.zeros([], dtype=tl.int64) + not_new  # fewer cells than TRACK: every valid one
        if TRACK <= SORT_G:
            kth = tl.sum(tl.where(g == TRACK - 1, tl.sort(key, 0), 0), 0)
        pick_new = valid_new & (key <= kth)
        n_new = tl.sum(pick_new.to(tl.int64), 0)
        # then the attended positions, best first, that are not newly committed cells or in the window set
        t = tl.arange(0, BLOCK_T)
        in_t = t < T
        pos = tl.load(attended_ptr + row * stride_attended + t, mask=in_t, other=-1)
        ok = in_t & (pos >= 0)
        cell = pos - p0
        is_cell = ok & (cell >= 0) & (cell < G)
        cell_order = tl.load(ranks + tl.where(is_cell, cell, 0), mask=is_cell, other=not_new)
        pos_taken = tl.load(flags + tl.where(ok, pos, 0), mask=ok, other=0) != 0
        valid_att = ok & (cell_order >= not_new) & ~pos_taken
        att_rank = tl.cumsum(valid_att.to(tl.int32), 0).to(tl.int64) - 1
        pick_att = valid_att & (att_rank < TRACK - n_new)
        tl.debug_barrier()  # every read of the window set above happens before the tracked flags go in
        tl.store(flags + new_pos, pick_new, mask=pick_new)
        tl.store(flags + pos, pick_att, mask=pick_att)
        tl.debug_barrier()

    # the final row: everything on a first step (always with TRACK < 0), nothing for an inactive sequence
    total = p0 + gen_len
    for start in range(0, L, BLOCK):
        p = start + tl.arange(0, BLOCK)
        inside = p < L
        chosen = tl.load(flags + p, mask=inside, other=0) != 0
        everything = p < total
        if TRACK < 0:
            value = everything
        else:
            value = tl.where(flag(first_step, p), everything, chosen)
        tl.store(flags + p, value & flag(active, p), mask=inside)


def flash_cache_plan_triton(answer, newly_rank, attended, prompt_len, gen_len, end, official_end, steps,
                            max_steps, active, shape: PlanShape) -> FlashCachePlan:
    S, G = answer.shape
    L, T = shape.slot_len, attended.shape[1]
    device = answer.device
    cells = torch.empty((S, shape.window), dtype=torch.int64, device=device)
    in_query = torch.empty((S, L), dtype=torch.bool, device=device)
    scored = torch.empty((S, L), dtype=torch.bool, device=device) if shape.track > 0 else None
    track = min(shape.track, L)
    _flash_cache_plan_kernel[(S,)](
        answer, newly_rank, attended, prompt_len, gen_len, end, official_end, steps, max_steps, active,
        cells, in_query, scored if scored is not None else in_query,
        G, L, T, answer.stride(0), newly_rank.stride(0), attended.stride(0), cells.stride(0), in_query.stride(0),
        scored.stride(0) if scored is not None else 0, NOT_NEW,
        WINDOW=shape.window, AHEAD=shape.lookahead, TRACK=track, SHIFT=shape.shift,
        BLOCK=_BLOCK, BLOCK_W=triton.next_power_of_2(max(shape.window, 2)),
        SORT_G=triton.next_power_of_2(max(G, 2)), BLOCK_T=triton.next_power_of_2(max(T, 2)), num_warps=4,
    )
    return FlashCachePlan(cells=cells, in_query=in_query, scored=scored)
