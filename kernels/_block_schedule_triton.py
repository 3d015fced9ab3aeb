"""Triton kernels behind `block_advance` and `fast_dllm_plan` (contract: block_schedule.py).

Grid = (sequences,) for both. The advance walks the sequence's cells of whole blocks in chunks for the first cell
still to decode at or after its block's first cell (that cell's block is the next one: the first block from the
current one on with a cell to decode), then counts the cells still to decode in the block it ends on. The plan
writes the position flags chunk by chunk (every position of the prompt and answer at a block's first step, else
the block's span) and ranks the block's cells still to decode by a prefix sum carried across chunks: the r-th is
stored at cells[r], and the entries past their count are set to -1 (disjoint from those stores: no barrier).
Replaces the ~70 small tensor operations of a steady Fast-dLLM step's references (each a kernel launch on a GPU,
even inside a CUDA graph) with two launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._step_rules_triton import decode_limits, flag
from .block_schedule import BlockCursors, BlockPlan, BlockShape

_BLOCK = 512  # positions or cells per chunk


@triton.jit
def _still_to_decode(answer, c, limit, live, inside):
    """Cells c (of one sequence) masked, before the limit, while the sequence has steps left."""
    token = tl.load(answer + c, mask=inside, other=0)
    return inside & (token < 0) & (c < limit) & flag(live, c)


@triton.jit
def _block_advance_kernel(
    answer_ptr, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr, active_ptr, restart_ptr,
    block_ptr, step_in_block_ptr, block_masks_ptr,
    B, n_blocks, stride_answer,
    RESTART: tl.constexpr, BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    gen_len, limit, live = decode_limits(row, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr)
    answer = answer_ptr + row * stride_answer
    block = tl.load(block_ptr + row)
    step_in_block = tl.load(step_in_block_ptr + row)
    restart = tl.zeros([], dtype=tl.int32)
    if RESTART:
        restart = (tl.load(restart_ptr + row) != 0).to(tl.int32)
        block = tl.where(restart != 0, 0, block)
    else:
        step_in_block += (tl.load(active_ptr + row) != 0).to(tl.int64)

    # the next block: the one holding the first cell still to decode at or after the current block's first cell
    span = n_blocks * B
    block_start = block * B
    first = tl.zeros([], dtype=tl.int64) + span
    for start in range(0, span, BLOCK):
        c = start + tl.arange(0, BLOCK).to(tl.int64)
        masked = _still_to_decode(answer, c, limit, live, (c < span) & (c >= block_start))
        first = tl.minimum(first, tl.min(tl.where(masked, c, span), 0))
    nxt = first // B
    found = nxt < n_blocks
    moved = ((nxt != block) & found) | (restart != 0)
    block = tl.where(moved & found, nxt, block)

    # the cells still to decode in the block it ends on (kept only by a sequence that begins that block)
    count_start = tl.minimum(block, n_blocks - 1) * B
    count = tl.zeros([], dtype=tl.int64)
    for k0 in range(0, B, BLOCK_C):
        k = k0 + tl.arange(0, BLOCK_C)
        c = count_start + k
        masked = _still_to_decode(answer, c, limit, live, (k < B) & (c >= 0))
        count += tl.sum(masked.to(tl.int64), 0)

    tl.store(block_ptr + row, block)
    tl.store(step_in_block_ptr + row, tl.where(moved, 0, step_in_block))
    tl.store(block_masks_ptr + row, tl.where(moved, count, tl.load(block_masks_ptr + row)))


@triton.jit
def _fast_dllm_plan_kernel(
    answer_ptr, prompt_len_ptr, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr, active_ptr,
    block_ptr, step_in_block_ptr, cells_ptr, in_query_ptr,
    B, G, L, stride_answer, stride_cells, stride_in_query,
    SHIFT: tl.constexpr, DUAL: tl.constexpr, BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p0 = tl.load(prompt_len_ptr + row)
    gen_len, limit, live = decode_limits(row, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr)
    active = (tl.load(active_ptr + row) != 0).to(tl.int32)
    everything_now = (tl.load(step_in_block_ptr + row) == 0).to(tl.int32)
    start = tl.load(block_ptr + row) * B
    total = p0 + gen_len

    # the positions: everything at a block's first step, else the block (dual) or the block onwards (prefix)
    first = p0 + start
    if SHIFT:
        first = first - 1
    if DUAL:
        last = tl.minimum(p0 + start + B, total)
    else:
        last = total
    flags = in_query_ptr + row * stride_in_query
    for chunk in range(0, L, BLOCK):
        p = chunk + tl.arange(0, BLOCK).to(tl.int64)
        everything = p < total
        in_block = (p >= first) & (p < last)
        value = tl.where(flag(everything_now, p), everything, in_block) & flag(active, p)
        tl.store(flags + p, value, mask=p < L)

    # the block's cells still to decode, ascending, then -1 past their count
    answer = answer_ptr + row * stride_answer
    cells = cells_ptr + row * stride_cells
    count = tl.zeros([], dtype=tl.int64)
    for k0 in range(0, B, BLOCK_C):
        k = k0 + tl.arange(0, BLOCK_C)
        c = start + k
        masked = _still_to_decode(answer, c, limit, live, (k < B) & (c >= 0) & (c < G))
        rank = count + tl.cumsum(masked.to(tl.int32), 0).to(tl.int64) - 1
        tl.store(cells + rank, c, mask=masked)
        count += tl.sum(masked.to(tl.int64), 0)
    for j0 in range(0, B, BLOCK_C):
        j = j0 + tl.arange(0, BLOCK_C)
        tl.store(cells + j, tl.zeros([BLOCK_C], dtype=tl.int64) - 1, mask=(j < B) & (j >= count))


def _cell_chunk(block_length: int) -> int:
    """Cells of one block per chunk: the whole block up to _BLOCK."""
    return min(_BLOCK, triton.next_power_of_2(max(block_length, 16)))


def block_advance_triton(answer, gen_len, end, official_end, steps, max_steps, active, cursors: BlockCursors,
                         shape: BlockShape, restart: torch.Tensor | None = None) -> None:
    B = shape.block_length
    _block_advance_kernel[(answer.shape[0],)](
        answer, gen_len, end, official_end, steps, max_steps, active, restart if restart is not None else active,
        cursors.block, cursors.step_in_block, cursors.block_masks,
        B, answer.shape[1] // B, answer.stride(0),
        RESTART=restart is not None, BLOCK=_BLOCK, BLOCK_C=_cell_chunk(B), num_warps=4,
    )


def fast_dllm_plan_triton(answer, prompt_len, gen_len, end, official_end, steps, max_steps, active,
                          cursors: BlockCursors, shape: BlockShape) -> BlockPlan:
    S, G = answer.shape
    B, L = shape.block_length, shape.slot_len
    device = answer.device
    cells = torch.empty((S, B), dtype=torch.int64, device=device)
    in_query = torch.empty((S, L), dtype=torch.bool, device=device)
    _fast_dllm_plan_kernel[(S,)](
        answer, prompt_len, gen_len, end, official_end, steps, max_steps, active,
        cursors.block, cursors.step_in_block, cells, in_query,
        B, G, L, answer.stride(0), cells.stride(0), in_query.stride(0),
        SHIFT=shape.shift, DUAL=shape.mode == "dual", BLOCK=_BLOCK,
        BLOCK_C=_cell_chunk(B), num_warps=4,
    )
    return BlockPlan(cells=cells, in_query=in_query)
