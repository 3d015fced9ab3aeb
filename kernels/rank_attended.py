"""Flash-Cache's attention ranking: after a step's forward, each sequence's decoded positions (prompt and
committed cells) ordered by the attention mass the window gave them, the first T kept for the next step's plan.

Contract (shared by the reference and the Triton kernel; S sequences, G answer cells, L positions per slot):
    scores      [N] float32 attention mass per cache row; position p of slot s is row min(row_base[s] + p, N - 1)
    row_base, prompt_len, gen_len [S] int64 ; answer [S, G] int64 (-1: masked) ; active [S] bool
    attended    [S, T] int64, updated in place for active sequences (others keep theirs)
    slot_len L
A position is eligible when it is in the prompt, or an answer cell before prompt_len + gen_len that is committed,
and its mass is not -inf. attended[s] = the T eligible positions of largest mass, largest first, ties to the
lower position (-0.0 equals +0.0), then -1. Exact: the kernel equals the reference bit for bit.
"""
from __future__ import annotations

import torch

from . import bind_backend


def rank_attended_reference(scores, row_base, prompt_len, gen_len, answer, active, attended, slot_len: int
                            ) -> torch.Tensor:
    """A stable descending sort of the eligible masses (ineligible ones as -inf, dropped after it)."""
    L, G = slot_len, answer.shape[1]
    position = torch.arange(L, device=scores.device)[None, :]
    mass = scores[(row_base[:, None] + position).clamp(max=scores.shape[0] - 1)]
    p0 = prompt_len[:, None]
    committed = answer.gather(1, (position - p0).clamp(0, G - 1)) >= 0
    eligible = (position < p0) | (committed & (position < p0 + gen_len[:, None]))
    values, index = torch.sort(mass.masked_fill(~eligible, float("-inf")), dim=1, descending=True, stable=True)
    T = attended.shape[1]
    values, index = values[:, :T], index[:, :T]
    kept = torch.where(values != float("-inf"), index, -1)
    if kept.shape[1] < T:  # a slot shorter than the budget
        kept = torch.cat([kept, kept.new_full((kept.shape[0], T - kept.shape[1]), -1)], 1)
    return attended.copy_(torch.where(active[:, None], kept, attended))


class RankAttended:
    """rank_attended bound to one backend at construction ("triton": one kernel launch; "torch": the reference).
    A call only launches, so a step built from it can be captured as a CUDA graph."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = bind_backend(backend, rank_attended_reference, "._rank_attended_triton", "rank_attended_triton")

    def __call__(self, scores, row_base, prompt_len, gen_len, answer, active, attended, slot_len: int
                 ) -> torch.Tensor:
        return self._run(scores, row_base, prompt_len, gen_len, answer, active, attended, slot_len)
