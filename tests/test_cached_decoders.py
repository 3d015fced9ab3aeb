"""Cached decoders (fast-dllm, flash-cache, flash-verify) against plain references, on tiny models."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flash_dllm.engine import decode_loop
from flash_dllm.engine.device_verify import VerifyBatch
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.model import forward_cached, forward_hidden, lm_logits
from flash_dllm.engine.packing import Layout, QueryPlan
from flash_dllm.engine.sampling import predict
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.strategies import WindowThreshold
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.engine.tokenizer import load_tokenizer
from flash_dllm.engine.weights import load_model

PROMPTS = ["What is 12*7?", "hello there, how are you today?", "x"]
FAMILIES = {"llada": TinySpec(family="llada"), "dream": TinySpec(family="dream", n_kv_heads=2)}


def make_engine(folder: Path) -> Engine:
    model = load_model(folder)
    return Engine(model, load_tokenizer(folder, model.config), folder.name, folder, "torch")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request, tmp_path_factory) -> Engine:
    folder = write_tiny_model(tmp_path_factory.mktemp(request.param), FAMILIES[request.param])
    return make_engine(folder)


def settings(**changes) -> GenerationSettings:
    base = GenerationSettings(method="flash-cache", gen_length=32, block_length=8, window=8, lookahead=8,
                              track=8, threshold=0.6)
    return base.with_overrides(**changes)


def token_ids(results) -> list[list[int]]:
    return [r.token_ids for r in results]


@torch.no_grad()
def full_recomputation(engine: Engine, prompts: list[str], s: GenerationSettings):
    """Flash-Cache's commit rule over a plain full forward (SDPA, no cache) of each sequence at every step."""
    model, shift = engine.model, engine.model.config.shift_logits
    rule = WindowThreshold(s.window, s.threshold)
    states = engine.new_states(prompts, s)
    for state in states:
        while not state.done:
            cells = rule.candidates(state)
            hidden = forward_hidden(model, torch.tensor([state.tokens()]))[0]
            rows = [state.prompt_len + c - (1 if shift else 0) for c in cells]
            pred = predict(lm_logits(model, hidden[rows]))
            tokens, conf = pred.tokens.tolist(), pred.confidences.tolist()
            chosen = rule.select(state, cells, tokens, conf)
            state.begin_step()
            state.forward_passes += 1
            state.commit([cells[i] for i in chosen], [tokens[i] for i in chosen], [conf[i] for i in chosen])
            state.steps += 1
    return states


@pytest.mark.parametrize("threshold", [0.5, 0.9])
def test_flash_cache_tracking_everything_equals_full_recomputation(engine, threshold):
    s = settings(track=-1, threshold=threshold)
    cached = engine.generate(PROMPTS, s)
    states = full_recomputation(engine, PROMPTS, s)
    assert token_ids(cached) == [st.answer_ids() for st in states]
    assert [r.forward_passes for r in cached] == [st.forward_passes for st in states]


def test_selective_refresh_really_reads_stale_cache(engine):
    """With small budgets the cache is stale somewhere: the trajectory must differ from full recomputation
    on at least one prompt, or the selective path is secretly recomputing everything."""
    prompts = PROMPTS + ["tell me a story about a cat", "count from one to ten", "2+2"]
    small = settings(track=0, lookahead=0, window=2, threshold=0.99)
    full = small.with_overrides(track=-1)
    assert token_ids(engine.generate(prompts, small)) != token_ids(engine.generate(prompts, full))


@pytest.mark.parametrize("track", [-1, 4])
def test_flash_verify_with_gamma_above_one_accepts_nothing_and_equals_flash_cache(engine, track):
    s = settings(track=track)
    plain = engine.generate(PROMPTS, s)
    verified = engine.generate(PROMPTS, s.with_overrides(method="flash-verify", gamma=1.5))
    assert token_ids(verified) == token_ids(plain)
    assert all(r.accepted_drafts == 0 for r in verified)
    assert any(r.rejected_drafts > 0 for r in verified)
    assert all(r.verify_passes > 0 and r.draft_passes == p.forward_passes for r, p in zip(verified, plain))


def test_flash_verify_accepts_drafts_at_low_gamma(engine):
    low = engine.generate(PROMPTS, settings(method="flash-verify", gamma=0.05, acceptance="cumulative"))
    assert sum(r.accepted_drafts for r in low) > 0
    plain = engine.generate(PROMPTS, settings())
    assert sum(r.steps for r in low) < sum(r.steps for r in plain)


