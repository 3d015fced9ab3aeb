"""Packing a decode step's queries into one ragged forward: which positions each slot recomputes, written in
ascending order into the slot's packed rows, with everything the forward needs about them.

Contract (shared by the reference and the Triton kernel; S = canvas slots, L = positions per slot, n = slots in
the forward, R = candidate cells per slot):
    in_query    [S, L]      bool: the positions each slot recomputes (the plan's choice)
    tokens      [S, >= L]   int64 token at each position
    prompt_len, row_base, total_len   [S] int64: answer cell c is position prompt_len + c; position p's K/V
                            live in cache row row_base + p; a slot's keys are positions [0, total_len)
    cells       [S, R]      int64 candidate cells (-1: none), whose logits the step reads
    scored      [S, L] bool or None: positions whose attention mass is accumulated
    slots       [n] int64 or None (None: every slot, in order) ; offsets, budgets [n] int64: slot i of the
                            forward owns packed rows [offsets[i], offsets[i] + budgets[i]), rows n_rows in all
    mask_id, trash_row, shift (Dream reads cell c's logits at position c - 1), mask_prompt (classifier-free
    guidance's unconditional branch: prompt tokens read as [MASK])
Returns PackedQueries: for packed row offsets[i] + k, the k-th recomputed position of slot i (only the first
budgets[i] count) — its token, position and cache row; rows past a slot's count hold ([MASK], 0, trash_row) and
score nothing. hidden_rows[i * R + j] is the packed row whose hidden state predicts slots[i]'s cell j (position
prompt_len + cell - shift, clamped to [0, L)), or offsets[i] where that position is not in the query or the cell
is absent (junk nobody reads). q_len, kv_start (= row_base), kv_len (= total_len) per forward slot, int32.
Exact: integer bookkeeping, the kernel equals the reference bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bind_backend


@dataclass
class PackedQueries:
    token_ids: torch.Tensor  # [n_rows] int64
    positions: torch.Tensor  # [n_rows] int64
    write_rows: torch.Tensor  # [n_rows] int64
    score_query: torch.Tensor | None  # [n_rows] bool
    hidden_rows: torch.Tensor  # [n * R] int64
    q_len: torch.Tensor  # [n] int32
    kv_start: torch.Tensor  # [n] int32
    kv_len: torch.Tensor  # [n] int32


@dataclass(frozen=True)
class PackConstants:
    """What a call's packing takes that is fixed for a decode session."""

    mask_id: int
    trash_row: int
    shift: bool


def pack_queries_reference(in_query, tokens, prompt_len, row_base, total_len, cells, scored, slots, offsets,
                           budgets, n_rows: int, constants: PackConstants, mask_prompt: bool = False
                           ) -> PackedQueries:
    """Tensor operations: a prefix sum of each slot's flags ranks its positions, one scatter places them."""
    pick = (lambda t: t) if slots is None else (lambda t: t.index_select(0, slots))
    L = in_query.shape[1]
    offsets, budgets = offsets[:, None], budgets[:, None]
    in_query = pick(in_query)
    rank = torch.cumsum(in_query.long(), 1) - 1
    in_query = in_query & (rank < budgets)
    row_of = offsets + rank  # [n, L] packed row of each position (meaningful where in_query)
    target = torch.where(in_query, row_of, n_rows)
    position = torch.arange(L, device=in_query.device).expand_as(row_of)
    slot_tokens = pick(tokens)[:, :L]
    p0 = pick(prompt_len)
    if mask_prompt:
        slot_tokens = torch.where(position < p0[:, None], constants.mask_id, slot_tokens)
    base = pick(row_base)
    rows = torch.empty((3, n_rows + 1), dtype=torch.int64, device=target.device)  # no host tensor: graph-safe
    rows[0].fill_(constants.mask_id)
    rows[1].fill_(0)
    rows[2].fill_(constants.trash_row)
    values = torch.stack([slot_tokens, position, base[:, None] + position]).reshape(3, -1)
    rows.scatter_(1, target.reshape(1, -1).expand(3, -1), values)
    score_query = None
    if scored is not None:
        score_query = torch.zeros(n_rows + 1, dtype=torch.bool, device=target.device)
        score_query.scatter_(0, target.reshape(-1), pick(scored).reshape(-1))
        score_query = score_query[:n_rows]
    slot_cells = pick(cells)
    read_pos = (p0[:, None] + slot_cells - (1 if constants.shift else 0)).clamp(0, L - 1)
    readable = (slot_cells >= 0) & in_query.gather(1, read_pos)
    hidden_rows = torch.where(readable, row_of.gather(1, read_pos), offsets).reshape(-1)
    return PackedQueries(token_ids=rows[0, :n_rows], positions=rows[1, :n_rows], write_rows=rows[2, :n_rows],
                         score_query=score_query, hidden_rows=hidden_rows, q_len=in_query.sum(1).to(torch.int32),
                         kv_start=base.to(torch.int32), kv_len=pick(total_len).to(torch.int32))


class PackQueries:
    """pack_queries bound to one backend at construction ("triton": one kernel launch; "torch": the reference).
    A call only launches, so a step built from it can be captured as a CUDA graph."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = bind_backend(backend, pack_queries_reference, "._pack_queries_triton", "pack_queries_triton")

    def __call__(self, in_query, tokens, prompt_len, row_base, total_len, cells, scored, slots, offsets, budgets,
                 n_rows: int, constants: PackConstants, mask_prompt: bool = False) -> PackedQueries:
        return self._run(in_query, tokens, prompt_len, row_base, total_len, cells, scored, slots, offsets, budgets,
                         n_rows, constants, mask_prompt)
