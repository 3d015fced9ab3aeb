"""The cached decode loop shared by fast-dllm, flash-cache and flash-verify.

Each step packs every active sequence's query positions (chosen by the method's planner) into one ragged
forward through the kernel dispatchers, reads logits only at the candidate cells, brings one small set of
predictions to the host, and lets the strategy commit. Flash-Verify then runs one verify pass for all
sequences that have candidates and commits the accepted prefix.
"""
from __future__ import annotations

import time

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.decode_common import DecodeContext, emit_step, logit_position, predict
from flash_dllm.engine.kvcache import KVCache, SeqQuery, pack
from flash_dllm.engine.model import forward_cached, lm_logits
from flash_dllm.engine.strategies import accept_cumulative, accept_paper
from flash_dllm.engine.verify import VerifyCandidates, pick_candidates, verify_query


def draft_query(state: SequenceState, positions: list[int], cells: list[int], shift: bool, scores: bool) -> SeqQuery:
    index = {p: i for i, p in enumerate(positions)}
    readout = [index[logit_position(state, c, shift)] for c in cells]
    return SeqQuery(
        state=state,
        positions=positions,
        tokens=state.tokens_at(positions),
        readout=readout,
        score_rows=[index[state.prompt_len + c] for c in cells] if scores else [],
    )


def allocate_cache(ctx: DecodeContext, states: list[SequenceState], planner) -> KVCache:
    slot_len = max(s.total_len for s in states)
    slot_len = (slot_len + 15) // 16 * 16
    window = ctx.settings.window
    scratch = window + 3 * ctx.settings.candidates_cap if planner.verify else 0
    return KVCache(ctx.model, len(states), slot_len, scratch)


def run_forward(ctx: DecodeContext, cache: KVCache, queries: list[SeqQuery], scores: bool,
                given: torch.Tensor | None = None):
    step = pack(cache, queries)
    if scores:
        cache.scores.zero_()
    hidden = forward_cached(ctx.model, cache.k, cache.v, step, ctx.backend, cache.scores if scores else None)
    return predict(lm_logits(ctx.model, hidden), ctx.settings.temperature, ctx.generator, given)


def verify_and_accept(ctx: DecodeContext, cache: KVCache, pending: list[tuple[SequenceState, list[int], VerifyCandidates]],
                      shift: bool) -> dict[int, tuple[list[int], list[int]]]:
    """One verify pass for all sequences with candidates; commits accepted drafts. Returns per sequence
    (accepted cells, rejected cells)."""
    queries = [verify_query(state, tracked, cands, shift) for state, tracked, cands in pending]
    drafts = torch.tensor([t for _, _, c in pending for t in c.drafts], device=ctx.model.device)
    pred = run_forward(ctx, cache, queries, scores=False, given=drafts)
    outcome, offset, gamma = {}, 0, ctx.settings.gamma
    for state, _, cands in pending:
        n = len(cands.cells)
        top, conf = pred.tokens[offset: offset + n], pred.confidences[offset: offset + n]
        probs = pred.probs_of_given[offset: offset + n]
        offset += n
        if ctx.settings.acceptance == "paper":
            accepted = accept_paper(cands.drafts, top, conf, gamma)
        else:
            accepted = accept_cumulative(probs, gamma)
        state.forward_passes += 1
        state.verify_passes += 1
        state.commit(cands.cells[:accepted], cands.drafts[:accepted], probs[:accepted])
        state.accepted_drafts += accepted
        state.rejected_drafts += n - accepted
        outcome[state.index] = (cands.cells[:accepted], cands.cells[accepted:])
    return outcome


@torch.no_grad()
def run_cached(ctx: DecodeContext, states: list[SequenceState], planner) -> None:
    shift = ctx.model.config.shift_logits
    strategy = planner.strategy
    cache = allocate_cache(ctx, states, planner)
    while active := ctx.still_decoding(states):
        started = time.perf_counter()
        cells_per_seq = [strategy.candidates(s) for s in active]
        queries = [draft_query(s, planner.queries(s, cells), cells, shift, planner.tracks_attention)
                   for s, cells in zip(active, cells_per_seq)]
        pred = run_forward(ctx, cache, queries, scores=planner.tracks_attention)
        if planner.tracks_attention:
            planner.note_attention(cache.scores, active, cache.slot_len)
        offset, pending, step_info = 0, [], []
        for state, cells in zip(active, cells_per_seq):
            tokens = pred.tokens[offset: offset + len(cells)]
            confs = pred.confidences[offset: offset + len(cells)]
            offset += len(cells)
            state.begin_step()
            state.forward_passes += 1
            end_before = state.end
            chosen = strategy.select(state, cells, tokens, confs)
            state.commit([cells[i] for i in chosen], [tokens[i] for i in chosen], [confs[i] for i in chosen])
            step_info.append((state, [cells[i] for i in chosen], cells, end_before))
            if planner.verify and not state.done:
                cands = pick_candidates(cells, tokens, confs, state, ctx.settings.candidates_cap)
                tracked = list(state.newly_committed)[: ctx.settings.window]
                if cands.cells:
                    pending.append((state, tracked, cands))
        outcome = verify_and_accept(ctx, cache, pending, shift) if pending else {}
        drafted = {state.index: cands for state, _, cands in pending}
        for state, committed, cells, end_before in step_info:
            extra = {}
            if state.index in drafted:
                accepted, rejected = outcome[state.index]
                cands = drafted[state.index]
                extra = dict(drafted=list(cands.cells), draft_tokens=list(cands.drafts),
                             draft_pieces=[ctx.piece(t) for t in cands.drafts],
                             accepted=accepted, rejected=rejected)
                committed = committed + accepted
            emit_step(ctx, state, committed, cells, end_before, started, **extra)