@pytest.mark.parametrize("method", ["fast-dllm", "flash-cache", "flash-verify"])
def test_batch_equals_single_runs(engine, method):
    s = settings(method=method, gamma=0.3)
    batch = engine.generate(PROMPTS, s)
    singles = [engine.generate([p], s)[0] for p in PROMPTS]
    assert token_ids(batch) == token_ids(singles)
    assert [r.forward_passes for r in batch] == [r.forward_passes for r in singles]


@pytest.mark.parametrize("mode", ["dual", "prefix"])
def test_fast_dllm_block_start_logits_equal_full_forward(engine, mode, monkeypatch):
    """At the first step of each block the cached forward covers the whole sequence: its hidden states at
    the candidate rows must equal a plain full forward of the same tokens."""
    checked = []

    def checking_forward(model, k_cache, v_cache, step, ops, score_out=None):
        hidden = forward_cached(model, k_cache, v_cache, step, ops, score_out)
        plan = step.plan
        if plan.q_len.numel() == 1 and int(plan.q_len[0]) == int(plan.kv_len[0]):  # a full query
            reference = forward_hidden(model, step.token_ids[None])[0]
            assert torch.allclose(lm_logits(model, hidden), lm_logits(model, reference[step.hidden_rows]), atol=1e-4)
            checked.append(True)
        return hidden

    monkeypatch.setattr(decode_loop, "forward_cached", checking_forward)
    s = settings(method="fast-dllm", cache_mode=mode, threshold=0.95)
    result = engine.generate(["What is 12*7?"], s)[0]
    blocks_reached = 1 + max((c // s.block_length for c in range(len(result.token_ids))), default=0)
    assert len(checked) >= min(blocks_reached, s.n_blocks) >= 1


def one_layer_engine(tmp_path: Path, family: str) -> Engine:
    spec = TinySpec(family=family, n_layers=1, n_kv_heads=2 if family == "dream" else 4, seed=3)
    return make_engine(write_tiny_model(tmp_path / family, spec))


@pytest.mark.parametrize("family", ["llada", "dream"])
@torch.no_grad()
def test_chain_mask_matches_a_full_forward_of_each_candidates_view(tmp_path, family):
    """In a one-layer model K/V depend only on (token, position), so the verify pass's mask view of candidate
    i must equal a plain full forward (no cache) of the state 'candidates before i drafted, i and later
    masked', read where that candidate's logits come from."""
    eng = one_layer_engine(tmp_path, family)
    s = settings(method="flash-verify")
    ids = eng.encode(["What is 12*7? Think step by step."], s)
    session = eng._session(s, ids)
    canvas = session.canvas
    canvas.load(ids, [s.gen_length], [0])
    session.method.reset(canvas)
    total = int(canvas.total_len()[0])
    everything = QueryPlan(in_query=torch.arange(canvas.slot_len)[None] < total,
                           cells=torch.full((1, session.method.readout), -1))
    session._logits(everything, Layout((0,), (total,)))  # fill the cache with the all-masked state
    canvas.begin_step()
    canvas.commit(torch.tensor([[0, 1]]), torch.tensor([[65, 66]]), torch.ones((1, 2), dtype=torch.float64),
                  torch.ones((1, 2), dtype=torch.bool))  # tracked: committed after the cache was written
    cells, drafts, cap = [5, 2, 6, 3], [70, 71, 72, 73], session.verifier.cap
    batch = VerifyBatch(tracked=torch.tensor([[0, 1] + [-1] * (s.window - 2)]),
                        cells=torch.tensor([cells + [-1] * (cap - 4)]), drafts=torch.tensor([drafts + [0] * (cap - 4)]))
    step, hidden_rows = session.verifier.layout.pack(batch)
    chain = lm_logits(eng.model, forward_cached(eng.model, session.cache.k, session.cache.v, step, eng.ops))
    session.cache.keep.index_fill_(0, hidden_rows, 1)
    p0, shift = int(canvas.prompt_len[0]), eng.model.config.shift_logits
    base = canvas.tokens[0, :total].tolist()
    for i, cell in enumerate(cells):
        view = list(base)
        for j, c in enumerate(cells):
            view[p0 + c] = drafts[j] if j < i else canvas.mask_id
        explicit = lm_logits(eng.model, forward_hidden(eng.model, torch.tensor([view]))[0])
        torch.testing.assert_close(chain[i], explicit[p0 + cell - (1 if shift else 0)], atol=1e-4, rtol=1e-4)
