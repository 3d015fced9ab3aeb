"""Flash-Verify on the device: candidates, the chain-masked verify query, both acceptance rules, the commit.

The semantics are the host reference's (engine/verify.py, which also explains the chain mask); here every
slot gets the same fixed query layout, so the pass has static shapes:
    rows [0, W)              tracked: the cells this step's draft commit fixed (their cache rows still hold
                             the mask state), ascending; holes after the last one
    rows [W, W + C)          draft view D_i of candidate i (its drafted token)
    rows [W + C, W + 2C)     mask view M_i (the mask token, same position)
    rows [W + 2C, W + 3C)    (Dream) P_i, the position before candidate i under M_i's view
Holes (absent tracked cells or candidates) are hidden from every row as keys; their own rows compute junk
that nobody reads. The pass writes each slot's scratch rows only, never the cache proper.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flash_dllm.engine.device_canvas import NOT_NEW, DeviceCanvas
from flash_dllm.engine.model import CachedStep
from flash_dllm.engine.packing import Layout, Packer, attention_plan
from flash_dllm.engine.sampling import VERIFY_PASS, Predictions, predict
from flash_dllm.engine.verify import chain_visibility


@dataclass
class VerifyBatch:
    """One verify pass's inputs per slot (device tensors)."""

    tracked: torch.Tensor  # [S, W] cells committed by this step's draft commit, ascending, -1 holes
    cells: torch.Tensor  # [S, C] candidates, most confident draft first, -1 holes
    drafts: torch.Tensor  # [S, C] drafted tokens


def pick_candidates(canvas: DeviceCanvas, cells: torch.Tensor, tokens: torch.Tensor, confidences: torch.Tensor,
                    cap: int) -> VerifyBatch:
    """The window's cells still masked after the draft commit whose draft is a real token (not [MASK]), by
    descending draft confidence (ties: the earlier cell), at most `cap`; and the cells the draft commit fixed
    (tracked rows)."""
    still = (cells >= 0) & canvas.masked().gather(1, cells.clamp(min=0)) & canvas.active[:, None]
    still &= tokens != canvas.mask_id  # a [MASK] draft has nothing to verify
    order = torch.sort(torch.where(still, -confidences, float("inf")), dim=1, stable=True).indices[:, :cap]
    kept = still.gather(1, order)
    window = cells.shape[1]
    new = canvas.newly_rank < NOT_NEW
    rank = torch.cumsum(new.long(), 1) - 1
    target = torch.where(new & (rank < window), rank, window)
    tracked = torch.full((cells.shape[0], window + 1), -1, dtype=torch.int64, device=cells.device)
    tracked.scatter_(1, target, canvas.cells().expand_as(target))
    return VerifyBatch(tracked=tracked[:, :window], cells=torch.where(kept, cells.gather(1, order), -1),
                       drafts=tokens.gather(1, order))


def accepted_counts(batch: VerifyBatch, preds: Predictions, gamma: torch.Tensor, rule: str) -> torch.Tensor:
    """[S] the length of the accepted prefix of each slot's candidates.

    paper: candidate i passes when the mask view's prediction is its draft with confidence >= gamma;
    cumulative (the official code): while the running product of the mask view's probabilities of the
    drafts stays >= gamma. Acceptance stops at the first candidate that fails."""
    shape = batch.cells.shape
    valid = batch.cells >= 0
    if rule == "paper":
        ok = (preds.tokens.view(shape) == batch.drafts) & (preds.confidences.view(shape) >= gamma[:, None])
    else:
        ok = torch.cumprod(preds.probs_of_given.view(shape), dim=1) >= gamma[:, None]
    return torch.cumprod((ok & valid).long(), dim=1).sum(1)


