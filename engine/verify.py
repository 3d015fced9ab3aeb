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
"""
from __future__ import annotations

from dataclasses import dataclass

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.kvcache import SeqQuery


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


def predictor_token(state: SequenceState, candidates: VerifyCandidates, i: int, mask_id: int) -> int:
    """Token at the position before candidate i, as M_i's view has it."""
    before = candidates.cells[i] - 1
    if before in candidates.cells:
        j = candidates.cells.index(before)
        return candidates.drafts[j] if j < i else mask_id
    return state.token_at(state.prompt_len + before)


def verify_query(state: SequenceState, tracked_cells: list[int], candidates: VerifyCandidates, shift: bool) -> SeqQuery:
    p0, s = state.prompt_len, len(candidates.cells)
    positions = [p0 + c for c in tracked_cells] + [p0 + c for c in candidates.cells] * 2
    tokens = [state.answer[c] for c in tracked_cells] + list(candidates.drafts) + [state.mask_id] * s
    readout = [len(tracked_cells) + s + i for i in range(s)]
    if shift:
        positions += [p0 + c - 1 for c in candidates.cells]
        tokens += [predictor_token(state, candidates, i, state.mask_id) for i in range(s)]
        readout = [len(tracked_cells) + 2 * s + i for i in range(s)]
    return SeqQuery(
        state=state,
        positions=positions,
        tokens=tokens,
        readout=readout,
        score_rows=[],
        scratch=True,
        inq_visible=chain_visibility(len(tracked_cells), s, shift),
        exclude=[p0 + c for c in tracked_cells + candidates.cells],
    )


def pick_candidates(cells: list[int], tokens: list[int], confidences: list[float], state: SequenceState,
                    cap: int) -> VerifyCandidates:
    """The window's still-masked cells after the draft commit, most confident first, at most `cap`."""
    left = [(conf, cell, tok) for cell, tok, conf in zip(cells, tokens, confidences)
            if state.answer[cell] < 0 and cell < state.limit]
    left.sort(key=lambda item: (-item[0], item[1]))
    left = left[:cap]
    return VerifyCandidates(cells=[c for _, c, _ in left], drafts=[t for _, _, t in left])
