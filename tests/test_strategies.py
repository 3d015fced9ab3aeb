"""Commit and acceptance rules on scripted numbers (no model)."""
from __future__ import annotations

import random

import torch

from flash_dllm.engine.refresh import FlashCachePolicy
from flash_dllm.engine.sequence import MASK, SequenceState
from flash_dllm.engine.strategies import BlockThreshold, LowConfidenceTopK, WindowThreshold, split_evenly, threshold_select
from flash_dllm.engine.verify import accept_cumulative, accept_paper, chain_visibility


def state(gen_length: int = 16) -> SequenceState:
    return SequenceState(0, [1, 2, 3], gen_length, mask_id=99, eos_id=98, end_ids=frozenset({98, 97}))


def test_split_evenly_puts_the_remainder_first():
    assert split_evenly(10, 4) == [3, 3, 2, 2]
    assert split_evenly(8, 8) == [1] * 8
    assert sum(split_evenly(31, 7)) == 31


def test_threshold_commits_all_above_and_at_least_the_best():
    assert threshold_select([0.2, 0.95, 0.91, 0.5], 0.9) == [1, 2]
    assert threshold_select([0.2, 0.4, 0.3], 0.9) == [1]
    assert threshold_select([0.9], 0.9) == [0]
    assert threshold_select([], 0.9) == []


def test_paper_rule_stops_at_first_failure():
    drafts = [5, 6, 7, 8]
    assert accept_paper(drafts, [5, 6, 7, 8], [0.9, 0.85, 0.81, 0.99], 0.8) == 4
    assert accept_paper(drafts, [5, 6, 1, 8], [0.9, 0.85, 0.99, 0.99], 0.8) == 2  # disagreement at 2
    assert accept_paper(drafts, [5, 6, 7, 8], [0.9, 0.79, 0.99, 0.99], 0.8) == 1  # low confidence at 1
    assert accept_paper(drafts, [5, 6, 7, 8], [0.99] * 4, 1.01) == 0


def test_cumulative_rule_keeps_the_longest_prefix_with_product_above_gamma():
    assert accept_cumulative([0.95, 0.9, 0.9, 0.99], 0.8) == 2  # 0.95, 0.855, 0.7695 < 0.8
    assert accept_cumulative([0.5, 1.0], 0.8) == 0
    assert accept_cumulative([1.0, 1.0, 1.0], 0.8) == 3
    # the two rules differ: each token passes the paper's per-token test, the product does not
    assert accept_paper([1, 2, 3], [1, 2, 3], [0.85, 0.85, 0.85], 0.8) == 3
    assert accept_cumulative([0.85, 0.85, 0.85], 0.8) == 1


def test_low_confidence_top_k_follows_the_schedule_and_block_order():
    s = state(gen_length=8)
    rule = LowConfidenceTopK(block_length=4, steps_per_block=2)
    counts, blocks = [], []
    while not s.done:
        cells = rule.candidates(s)
        blocks.append({c // 4 for c in cells})
        confidences = [0.1 * (i + 1) for i in range(len(cells))]
        chosen = rule.select(s, cells, [10] * len(cells), confidences)
        assert rule.select(s, cells, [10] * len(cells), confidences) == chosen  # select is pure
        s.begin_step()
        s.commit([cells[i] for i in chosen], [10] * len(chosen), [0.5] * len(chosen))
        rule.end_step(s)
        s.steps += 1
        counts.append(len(chosen))
    assert counts == [2, 2, 2, 2]
    assert blocks == [{0}, {0}, {1}, {1}]


def test_end_token_turns_later_cells_into_padding():
    s = state(gen_length=8)
    s.commit([6, 3], [50, 97], [0.9, 0.9])  # end-of-turn at cell 3 drops the token at cell 6
    assert s.end == 3 and s.is_padding(6) and s.answer_ids() == []
    assert s.masked_cells() == [0, 1, 2]
    s.commit([0, 1, 2], [7, 8, 9], [1, 1, 1])
    assert s.done and s.answer_ids() == [7, 8, 9]
    assert s.tokens()[-4:] == [98, 98, 98, 98]  # padding is fed to the model as EOS


def test_block_threshold_and_window_candidates():
    s = state(gen_length=8)
    s.commit([0, 2], [7, 7], [1, 1])
    assert BlockThreshold(4, 0.9).candidates(s) == [1, 3]
    assert WindowThreshold(3, 0.9).candidates(s) == [1, 3, 4]


def test_chain_visibility_layout():
    t, n = 1, 3
    vis = chain_visibility(t, n, with_predictors=False)
    draft, mask = (lambda j: t + j), (lambda j: t + n + j)
    for i in range(n):
        seen_by_mask = {k for k in range(len(vis)) if vis[mask(i)][k]}
        assert seen_by_mask == {0} | {draft(j) for j in range(i)} | {mask(j) for j in range(i, n)}
        seen_by_draft = {k for k in range(len(vis)) if vis[draft(i)][k]}
        assert seen_by_draft == {0} | {draft(j) for j in range(i + 1)} | {mask(j) for j in range(i + 1, n)}
    assert {k for k in range(len(vis)) if vis[0][k]} == {0} | {mask(j) for j in range(n)}


def test_canvas_tokens_and_done_agree_with_their_per_cell_definitions():
    """tokens()/done are list-operation shortcuts (the reference decoder calls them every step) of
    token_at and masked_cells: random commits, end tokens included, must never make them disagree."""
    rng = random.Random(1)
    for _ in range(300):
        s = SequenceState(0, [rng.randrange(50) for _ in range(rng.randrange(1, 30))], rng.randrange(1, 40),
                          mask_id=99, eos_id=98, end_ids=frozenset({98, 97}))
        for _ in range(rng.randrange(1, 5)):
            cells = rng.sample(range(s.gen_length), rng.randrange(0, s.gen_length + 1))
            s.commit(cells, [rng.choice([1, 2, 3, 97, 98]) for _ in cells], [0.5] * len(cells))
            assert s.tokens() == [s.token_at(p) for p in range(s.total_len)]
            assert s.done == (not s.masked_cells())


def test_flash_cache_tracks_the_decoded_positions_the_window_attended_most():
    """note_attention against a plain ranking: per sequence (slots in any order), eligible = prompt positions
    and committed cells; the `track` highest attention masses, highest first, ties to the lower position;
    masked cells never."""
    planner = FlashCachePolicy(lookahead=4, track=5, shift=False)
    rng = random.Random(3)
    states = []
    for slot in (2, 0):
        s = SequenceState(slot, [1, 2, 3, 4], 12, mask_id=99, eos_id=98, end_ids=frozenset({98}))
        cells = rng.sample(range(12), 4)
        s.commit(cells, [5] * 4, [0.9] * 4)
        states.append(s)
    slot_len = 16
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (3, slot_len), generator=gen).float()  # many ties: the lower position first
    planner.note_attention(scores, states)
    for s in states:
        row = scores[s.index].tolist()
        eligible = list(range(s.prompt_len)) + [s.prompt_len + c for c in range(12) if s.answer[c] != MASK]
        expected = sorted(eligible, key=lambda p: -row[p])[:5]
        assert planner.most_attended[s.index] == expected
