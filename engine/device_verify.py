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

import torch

from flash_dllm.engine.model import CachedStep
from flash_dllm.engine.packing import Layout, Packer, attention_plan
from flash_dllm.engine.sampling import VERIFY_PASS, Predictions, predict
from flash_dllm.engine.verify import chain_visibility
from flash_dllm.kernels.verify_batch import VerifyBatch, VerifyCounters, VerifyOp, VerifyShape


class VerifyLayout:
    """The fixed per-slot row layout of the verify pass and its chain mask (built once per decode call). Picking
    the candidates, packing the pass and accepting the drafts are one op each (kernels/verify_batch.py: one
    kernel launch each on a GPU)."""

    def __init__(self, packer: Packer, window: int, cap: int, shift: bool):
        self.packer, self.window, self.cap, self.shift = packer, window, cap, shift
        self.rows = window + (3 if shift else 2) * cap
        canvas, cache = packer.canvas, packer.cache
        n_slots = canvas.n_slots
        self.layout = Layout.uniform(n_slots, self.rows)
        self.shape = VerifyShape(cap=cap, shift=shift, mask_id=canvas.mask_id, trash_row=cache.trash_row,
                                 slot_len=cache.slot_len)
        self.op = VerifyOp("torch")
        # the canvas's counters the pass adds to (the canvas fills its tensors in place: bound once)
        self.counters = VerifyCounters(forward_passes=canvas.forward_passes, verify_passes=canvas.verify_passes,
                                       accepted=canvas.accepted, rejected=canvas.rejected)
        device = canvas.tokens.device
        self.chain = torch.tensor(chain_visibility(window, cap, shift), dtype=torch.bool, device=device)
        self.slots = torch.arange(n_slots, device=device)
        self.readout = torch.arange(cap, device=device) + window + (2 if shift else 1) * cap
        # the pass's constant tensors, made once (each would be a kernel per step); int32 where the attention
        # plan takes them, so it does not convert them every step
        rows = torch.arange(self.rows, device=device)
        inq_start = cache.scratch_base + self.slots * cache.scratch_per_slot  # each slot's scratch rows
        self.inq_start = inq_start.to(torch.int32)
        self.write_rows = (inq_start[:, None] + rows[None, :]).reshape(-1)
        self.q_len = torch.full((n_slots,), self.rows, dtype=torch.int32, device=device)
        self.hidden_rows = (self.slots[:, None] * self.rows + self.readout[None, :]).reshape(-1)

    def use_kernels(self, backend: str) -> None:
        """Pick, pack and accept with the Triton kernels ("triton") or their references ("torch")."""
        if backend != self.op.backend:
            self.op = VerifyOp(backend)

    def pick(self, cells: torch.Tensor, tokens: torch.Tensor, confidences: torch.Tensor) -> VerifyBatch:
        """The window's cells still masked after the draft commit whose draft is a real token (not [MASK]), by
        descending draft confidence (ties: the earlier cell), at most `cap`; and the cells the draft commit fixed
        (tracked rows)."""
        canvas = self.packer.canvas
        return self.op.pick(canvas.answer, canvas.newly_rank, canvas.gen_len, canvas.end, canvas.official_end,
                            canvas.steps, canvas.max_steps, canvas.active, cells, tokens, confidences, self.shape)

    def pack(self, batch: VerifyBatch) -> tuple[CachedStep, torch.Tensor]:
        """The verify forward, and the cache rows it hides (to be re-enabled after the pass)."""
        canvas, cache = self.packer.canvas, self.packer.cache
        query = self.op.pack(batch, canvas.answer, canvas.tokens, canvas.prompt_len, canvas.gen_len, cache.row_base,
                             self.chain, cache.keep, self.shape)
        attention = attention_plan(self.packer.tensors(self.layout), self.q_len, query.kv_start, query.kv_len,
                                   cache.slot_len, kv_keep=cache.keep, inq_start=self.inq_start,
                                   inq_mask=query.inq_mask)
        step = CachedStep(token_ids=query.token_ids, positions=query.positions, write_rows=self.write_rows,
                          plan=attention, hidden_rows=self.hidden_rows)
        return step, query.hide


class Verifier:
    """Flash-Verify as a plug-in of the decode loop: after each step's draft commit, `after_commit` picks the
    window's remaining cells, verifies their drafts in one chain-masked pass and commits the accepted prefix.
    It returns the fields of the step record that describe the pass."""

    def __init__(self, layout: VerifyLayout, rule: str):
        self.layout, self.rule = layout, rule

    @property
    def cap(self) -> int:
        return self.layout.cap

    def use_kernels(self, backend: str) -> None:
        """Run the pass's bookkeeping with the Triton kernels ("triton") or their references ("torch")."""
        self.layout.use_kernels(backend)

    def after_commit(self, session, cells: torch.Tensor, preds: Predictions, committed: torch.Tensor) -> dict:
        canvas, cache, layout = session.canvas, session.cache, self.layout
        batch = layout.pick(cells, preds.tokens, preds.confidences)
        step, hidden_rows = layout.pack(batch)
        logits = session.verify_logits(step)
        cache.keep.index_fill_(0, hidden_rows, 1)
        keys, temperature = session._keys_and_temperature(None, batch.cells, VERIFY_PASS)
        p = predict(logits, temperature, keys, given_tokens=batch.drafts.reshape(-1), greedy=session.method.greedy)
        # the counters before the commit: it changes neither them nor `active`
        outcome = layout.op.accept(batch, p.tokens, p.confidences, p.probs_of_given, canvas.gamma, canvas.active,
                                   layout.counters, self.rule)
        canvas.commit(batch.cells, batch.drafts, p.probs_of_given.view(batch.cells.shape), outcome.chosen,
                      rank_base=committed)
        return dict(verify_cells=batch.cells, verify_drafts=batch.drafts, accepted=outcome.accepted)
