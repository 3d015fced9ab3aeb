"""Triton kernel behind `canvas_commit` (contract: see canvas_commit.py).

Grid = (sequences,). A program holds its row's R candidates in registers: it reads the cells' current state
(gathered), decides which commit, finds the first end token, scatters the commits, and then walks the row's G
cells in BLOCK_G chunks for the padding after a new end, the newly_rank reset and the model input ids. The
walk reads cells that the scatter wrote from other threads of the program, so a barrier separates the two.

The row's scalar flags (active, official end rule, steps left, padding due) are kept as int32 0/1 and turned into
bool vectors by a comparison (`_flag`): Triton 3.9's interpreter broadcasts a scalar bool into int32 data, which
a masked load or store then refuses; on a GPU the decisions are the same either way.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_G = 256


@triton.jit
def _canvas_commit_kernel(
    answer_ptr, confidence_ptr, newly_rank_ptr, end_ptr, model_tokens_ptr,
    cells_ptr, tokens_ptr, confidences_ptr, chosen_ptr, rank_base_ptr,
    active_ptr, official_end_ptr, gen_len_ptr, prompt_len_ptr, steps_ptr, max_steps_ptr, end_ids_ptr,
    committed_ptr,
    stride_answer, stride_confidence, stride_rank, stride_model, stride_cells, stride_tokens, stride_conf,
    stride_chosen,
    R, G, mask_id, eos_id, not_new,
    N_END: tl.constexpr, HAS_BASE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    active = (tl.load(active_ptr + row) != 0).to(tl.int32)
    official = (tl.load(official_end_ptr + row) != 0).to(tl.int32)
    gen_len = tl.load(gen_len_ptr + row)
    old_end = tl.load(end_ptr + row)
    live = (tl.load(steps_ptr + row) < tl.load(max_steps_ptr + row)).to(tl.int32)
    limit = tl.where(official != 0, gen_len, tl.minimum(old_end + 1, gen_len))

    j = tl.arange(0, BLOCK_R)
    in_row = j < R
    cells = tl.load(cells_ptr + row * stride_cells + j, mask=in_row, other=-1)
    tokens = tl.load(tokens_ptr + row * stride_tokens + j, mask=in_row, other=0)
    chosen = tl.load(chosen_ptr + row * stride_chosen + j, mask=in_row, other=0) != 0
    at = tl.minimum(tl.maximum(cells, 0), G - 1)
    answer_row = answer_ptr + row * stride_answer
    rank_row = newly_rank_ptr + row * stride_rank
    current = tl.load(answer_row + at, mask=in_row, other=0)
    to_decode = (current < 0) & (at < limit) & _flag(live, j)
    ok = chosen & (cells >= 0) & _flag(active, j) & (tokens != mask_id) & to_decode & in_row
    is_end = tl.zeros([BLOCK_R], dtype=tl.int1)
    for e in tl.static_range(N_END):
        is_end = is_end | (tokens == tl.load(end_ids_ptr + e))
    first_end = tl.min(tl.where(is_end & ok, at, G), axis=0)
    end = tl.minimum(old_end, first_end)
    ok = ok & ((at <= end) | _flag(official, j))
    base = tl.load(rank_base_ptr + row) if HAS_BASE else 0
    order = tl.cumsum(ok.to(tl.int64), axis=0) - 1 + base
    confidences = tl.load(confidences_ptr + row * stride_conf + j, mask=in_row, other=0.0)
    tl.store(answer_row + at, tokens, mask=ok)
    tl.store(confidence_ptr + row * stride_confidence + at, confidences, mask=ok)
    tl.store(rank_row + at, order, mask=ok)
    tl.store(end_ptr + row, end)
    tl.store(committed_ptr + row, tl.sum(ok.to(tl.int64), axis=0))
    tl.debug_barrier()  # the walk below reads cells the stores above wrote from other threads

    pads = ((end < old_end) & (official == 0)).to(tl.int32)
    prompt_len = tl.load(prompt_len_ptr + row)
    for g0 in range(0, G, BLOCK_G):
        column = g0 + tl.arange(0, BLOCK_G)
        in_canvas = column < G
        answer = tl.load(answer_row + column, mask=in_canvas, other=0)
        past_end = column > end
        padding = past_end & (column < gen_len) & _flag(pads, column) & in_canvas
        answer = tl.where(padding, eos_id, answer)
        tl.store(answer_row + column, answer, mask=padding)
        tl.store(rank_row + column, tl.full([BLOCK_G], not_new, tl.int64),
                 mask=past_end & _flag(1 - official, column) & in_canvas)
        tl.store(model_tokens_ptr + row * stride_model + prompt_len + column, tl.where(answer < 0, mask_id, answer),
                 mask=column < gen_len)


@triton.jit
def _flag(value, like):
    """An int32 0/1 scalar as a bool vector shaped like `like`."""
    return (like * 0 + value) != 0


def canvas_commit_triton(answer, confidence, newly_rank, end, model_tokens, cells, tokens, confidences, chosen,
                         rank_base, active, official_end, gen_len, prompt_len, steps, max_steps, end_ids,
                         mask_id: int, eos_id: int, not_new: int) -> torch.Tensor:
    """Launch the kernel; inputs must satisfy the contract (nothing is checked here)."""
    S, G = answer.shape
    R = cells.shape[1]
    committed = torch.zeros_like(end)
    if S == 0 or R == 0:
        return committed
    _canvas_commit_kernel[(S,)](
        answer, confidence, newly_rank, end, model_tokens,
        cells, tokens, confidences, chosen.view(torch.uint8), rank_base if rank_base is not None else end,
        active.view(torch.uint8), official_end.view(torch.uint8), gen_len, prompt_len, steps, max_steps, end_ids,
        committed,
        answer.stride(0), confidence.stride(0), newly_rank.stride(0), model_tokens.stride(0), cells.stride(0),
        tokens.stride(0), confidences.stride(0), chosen.stride(0),
        R, G, mask_id, eos_id, not_new,
        N_END=end_ids.shape[0], HAS_BASE=rank_base is not None, BLOCK_R=max(16, triton.next_power_of_2(R)),
        BLOCK_G=min(_BLOCK_G, max(16, triton.next_power_of_2(G))), num_warps=4,
    )
    return committed
