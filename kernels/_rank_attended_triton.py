"""Triton kernel behind `rank_attended` (contract: rank_attended.py).

Grid = (sequences,). A program walks its L positions in chunks and keeps the best TB (a power of two >= T) in
registers: each position becomes one int64 key, its mass mapped to an integer of the same order in the high
half and (2^32 - 1 - position) in the low half, so a descending sort orders by mass and then by lower position;
a chunk's keys are sorted, its best TB joined to the running best and sorted again. Ineligible positions get the
smallest key and are dropped at the end. Replaces ~20 small tensor operations (each a kernel launch on a GPU,
even inside a CUDA graph) with one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 512  # positions per chunk
_NONE = -(1 << 63)  # the key of an ineligible position: below every real key


@triton.jit
def _first_rows(x, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """The first WIDTH entries of a 1-D tensor of ROWS * WIDTH entries, in order."""
    grid = tl.reshape(x, [ROWS, WIDTH])
    row = tl.arange(0, ROWS)[:, None] + tl.zeros([ROWS, WIDTH], dtype=tl.int32)
    return tl.sum(tl.where(row == 0, grid, 0), 0)


@triton.jit
def _rank_attended_kernel(
    scores_ptr, row_base_ptr, prompt_len_ptr, gen_len_ptr, answer_ptr, active_ptr, attended_ptr,
    n_scores, L, G, T, stride_answer, stride_attended,
    BLOCK: tl.constexpr, TB: tl.constexpr, NONE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    if tl.load(active_ptr + row) != 0:
        base = tl.load(row_base_ptr + row)
        p0 = tl.load(prompt_len_ptr + row)
        total = p0 + tl.load(gen_len_ptr + row)
        best = tl.zeros([TB], dtype=tl.int64) + NONE
        for start in range(0, L, BLOCK):
            p = start + tl.arange(0, BLOCK)
            inside = p < L
            mass = tl.load(scores_ptr + tl.minimum(base + p, n_scores - 1), mask=inside, other=float("-inf"))
            cell = tl.minimum(tl.maximum(p - p0, 0), G - 1)
            committed = tl.load(answer_ptr + row * stride_answer + cell, mask=inside, other=-1) >= 0
            eligible = inside & ((p < p0) | (committed & (p < total))) & (mass != float("-inf"))
            bits = (mass + 0.0).to(tl.int32, bitcast=True)  # + 0.0: -0.0 becomes +0.0, a tie with it
            ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed-integer order = the floats' order
            key = (ordered.to(tl.int64) << 32) | (0xFFFFFFFF - p.to(tl.int64))
            key = tl.where(eligible, key, NONE)
            chunk_best = _first_rows(tl.sort(key, 0, descending=True), BLOCK // TB, TB)
            merged = tl.reshape(tl.join(best, chunk_best), [2 * TB])
            best = _first_rows(tl.sort(merged, 0, descending=True), 2, TB)
        j = tl.arange(0, TB)
        position = tl.where(best != NONE, 0xFFFFFFFF - (best & 0xFFFFFFFF), -1)
        tl.store(attended_ptr + row * stride_attended + j, position, mask=j < T)


def rank_attended_triton(scores, row_base, prompt_len, gen_len, answer, active, attended, slot_len: int
                         ) -> torch.Tensor:
    T = attended.shape[1]
    tb = triton.next_power_of_2(max(T, 2))
    block = max(_BLOCK, tb)
    _rank_attended_kernel[(attended.shape[0],)](
        scores, row_base, prompt_len, gen_len, answer, active, attended,
        scores.shape[0], slot_len, answer.shape[1], T, answer.stride(0), attended.stride(0),
        BLOCK=block, TB=tb, NONE=_NONE, num_warps=4,
    )
    return attended
