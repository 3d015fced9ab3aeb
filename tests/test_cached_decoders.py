"""Cached decoders (fast-dllm, flash-cache, flash-verify) against their plain references, on tiny models."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flash_dllm.engine import decode_cached
from flash_dllm.engine.tokenizer import load_tokenizer
from flash_dllm.engine.decode_common import DecodeContext
from flash_dllm.engine.decode_full import run_full
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.kvcache import KVCache, SeqQuery, pack
from flash_dllm.engine.model import forward_cached, forward_hidden, lm_logits
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.strategies import WindowThreshold
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.engine.verify import VerifyCandidates, verify_query
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


@pytest.mark.parametrize("threshold", [0.5, 0.9])
def test_flash_cache_tracking_everything_equals_full_recomputation(engine, threshold):
    s = settings(track=-1, threshold=threshold)
    cached = engine.generate(PROMPTS, s)
    states = engine.new_states(PROMPTS, s)
    run_full(DecodeContext(engine.model, s), states, WindowThreshold(s.window, s.threshold))
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

    def checking_forward(model, k_cache, v_cache, step, backend, score_out=None):
        hidden = forward_cached(model, k_cache, v_cache, step, backend, score_out)
        plan = step.plan
        if len(plan.host_q_len) == 1 and plan.host_q_len[0] == plan.host_kv_len[0]:  # a full query
            reference = forward_hidden(model, step.token_ids[None])[0]
            assert torch.allclose(lm_logits(model, hidden), lm_logits(model, reference[step.hidden_rows]), atol=1e-4)
            checked.append(True)
        return hidden

    monkeypatch.setattr(decode_cached, "forward_cached", checking_forward)
    s = settings(method="fast-dllm", cache_mode=mode, threshold=0.95)
    result = engine.generate(["What is 12*7?"], s)[0]
    blocks_reached = 1 + max((c // s.block_length for c in range(len(result.token_ids))), default=0)
    assert len(checked) >= min(blocks_reached, s.n_blocks) >= 1


def one_layer_engine(tmp_path: Path, family: str) -> Engine:
    spec = TinySpec(family=family, n_layers=1, n_kv_heads=2 if family == "dream" else 4, seed=3)
    return make_engine(write_tiny_model(tmp_path / family, spec))


def logits_of(engine: Engine, cache: KVCache, query: SeqQuery) -> torch.Tensor:
    step = pack(cache, [query])
    return lm_logits(engine.model, forward_cached(engine.model, cache.k, cache.v, step, "torch"))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_chain_mask_matches_sequential_per_candidate_computation(tmp_path, family):
    """In a one-layer model K/V depend only on (token, position), so the verify pass's mask view of candidate
    i must equal an explicit forward of the state 'candidates before i drafted, i and later masked'."""
    eng = one_layer_engine(tmp_path, family)
    s = settings(method="flash-verify")
    state = eng.new_states(["What is 12*7? Think step by step."], s)[0]
    cache = KVCache(eng.model, 1, state.total_len, scratch_per_slot=64)
    everything = list(range(state.total_len))
    logits_of(eng, cache, SeqQuery(state, everything, state.tokens(), [0], []))  # fill the cache
    state.commit([0, 1], [65, 66], [1.0, 1.0])  # tracked: committed after the cache was written
    tracked, cells, drafts = [0, 1], [5, 2, 6, 3], [70, 71, 72, 73]  # confidence order, not position order
    cands = VerifyCandidates(cells=cells, drafts=drafts)
    chain = logits_of(eng, cache, verify_query(state, tracked, cands, eng.model.config.shift_logits))
    p0, shift = state.prompt_len, eng.model.config.shift_logits
    for i, cell in enumerate(cells):
        view = {c: (drafts[j] if j < i else state.mask_id) for j, c in enumerate(cells)}
        view.update({c: state.answer[c] for c in tracked})
        positions = sorted(p0 + c for c in view)
        read = p0 + cell - (1 if shift else 0)
        if read not in positions:
            positions = sorted(positions + [read])
        tokens = [view.get(p - p0, state.token_at(p)) if p >= p0 else state.token_at(p) for p in positions]
        explicit = SeqQuery(state, positions, tokens, [positions.index(read)], [], scratch=True,
                            inq_visible=[[True] * len(positions) for _ in positions], exclude=positions)
        torch.testing.assert_close(chain[i], logits_of(eng, cache, explicit)[0], atol=1e-4, rtol=1e-4)
