"""Triton kernel behind `pack_queries` (contract: pack_queries.py).

One program per slot of the forward walks the slot's L position flags in chunks of BLOCK: a prefix sum within
the chunk plus the count carried from the chunks before ranks each recomputed position, and its token, position,
cache row (and scored flag) are stored straight into its packed row; then the rows past the slot's count get the
padding values. For the candidate cells the same walk counts the recomputed positions before each read-out
position, which is that position's rank. Replaces the ~20 small tensor operations of the reference (each a
kernel launch on a GPU, even inside a CUDA graph) with one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pack_queries import PackConstants, PackedQueries

_BLOCK = 1024  # positions per chunk of the packing walk
_COUNT_BLOCK = 256  # positions per chunk of the candidates' count ([CELLS_BLOCK, COUNT_BLOCK] compares at once)
_CELLS_BLOCK = 16  # candidate cells counted at once; more loop


@triton.jit
def _pack_queries_kernel(
    in_query_ptr, tokens_ptr, prompt_len_ptr, row_base_ptr, total_len_ptr, cells_ptr, scored_ptr, slots_ptr,
    offsets_ptr, budgets_ptr,
    token_ids_ptr, positions_ptr, write_rows_ptr, score_query_ptr, hidden_rows_ptr, q_len_ptr, kv_start_ptr,
    kv_len_ptr,
    L, R, stride_in_query, stride_tokens, stride_cells, stride_scored, mask_id, trash_row,
    BLOCK: tl.constexpr, COUNT_BLOCK: tl.constexpr, CELLS_BLOCK: tl.constexpr, ALL_SLOTS: tl.constexpr, SCORED: tl.constexpr,
    SHIFT: tl.constexpr, MASK_PROMPT: tl.constexpr,
):
    i = tl.program_id(0)
    slot = i.to(tl.int64) if ALL_SLOTS else tl.load(slots_ptr + i)
    offset = tl.load(offsets_ptr + i)
    budget = tl.load(budgets_ptr + i)
    p0 = tl.load(prompt_len_ptr + slot)
    base = tl.load(row_base_ptr + slot)
    flags_row = in_query_ptr + slot * stride_in_query
    carry = tl.zeros([], dtype=tl.int64)
    for start in range(0, L, BLOCK):
        p = start + tl.arange(0, BLOCK)
        inside = p < L
        flag = tl.load(flags_row + p, mask=inside, other=0) != 0
        rank = carry + tl.cumsum(flag.to(tl.int32), 0).to(tl.int64) - 1
        keep = flag & (rank < budget)
        row = offset + rank
        token = tl.load(tokens_ptr + slot * stride_tokens + p, mask=keep, other=0)
        if MASK_PROMPT:
            token = tl.where(p < p0, mask_id, token)
        tl.store(token_ids_ptr + row, token, mask=keep)
        tl.store(positions_ptr + row, p.to(tl.int64), mask=keep)
        tl.store(write_rows_ptr + row, base + p, mask=keep)
        if SCORED:
            score = tl.load(scored_ptr + slot * stride_scored + p, mask=keep, other=0)
            tl.store(score_query_ptr + row, score, mask=keep)
        carry += tl.sum(flag.to(tl.int64), 0)
    count = tl.minimum(carry, budget)
    for pad_start in range(0, (budget - count).to(tl.int32), BLOCK):  # the padding rows after the slot's count
        k = count + pad_start + tl.arange(0, BLOCK)
        pad = k < budget
        tl.store(token_ids_ptr + offset + k, tl.zeros([BLOCK], dtype=tl.int64) + mask_id, mask=pad)
        tl.store(positions_ptr + offset + k, tl.zeros([BLOCK], dtype=tl.int64), mask=pad)
        tl.store(write_rows_ptr + offset + k, tl.zeros([BLOCK], dtype=tl.int64) + trash_row, mask=pad)
        if SCORED:
            tl.store(score_query_ptr + offset + k, k < 0, mask=pad)  # False
    tl.store(q_len_ptr + i, count.to(tl.int32))
    tl.store(kv_start_ptr + i, base.to(tl.int32))
    tl.store(kv_len_ptr + i, tl.load(total_len_ptr + slot).to(tl.int32))
    for j0 in range(0, R, CELLS_BLOCK):  # read-out rows: the rank of each candidate's read position
        j = j0 + tl.arange(0, CELLS_BLOCK)
        has_j = j < R
        cell = tl.load(cells_ptr + slot * stride_cells + j, mask=has_j, other=-1)
        read_pos = p0 + cell
        if SHIFT:
            read_pos = read_pos - 1
        read_pos = tl.minimum(tl.maximum(read_pos, 0), L - 1)
        before = tl.zeros([CELLS_BLOCK], dtype=tl.int64)
        for count_start in range(0, L, COUNT_BLOCK):
            p = count_start + tl.arange(0, COUNT_BLOCK)
            flag = tl.load(flags_row + p, mask=p < L, other=0) != 0
            earlier = flag[None, :] & (p[None, :] < read_pos[:, None])
            before += tl.sum(earlier.to(tl.int64), 1)
        at = tl.load(flags_row + read_pos, mask=has_j, other=0) != 0
        readable = (cell >= 0) & at & (before < budget)
        tl.store(hidden_rows_ptr + i * R + j, tl.where(readable, offset + before, offset), mask=has_j)


def pack_queries_triton(in_query, tokens, prompt_len, row_base, total_len, cells, scored, slots, offsets, budgets,
                        n_rows: int, constants: PackConstants, mask_prompt: bool = False) -> PackedQueries:
    n = in_query.shape[0] if slots is None else slots.shape[0]
    L, R = in_query.shape[1], cells.shape[1]
    device = in_query.device
    longs = dict(dtype=torch.int64, device=device)
    token_ids, positions, write_rows = (torch.empty(n_rows, **longs) for _ in range(3))
    score_query = torch.empty(n_rows, dtype=torch.bool, device=device) if scored is not None else None
    hidden_rows = torch.empty(n * R, **longs)
    q_len, kv_start, kv_len = (torch.empty(n, dtype=torch.int32, device=device) for _ in range(3))
    block = min(_BLOCK, triton.next_power_of_2(max(L, 16)))
    _pack_queries_kernel[(n,)](
        in_query, tokens, prompt_len, row_base, total_len, cells, scored if scored is not None else in_query,
        slots if slots is not None else offsets, offsets, budgets,
        token_ids, positions, write_rows, score_query if scored is not None else token_ids, hidden_rows, q_len,
        kv_start, kv_len,
        L, R, in_query.stride(0), tokens.stride(0), cells.stride(0),
        scored.stride(0) if scored is not None else 0, constants.mask_id, constants.trash_row,
        BLOCK=block, COUNT_BLOCK=min(_COUNT_BLOCK, block), CELLS_BLOCK=min(_CELLS_BLOCK, triton.next_power_of_2(max(R, 2))),
        ALL_SLOTS=slots is None, SCORED=scored is not None, SHIFT=constants.shift, MASK_PROMPT=mask_prompt,
        num_warps=4,
    )
    return PackedQueries(token_ids=token_ids, positions=positions, write_rows=write_rows, score_query=score_query,
                         hidden_rows=hidden_rows, q_len=q_len, kv_start=kv_start, kv_len=kv_len)
