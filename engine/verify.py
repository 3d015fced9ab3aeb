"""Flash-Verify's verify pass: each candidate seen twice (draft view, mask view) under a chain mask.

Rows of one sequence's verify query, candidates 0..S-1 in descending draft confidence:
    tracked rows T   the tokens committed by this step's draft commit (their cache K/V is still the mask
                     state, so they are recomputed here and their cache rows are not read)
    draft view  D_i  candidate i holding its drafted token
    mask view   M_i  candidate i holding [MASK], same position
    (Dream) P_i      the position before candidate i, seen under M_i's view: Dream's logits for a cell come
                     from the previous position, so P_i is where M_i's prediction is read out
Chain mask (who sees which in-query keys):
    tracked  sees tracked and every mask view (the state with no candidate accepted);
    D_i      sees tracked, drafts j <= i and masks j > i;
    M_i, P_i see tracked, drafts j < i and masks j >= i: exactly "candidates before i accepted, i and later
             still masked", which is what acceptance of candidate i must be judged on.
Every other position is read from the cache; the cache rows of tracked and candidate positions are excluded
(their in-query versions replace them). The pass writes scratch rows only, never the cache.

This module is the host reference (plain lists) of choosing candidates and of both acceptance rules; the
device decoder does the same with tensors (engine/device_verify.py, which also lays out the query).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flash_dllm.engine.sequence import SequenceState


@dataclass
class VerifyCandidates:
    cells: list[int]  # in descending draft confidence
    drafts: list[int]


def chain_visibility(n_tracked: int, n_candidates: int, with_predictors: bool) -> list[list[bool]]:
    """Visibility among in-query rows/keys in the layout [tracked | drafts | masks | (predictors)]."""
    t, s = n_tracked, n_candidates
    n = t + 2 * s + (s if with_predictors else 0)
    draft, mask = (lambda j: t + j), (lambda j: t + s + j)
    visible = [[False] * n for _ in range(n)]
    for row in range(n):
        for j in range(t):
            visible[row][j] = True
    for r in range(t):
        for j in range(s):
            visible[r][mask(j)] = True
    for i in range(s):
        rows = [mask(i)] + ([t + 2 * s + i] if with_predictors else [])
        for j in range(s):
            visible[draft(i)][draft(j) if j <= i else mask(j)] = True
            for row in rows:
                visible[row][draft(j) if j < i else mask(j)] = True
    return visible


def pick_candidates(cells: list[int], tokens: list[int], confidences: list[float], state: SequenceState,
                    cap: int) -> VerifyCandidates:
    """The window's still-masked cells after the draft commit, most confident first, at most `cap`."""
    left = [(conf, cell, tok) for cell, tok, conf in zip(cells, tokens, confidences)
            if state.answer[cell] < 0 and cell < state.limit]
    left.sort(key=lambda item: (-item[0], item[1]))
    left = left[:cap]
    return VerifyCandidates(cells=[c for _, c, _ in left], drafts=[t for _, _, t in left])


def accept_paper(draft_tokens: list[int], mask_argmax: list[int], mask_conf: list[float], gamma: float) -> int:
    """The paper's rule: accept candidate i when the mask view's argmax equals its draft with confidence
    >= gamma; stop at the first failure. Returns the number of accepted candidates (a prefix)."""
    accepted = 0
    for draft, top, conf in zip(draft_tokens, mask_argmax, mask_conf):
        if top != draft or conf < gamma:
            break
        accepted += 1
    return accepted


def accept_cumulative(draft_probs: list[float], gamma: float) -> int:
    """The official code's rule: the longest prefix whose running product of mask-view probabilities of
    the drafted tokens stays >= gamma."""
    accepted, product = 0, 1.0
    for prob in draft_probs:
        product *= prob
        if product < gamma:
            break
        accepted += 1
    return accepted


def padded(rows: list[list[int]], width: int, fill: int = -1) -> torch.Tensor:
    """[len(rows), width] int64 with each row's values first, then `fill`."""
    out = torch.full((len(rows), max(width, 1)), fill, dtype=torch.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row[:width], dtype=torch.int64)
    return out[:, :width]
