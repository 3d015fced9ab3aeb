"""Triton kernels behind `verify_pick`, `verify_pack` and `verify_accept` (contract: verify_batch.py).

Grid = (sequences,) for all three. The pick ranks the window's entries as the stable sort would, by counting
for each entry the entries that sort before it (smaller key, or an equal key at an earlier index, in a [W, W]
comparison; NaN keys are above every other and equal to each other) and stores the first C at their rank; the
tracked cells are ranked by a prefix sum over the answer's cells carried across chunks, stored at their rank,
and the entries past their count are set to -1 (disjoint from those stores). The pack handles a slot's R rows as
one vector: each row's group (tracked, draft view, mask view, predictor) and candidate follow from its index, and
Dream's predictor rows look for the candidate holding the cell before theirs in a [R, C] comparison. The accept
walks the candidates in order, multiplying the probabilities one at a time as torch.cumprod does on the CPU.
Replaces the ~45 small tensor operations of the references (each a kernel launch on a GPU, even inside a CUDA
graph) with three launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._step_rules_triton import decode_limits, flag
from .flash_cache_plan import NOT_NEW
from .verify_batch import VerifyBatch, VerifyCounters, VerifyOutcome, VerifyQuery, VerifyShape

_BLOCK = 512  # answer cells per chunk of the tracked cells' walk



@triton.jit
def _verify_pick_kernel(
    answer_ptr, newly_rank_ptr, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr, active_ptr,
    cells_ptr, tokens_ptr, confidences_ptr, tracked_ptr, picked_ptr, drafts_ptr,
    G, W, C, stride_answer, stride_rank, stride_cells, stride_tokens, stride_confidences, stride_tracked,
    stride_picked, stride_drafts, mask_id, not_new,
    BLOCK: tl.constexpr, BLOCK_W: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    gen_len, limit, live = decode_limits(row, gen_len_ptr, end_ptr, official_end_ptr, steps_ptr, max_steps_ptr)
    active = (tl.load(active_ptr + row) != 0).to(tl.int32)
    answer = answer_ptr + row * stride_answer

    # candidates: the window's entries still to decode with a real draft, ranked by a stable sort of -confidence
    i = tl.arange(0, BLOCK_W)
    in_w = i < W
    cell = tl.load(cells_ptr + row * stride_cells + i, mask=in_w, other=-1)
    token = tl.load(tokens_ptr + row * stride_tokens + i, mask=in_w, other=0)
    confidence = tl.load(confidences_ptr + row * stride_confidences + i, mask=in_w, other=0.0)
    at = tl.maximum(cell, 0)
    masked = (tl.load(answer + at, mask=in_w, other=0) < 0) & (at < limit) & flag(live, i)
    still = in_w & (cell >= 0) & masked & flag(active, i) & (token != mask_id)
    key = tl.where(still, -confidence, float("inf"))
    key_j, key_i = key[:, None], key[None, :]  # [j, i]: does entry j sort before entry i?
    nan_j, nan_i = key_j != key_j, key_i != key_i
    less = (key_j < key_i) | (nan_i & ~nan_j)
    equal = (key_j == key_i) | (nan_i & nan_j)
    before = in_w[:, None] & (less | (equal & (i[:, None] < i[None, :])))
    rank = tl.sum(before.to(tl.int32), 0)
    take = in_w & (rank < C)
    tl.store(picked_ptr + row * stride_picked + rank, tl.where(still, cell, -1), mask=take)
    tl.store(drafts_ptr + row * stride_drafts + rank, token, mask=take)

    # tracked: the first W cells the draft commit fixed, ascending, then -1
    tracked = tracked_ptr + row * stride_tracked
    count = tl.zeros([], dtype=tl.int64)
    for start in range(0, G, BLOCK):
        c = start + tl.arange(0, BLOCK)
        inside = c < G
        new = inside & (tl.load(newly_rank_ptr + row * stride_rank + c, mask=inside, other=not_new) < not_new)
        order = count + tl.cumsum(new.to(tl.int32), 0).to(tl.int64) - 1
        tl.store(tracked + order, c.to(tl.int64), mask=new & (order < W))
        count += tl.sum(new.to(tl.int64), 0)
    tl.store(tracked + i, tl.zeros([BLOCK_W], dtype=tl.int64) - 1, mask=in_w & (i >= count))


@triton.jit
def _verify_pack_kernel(
    tracked_ptr, cells_ptr, drafts_ptr, answer_ptr, tokens_ptr, prompt_len_ptr, gen_len_ptr, row_base_ptr,
    chain_ptr, keep_ptr, token_ids_ptr, positions_ptr, inq_mask_ptr, hide_ptr, kv_start_ptr, kv_len_ptr,
    W, C, R, L, stride_tracked, stride_cells, stride_drafts, stride_answer, stride_tokens, mask_id, trash_row,
    SHIFT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p0 = tl.load(prompt_len_ptr + row)
    base = tl.load(row_base_ptr + row)
    r = tl.arange(0, BLOCK_R)
    in_r = r < R
    is_tracked = r < W
    is_draft = (r >= W) & (r < W + C)
    is_predictor = in_r & (r >= W + 2 * C)  # none without SHIFT
    is_candidate = in_r & ~is_tracked
    j = tl.where(is_draft, r - W, tl.where(is_predictor, r - W - 2 * C, r - W - C))  # a view row's candidate
    j = tl.where(is_candidate, j, 0)
    tracked_cell = tl.load(tracked_ptr + row * stride_tracked + r, mask=is_tracked, other=-1)
    candidate = tl.load(cells_ptr + row * stride_cells + j, mask=is_candidate, other=-1)
    draft = tl.load(drafts_ptr + row * stride_drafts + j, mask=is_candidate, other=0)
    cell = tl.where(is_tracked, tracked_cell, candidate)
    valid = in_r & (cell >= 0)
    tracked_token = tl.load(answer_ptr + row * stride_answer + tl.maximum(tracked_cell, 0),
                            mask=is_tracked & valid, other=0)
    token = tl.where(is_tracked, tracked_token, tl.where(is_draft, draft, mask_id))
    if SHIFT:
        # a predictor row reads the cell before its candidate: from the query when a candidate holds it (its
        # draft if that candidate comes earlier, else [MASK]), otherwise from the canvas
        k = tl.arange(0, BLOCK_C)
        others = tl.load(cells_ptr + row * stride_cells + k, mask=k < C, other=-1)
        other_drafts = tl.load(drafts_ptr + row * stride_drafts + k, mask=k < C, other=0)
        same = (others[None, :] == candidate[:, None] - 1) & (others[None, :] >= 0)
        holder = tl.min(tl.where(same, k[None, :], BLOCK_C), 1)
        held = holder < BLOCK_C
        holder_draft = tl.sum(tl.where(k[None, :] == holder[:, None], other_drafts[None, :], 0), 1)
        in_query = tl.where(holder < j, holder_draft, mask_id)
        at = tl.minimum(tl.maximum(p0 + candidate - 1, 0), L - 1)
        from_canvas = tl.load(tokens_ptr + row * stride_tokens + at, mask=is_predictor & valid, other=0)
        token = tl.where(is_predictor, tl.where(held, in_query, from_canvas), token)
        cell = tl.where(is_predictor, cell - 1, cell)
    out = row * R + r
    tl.store(token_ids_ptr + out, tl.where(valid, token, mask_id), mask=in_r)
    tl.store(positions_ptr + out, tl.where(valid, p0 + cell, 0), mask=in_r)

    # in-pass keys: the chain mask where the key row is a present tracked, draft or mask row
    key_ok = valid & ~is_predictor
    both = in_r[:, None] & in_r[None, :]
    chain = tl.load(chain_ptr + r[:, None] * R + r[None, :], mask=both, other=0) != 0
    tl.store(inq_mask_ptr + out[:, None] * R + r[None, :], chain & key_ok[None, :], mask=both)

    # the cache rows of the tracked and candidate positions are hidden: their in-query versions replace them
    hides = r < W + C
    hide = tl.where(valid, base + p0 + cell, trash_row)
    tl.store(hide_ptr + row * (W + C) + r, hide, mask=hides)
    tl.store(keep_ptr + hide, tl.zeros([BLOCK_R], dtype=tl.int8), mask=hides)
    tl.store(kv_start_ptr + row, base.to(tl.int32))
    tl.store(kv_len_ptr + row, (p0 + tl.load(gen_len_ptr + row)).to(tl.int32))


@triton.jit
def _verify_accept_kernel(
    cells_ptr, drafts_ptr, pred_tokens_ptr, pred_confidences_ptr, probs_ptr, gamma_ptr, active_ptr,
    forward_passes_ptr, verify_passes_ptr, accepted_total_ptr, rejected_ptr, accepted_ptr, chosen_ptr,
    C, stride_cells, stride_drafts,
    PAPER: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    gamma = tl.load(gamma_ptr + row)
    cells = cells_ptr + row * stride_cells
    going = tl.full([], 1, dtype=tl.int64)
    accepted = tl.zeros([], dtype=tl.int64)
    product = tl.full([], 1.0, dtype=tl.float64)
    for j in range(0, C):  # in order: the product's rounding depends on it
        at = row * C + j
        if PAPER:
            passes = (tl.load(pred_tokens_ptr + at) == tl.load(drafts_ptr + row * stride_drafts + j)) & (
                tl.load(pred_confidences_ptr + at) >= gamma)
        else:
            product = product * tl.load(probs_ptr + at)
            passes = product >= gamma
        going = going & (passes & (tl.load(cells + j) >= 0)).to(tl.int64)
        accepted += going
    k = tl.arange(0, BLOCK_C)
    n_candidates = tl.sum((tl.load(cells + k, mask=k < C, other=-1) >= 0).to(tl.int64), 0)
    ran = ((n_candidates > 0) & (tl.load(active_ptr + row) != 0)).to(tl.int64)
    tl.store(chosen_ptr + row * C + k, k < accepted, mask=k < C)
    tl.store(forward_passes_ptr + row, tl.load(forward_passes_ptr + row) + ran)
    tl.store(verify_passes_ptr + row, tl.load(verify_passes_ptr + row) + ran)
    tl.store(accepted_total_ptr + row, tl.load(accepted_total_ptr + row) + accepted * ran)
    tl.store(rejected_ptr + row, tl.load(rejected_ptr + row) + (n_candidates - accepted) * ran)
    tl.store(accepted_ptr + row, accepted * ran)


def _block(n: int) -> int:
    return triton.next_power_of_2(max(n, 2))


def verify_pick_triton(answer, newly_rank, gen_len, end, official_end, steps, max_steps, active, cells, tokens,
                       confidences, shape: VerifyShape) -> VerifyBatch:
    (S, G), W = answer.shape, cells.shape[1]
    C = min(shape.cap, W)
    device = answer.device
    tracked = torch.empty((S, W), dtype=torch.int64, device=device)
    picked = torch.empty((S, C), dtype=torch.int64, device=device)
    drafts = torch.empty((S, C), dtype=torch.int64, device=device)
    _verify_pick_kernel[(S,)](
        answer, newly_rank, gen_len, end, official_end, steps, max_steps, active, cells, tokens, confidences,
        tracked, picked, drafts,
        G, W, C, answer.stride(0), newly_rank.stride(0), cells.stride(0), tokens.stride(0), confidences.stride(0),
        tracked.stride(0), picked.stride(0), drafts.stride(0), shape.mask_id, NOT_NEW,
        BLOCK=min(_BLOCK, _block(G)), BLOCK_W=_block(W), num_warps=4,
    )
    return VerifyBatch(tracked=tracked, cells=picked, drafts=drafts)


def verify_pack_triton(batch: VerifyBatch, answer, tokens, prompt_len, gen_len, row_base, chain, keep,
                       shape: VerifyShape) -> VerifyQuery:
    S, (W, C) = answer.shape[0], (batch.tracked.shape[1], batch.cells.shape[1])
    R = chain.shape[0]
    device = answer.device
    longs = dict(dtype=torch.int64, device=device)
    token_ids, positions = torch.empty(S * R, **longs), torch.empty(S * R, **longs)
    inq_mask = torch.empty((S * R, R), dtype=torch.bool, device=device)
    hide = torch.empty(S * (W + C), **longs)
    kv_start, kv_len = (torch.empty(S, dtype=torch.int32, device=device) for _ in range(2))
    _verify_pack_kernel[(S,)](
        batch.tracked, batch.cells, batch.drafts, answer, tokens, prompt_len, gen_len, row_base, chain, keep,
        token_ids, positions, inq_mask, hide, kv_start, kv_len,
        W, C, R, shape.slot_len, batch.tracked.stride(0), batch.cells.stride(0), batch.drafts.stride(0),
        answer.stride(0), tokens.stride(0), shape.mask_id, shape.trash_row,
        SHIFT=shape.shift, BLOCK_R=_block(R), BLOCK_C=_block(C), num_warps=4,
    )
    return VerifyQuery(token_ids=token_ids, positions=positions, inq_mask=inq_mask, hide=hide, kv_start=kv_start,
                       kv_len=kv_len)


def verify_accept_triton(batch: VerifyBatch, pred_tokens, pred_confidences, probs_of_given, gamma, active,
                         counters: VerifyCounters, rule: str) -> VerifyOutcome:
    S, C = batch.cells.shape
    accepted = torch.empty(S, dtype=torch.int64, device=gamma.device)
    chosen = torch.empty((S, C), dtype=torch.bool, device=gamma.device)
    _verify_accept_kernel[(S,)](
        batch.cells, batch.drafts, pred_tokens, pred_confidences, probs_of_given, gamma, active,
        counters.forward_passes, counters.verify_passes, counters.accepted, counters.rejected, accepted, chosen,
        C, batch.cells.stride(0), batch.drafts.stride(0),
        PAPER=rule == "paper", BLOCK_C=_block(C), num_warps=1,
    )
    return VerifyOutcome(accepted=accepted, chosen=chosen)
