"""Flash-Verify's bookkeeping around its verify pass (engine/device_verify.py): which drafts to verify, the pass's
query rows and chain mask, and the acceptance of the verified drafts.

Contract (shared by the references and the Triton kernels; S sequences, G answer cells, W window cells, C =
min(cap, W) candidates, L positions per slot, R = W + 2C query rows per slot, W + 3C with shift):
    answer, newly_rank [S, G] int64 (-1: masked; NOT_NEW: not committed by this step's draft commit)
    gen_len, end, steps, max_steps, prompt_len, row_base [S] int64 ; official_end, active [S] bool
    cells, tokens [S, W] int64, confidences [S, W] float64: the window (-1: none), its drafts and their confidence
    shape        VerifyShape: cap, shift (Dream reads cell c's logits at position c - 1), mask_id, trash_row
                 (the cache row that absent rows point to), slot_len L
verify_pick -> VerifyBatch:
    cells [S, C]: the window's cells still to decode (masked, before the answer's limit, while the sequence has
                 steps left: DeviceCanvas.masked()) of an active sequence whose draft is not mask_id, in the order
                 of a stable ascending sort of -confidence where the others sort as +inf (torch.sort's order:
                 -0.0 equals +0.0, NaN above everything, NaNs equal): the first C entries of that order, -1 where
                 the entry is not such a cell
    drafts [S, C]: the draft of each of those C entries (holes included)
    tracked [S, W]: the cells the draft commit fixed (newly_rank < NOT_NEW), ascending, the first W, -1 after
verify_pack(batch, answer, tokens [S, L + 1], prompt_len, gen_len, row_base, chain [R, R] bool, keep [N] int8)
    -> VerifyQuery, and keep[hide] = 0 in place. Slot s's rows s * R + r, laid out as engine/device_verify.py
    describes: tracked t (cell tracked[t], its token from answer), draft view D_i (cell i, drafts[i]), mask view
    M_i (cell i, mask_id), with shift P_i (position before cell i: drafts[j] if candidate j < i holds cell i - 1,
    mask_id if a later one does, else the canvas token there, the position clamped to [0, L)). A row whose cell
    is -1 holds (mask_id, position 0); positions are prompt_len + cell.
    inq_mask [S * R, R]: chain[r, k] and row k is a tracked, draft or mask row of a present cell
    hide [S * (W + C)]: row_base + prompt_len + cell of the tracked and candidate cells, trash_row for holes
    kv_start = row_base, kv_len = prompt_len + gen_len [S] int32
verify_accept(batch, pred_tokens, pred_confidences, probs_of_given [S * C] (int64, float64, float64: the mask
    views' predictions), gamma [S] float64, active, counters VerifyCounters [S] int64 each, rule) -> VerifyOutcome:
    accepted: the longest prefix of present candidates that pass — "paper": the mask view predicts the draft
    with confidence >= gamma; "cumulative": the running product of probs_of_given (multiplied in candidate order,
    starting from 1) stays >= gamma. chosen [S, C] = candidate j < accepted. A pass ran for an active sequence
    with a candidate: its counters grow (forward and verify passes by one, accepted, rejected = candidates -
    accepted) and VerifyOutcome.accepted is its accepted count, 0 where no pass ran. A rule other than "paper"
    is the cumulative one.
Exact: integer bookkeeping, comparisons and copies; the kernels equal the references bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bind_backend
from .flash_cache_plan import NOT_NEW, first_cells, still_to_decode


@dataclass(frozen=True)
class VerifyShape:
    """A verify session's constants."""

    cap: int
    shift: bool
    mask_id: int
    trash_row: int
    slot_len: int


@dataclass
class VerifyBatch:
    """One verify pass's inputs per slot (device tensors)."""

    tracked: torch.Tensor  # [S, W] cells committed by this step's draft commit, ascending, -1 holes
    cells: torch.Tensor  # [S, C] candidates, most confident draft first, -1 holes
    drafts: torch.Tensor  # [S, C] drafted tokens


@dataclass
class VerifyQuery:
    """What the verify forward needs that changes per step."""

    token_ids: torch.Tensor  # [S * R] int64
    positions: torch.Tensor  # [S * R] int64
    inq_mask: torch.Tensor  # [S * R, R] bool
    hide: torch.Tensor  # [S * (W + C)] int64 cache rows hidden during the pass
    kv_start: torch.Tensor  # [S] int32
    kv_len: torch.Tensor  # [S] int32


@dataclass
class VerifyCounters:
    """The canvas's per-sequence counters a verify pass adds to, [S] int64 each (updated in place)."""

    forward_passes: torch.Tensor
    verify_passes: torch.Tensor
    accepted: torch.Tensor
    rejected: torch.Tensor


@dataclass
class VerifyOutcome:
    accepted: torch.Tensor  # [S] int64 drafts accepted, 0 where no pass ran
    chosen: torch.Tensor  # [S, C] bool: the accepted prefix, to commit


def verify_pick_reference(answer, newly_rank, gen_len, end, official_end, steps, max_steps, active, cells, tokens,
                          confidences, shape: VerifyShape) -> VerifyBatch:
    """Tensor operations: a stable sort of the negated confidences; the tracked cells by first_cells."""
    masked = still_to_decode(answer, gen_len, end, official_end, steps, max_steps)
    still = (cells >= 0) & masked.gather(1, cells.clamp(min=0)) & active[:, None]
    still &= tokens != shape.mask_id  # a [MASK] draft has nothing to verify
    order = torch.sort(torch.where(still, -confidences, float("inf")), dim=1, stable=True).indices[:, : shape.cap]
    kept = still.gather(1, order)
    return VerifyBatch(tracked=first_cells(newly_rank < NOT_NEW, cells.shape[1]),
                       cells=torch.where(kept, cells.gather(1, order), -1), drafts=tokens.gather(1, order))