class VerifyLayout:
    """The fixed per-slot row layout of the verify pass and its chain mask (built once per decode call)."""

    def __init__(self, packer: Packer, window: int, cap: int, shift: bool):
        self.packer, self.window, self.cap, self.shift = packer, window, cap, shift
        self.rows = window + (3 if shift else 2) * cap
        n_slots = packer.canvas.n_slots
        self.layout = Layout.uniform(n_slots, self.rows)
        device = packer.canvas.tokens.device
        self.chain = torch.tensor(chain_visibility(window, cap, shift), dtype=torch.bool, device=device)
        self.slots = torch.arange(n_slots, device=device)
        self.readout = torch.arange(cap, device=device) + window + (2 if shift else 1) * cap
        # the pass's constant tensors, made once (each would be a kernel per step)
        cache, rows = packer.cache, torch.arange(self.rows, device=device)
        self.inq_start = cache.scratch_base + self.slots * cache.scratch_per_slot  # each slot's scratch rows
        self.write_rows = (self.inq_start[:, None] + rows[None, :]).reshape(-1)
        self.q_len = torch.full((n_slots,), self.rows, dtype=torch.int64, device=device)
        self.hidden_rows = (self.slots[:, None] * self.rows + self.readout[None, :]).reshape(-1)

    def pack(self, batch: VerifyBatch) -> tuple[CachedStep, torch.Tensor]:
        """The verify forward, and the cache rows it hides (to be re-enabled after the pass)."""
        canvas, cache = self.packer.canvas, self.packer.cache
        S, C, L = canvas.n_slots, self.cap, cache.slot_len
        p0 = canvas.prompt_len[:, None]
        tracked_ok, cand_ok = batch.tracked >= 0, batch.cells >= 0
        tracked_tok = canvas.answer.gather(1, batch.tracked.clamp(min=0))
        cells = [batch.tracked, batch.cells, batch.cells]
        tokens = [tracked_tok, batch.drafts, torch.full_like(batch.drafts, canvas.mask_id)]
        valid = [tracked_ok, cand_ok, cand_ok]
        if self.shift:
            before = batch.cells - 1
            same = (batch.cells[:, None, :] == before[:, :, None]) & cand_ok[:, None, :]  # [S, i, j]: c_j == c_i - 1
            j = same.long().argmax(-1)
            earlier = j < torch.arange(C, device=j.device)[None, :]
            in_query = torch.where(earlier, batch.drafts.gather(1, j), canvas.mask_id)
            from_canvas = canvas.tokens.gather(1, (p0 + before).clamp(0, L - 1))
            cells.append(before)
            tokens.append(torch.where(same.any(-1), in_query, from_canvas))
            valid.append(cand_ok)
        cells, tokens, valid = torch.cat(cells, 1), torch.cat(tokens, 1), torch.cat(valid, 1)
        positions = torch.where(valid, p0 + cells, 0)
        tokens = torch.where(valid, tokens, canvas.mask_id)
        lt = self.packer.tensors(self.layout)
        keys_ok = torch.cat([tracked_ok, cand_ok, cand_ok] + ([torch.zeros_like(cand_ok)] if self.shift else []), 1)
        inq_mask = (self.chain[None] & keys_ok[:, None, :]).reshape(S * self.rows, self.rows)
        hidden = torch.cat([tracked_ok, cand_ok], 1)
        hide = torch.where(hidden, cache.row_base[:, None] + p0 + torch.cat([batch.tracked, batch.cells], 1),
                           cache.trash_row)
        cache.keep.index_fill_(0, hide.reshape(-1), 0)
        attention = attention_plan(lt, self.q_len, cache.row_base, canvas.total_len(), L, kv_keep=cache.keep,
                                   inq_start=self.inq_start, inq_mask=inq_mask)
        step = CachedStep(token_ids=tokens.reshape(-1), positions=positions.reshape(-1), write_rows=self.write_rows,
                          plan=attention, hidden_rows=self.hidden_rows)
        return step, hide.reshape(-1)


class Verifier:
    """Flash-Verify as a plug-in of the decode loop: after each step's draft commit, `after_commit` picks the
    window's remaining cells, verifies their drafts in one chain-masked pass and commits the accepted prefix.
    It returns the fields of the step record that describe the pass."""

    def __init__(self, layout: VerifyLayout, rule: str):
        self.layout, self.rule = layout, rule

    @property
    def cap(self) -> int:
        return self.layout.cap

    def after_commit(self, session, cells: torch.Tensor, preds: Predictions, committed: torch.Tensor) -> dict:
        canvas, cache = session.canvas, session.cache
        batch = pick_candidates(canvas, cells, preds.tokens, preds.confidences, self.cap)
        step, hidden_rows = self.layout.pack(batch)
        logits = session.verify_logits(step)
        cache.keep.index_fill_(0, hidden_rows, 1)
        keys, temperature = session._keys_and_temperature(None, batch.cells, VERIFY_PASS)
        p = predict(logits, temperature, keys, given_tokens=batch.drafts.reshape(-1), greedy=session.method.greedy)
        accepted = accepted_counts(batch, p, canvas.gamma, self.rule)
        chosen = torch.arange(batch.cells.shape[1], device=accepted.device)[None, :] < accepted[:, None]
        canvas.commit(batch.cells, batch.drafts, p.probs_of_given.view(batch.cells.shape), chosen,
                      rank_base=committed)
        n_candidates = (batch.cells >= 0).sum(1)
        ran = ((n_candidates > 0) & canvas.active).long()
        canvas.forward_passes += ran
        canvas.verify_passes += ran
        canvas.accepted += accepted * ran
        canvas.rejected += (n_candidates - accepted) * ran
        return dict(verify_cells=batch.cells, verify_drafts=batch.drafts, accepted=accepted * ran)