def verify_pack_reference(batch: VerifyBatch, answer, tokens, prompt_len, gen_len, row_base, chain, keep,
                          shape: VerifyShape) -> VerifyQuery:
    """Tensor operations: each row group built as [S, W] or [S, C] and concatenated."""
    S, C, L, mask_id = answer.shape[0], batch.cells.shape[1], shape.slot_len, shape.mask_id
    p0 = prompt_len[:, None]
    tracked_ok, cand_ok = batch.tracked >= 0, batch.cells >= 0
    tracked_tok = answer.gather(1, batch.tracked.clamp(min=0))
    cells = [batch.tracked, batch.cells, batch.cells]
    values = [tracked_tok, batch.drafts, torch.full_like(batch.drafts, mask_id)]
    valid = [tracked_ok, cand_ok, cand_ok]
    if shape.shift:
        before = batch.cells - 1
        same = (batch.cells[:, None, :] == before[:, :, None]) & cand_ok[:, None, :]  # [S, i, j]: c_j == c_i - 1
        j = same.long().argmax(-1)
        earlier = j < torch.arange(C, device=j.device)[None, :]
        in_query = torch.where(earlier, batch.drafts.gather(1, j), mask_id)
        from_canvas = tokens.gather(1, (p0 + before).clamp(0, L - 1))
        cells.append(before)
        values.append(torch.where(same.any(-1), in_query, from_canvas))
        valid.append(cand_ok)
    cells, values, valid = torch.cat(cells, 1), torch.cat(values, 1), torch.cat(valid, 1)
    positions = torch.where(valid, p0 + cells, 0)
    values = torch.where(valid, values, mask_id)
    keys_ok = torch.cat([tracked_ok, cand_ok, cand_ok] + ([torch.zeros_like(cand_ok)] if shape.shift else []), 1)
    rows = chain.shape[0]
    inq_mask = (chain[None] & keys_ok[:, None, :]).reshape(S * rows, rows)
    hidden = torch.cat([tracked_ok, cand_ok], 1)
    hide = torch.where(hidden, row_base[:, None] + p0 + torch.cat([batch.tracked, batch.cells], 1), shape.trash_row)
    keep.index_fill_(0, hide.reshape(-1), 0)
    return VerifyQuery(token_ids=values.reshape(-1), positions=positions.reshape(-1), inq_mask=inq_mask,
                       hide=hide.reshape(-1), kv_start=row_base.to(torch.int32),
                       kv_len=(prompt_len + gen_len).to(torch.int32))


def verify_accept_reference(batch: VerifyBatch, pred_tokens, pred_confidences, probs_of_given, gamma, active,
                            counters: VerifyCounters, rule: str) -> VerifyOutcome:
    """Tensor operations: the passing candidates' prefix as a cumulative product of 0/1 flags."""
    shape = batch.cells.shape
    valid = batch.cells >= 0
    if rule == "paper":
        ok = (pred_tokens.view(shape) == batch.drafts) & (pred_confidences.view(shape) >= gamma[:, None])
    else:  # the running product left to right, one multiply at a time on every device (a GPU's cumprod may
        # associate differently, and a product that lands on gamma must decide the same way as the kernel's)
        probs, running, passing = probs_of_given.view(shape), None, []
        for j in range(shape[1]):
            running = probs[:, j] if running is None else running * probs[:, j]
            passing.append(running >= gamma)
        ok = torch.stack(passing, 1) if passing else torch.zeros(shape, dtype=torch.bool, device=probs.device)
    accepted = torch.cumprod((ok & valid).long(), dim=1).sum(1)
    chosen = torch.arange(shape[1], device=accepted.device)[None, :] < accepted[:, None]
    n_candidates = valid.sum(1)
    ran = ((n_candidates > 0) & active).long()
    counters.forward_passes += ran
    counters.verify_passes += ran
    counters.accepted += accepted * ran
    counters.rejected += (n_candidates - accepted) * ran
    return VerifyOutcome(accepted=accepted * ran, chosen=chosen)


class VerifyOp:
    """verify_pick, verify_pack and verify_accept bound to one backend at construction ("triton": one kernel
    launch each; "torch": the references). A call only launches, so a step built from it can be captured as a
    CUDA graph."""

    def __init__(self, backend: str):
        self.backend = backend
        module = "._verify_batch_triton"
        self._pick = bind_backend(backend, verify_pick_reference, module, "verify_pick_triton")
        self._pack = bind_backend(backend, verify_pack_reference, module, "verify_pack_triton")
        self._accept = bind_backend(backend, verify_accept_reference, module, "verify_accept_triton")

    def pick(self, answer, newly_rank, gen_len, end, official_end, steps, max_steps, active, cells, tokens,
             confidences, shape: VerifyShape) -> VerifyBatch:
        return self._pick(answer, newly_rank, gen_len, end, official_end, steps, max_steps, active, cells, tokens,
                          confidences, shape)

    def pack(self, batch: VerifyBatch, answer, tokens, prompt_len, gen_len, row_base, chain, keep,
             shape: VerifyShape) -> VerifyQuery:
        return self._pack(batch, answer, tokens, prompt_len, gen_len, row_base, chain, keep, shape)

    def accept(self, batch: VerifyBatch, pred_tokens, pred_confidences, probs_of_given, gamma, active,
               counters: VerifyCounters, rule: str) -> VerifyOutcome:
        return self._accept(batch, pred_tokens, pred_confidences, probs_of_given, gamma, active, counters, rule)
