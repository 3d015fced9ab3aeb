"""Our `llada` and `dream` methods against plain re-statements of the published samplers (LLaDA's generate.py,
Dream's diffusion_generate), written here from the algorithms, one whole-sequence forward per step: the same
canvas cell for cell, answers that end early included. Also the [MASK]-commit rule, the end rules and the
progress guard of the threshold methods."""
from __future__ import annotations

import pytest
import torch

from flash_dllm.engine.engine import Engine
from flash_dllm.engine.host_reference import run_reference
from flash_dllm.engine.model import forward_full, forward_hidden
from flash_dllm.engine.sampling import noise_keys, uniform_noise
from flash_dllm.engine.settings import GenerationSettings, SettingsError, validate
from flash_dllm.engine.tiny import TinySpec, write_tiny_model

PROMPTS = ["What is 12*7?", "hello there, how are you today?", "x"]


def tiny(tmp_path_factory, family: str, end_bias: float = 0.0, mask_bias: float = 0.0) -> Engine:
    """A tiny model; end_bias pushes the end tokens' head rows towards the answer cells (answers end early),
    mask_bias the [MASK] row (some cells predict [MASK])."""
    folder = write_tiny_model(tmp_path_factory.mktemp(family), TinySpec(family=family, n_kv_heads=2 if family == "dream" else 4))
    engine = Engine.load(str(folder), device="cpu")
    model = engine.model
    ids = torch.tensor([engine.tokenizer.encode(PROMPTS[0]) + [model.config.mask_id] * 32])
    with torch.no_grad():
        direction = forward_hidden(model, ids)[0, -32:].mean(0)
    direction = direction / direction.norm()
    head = model.lm_head.clone()
    for end in engine.tokenizer.end_ids:
        head[end] += end_bias * direction
    head[model.config.mask_id] += mask_bias * direction
    model.lm_head = head
    return engine


@pytest.fixture(scope="module", params=[0.0, 2.0, 3.0], ids=["plain", "ends", "ends-sooner"])
def llada_engine(request, tmp_path_factory):
    return tiny(tmp_path_factory, "llada", end_bias=request.param)


@pytest.fixture(scope="module", params=[0.0, 2.0], ids=["plain", "ends"])
def dream_engine(request, tmp_path_factory):
    return tiny(tmp_path_factory, "dream", end_bias=request.param)


def logits_of(engine: Engine, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return forward_full(engine.model, torch.tensor([ids]))[0]


def plain_llada(engine: Engine, prompt: list[int], gen: int, block: int, steps: int) -> list[int]:
    """LLaDA's sampler: block b gets steps/blocks steps; each commits the k most confident masked cells before
    the block's end (confidence: softmax in the logits' dtype of the argmax over the whole vocabulary; ties to
    the earlier cell), k = the even split of the block's masks; a [MASK] prediction leaves its cell masked."""
    mask = engine.model.config.mask_id
    x = prompt + [mask] * gen
    P, per_block = len(prompt), steps // (gen // block)
    for b in range(gen // block):
        n = sum(t == mask for t in x[P + b * block: P + (b + 1) * block])
        quotas = [n // per_block + (1 if i < n % per_block else 0) for i in range(per_block)]
        for k in quotas:
            logits = logits_of(engine, x)
            probs = torch.softmax(logits, -1)
            top = logits.argmax(-1)
            conf = probs.gather(-1, top[:, None])[:, 0]
            open_ = [p for p in range(P, P + (b + 1) * block) if x[p] == mask]
            for p in sorted(sorted(open_, key=lambda p: (-conf[p].item(), p))[:k]):
                x[p] = int(top[p])
    return x[P:]


def plain_dream(engine: Engine, prompt: list[int], gen: int, steps: int, alg: str, seed: int) -> list[int]:
    """Dream's sampler: steps on timesteps linspace(1, 1e-3, steps + 1); logits of cell c from position c - 1;
    maskgit_plus / topk_margin / entropy confidences, the int(n * (1 - s/t)) most confident masked cells (all at
    the last step); origin: each masked cell with probability 1 - s/t (uniforms: our keyed noise)."""
    mask = engine.model.config.mask_id
    x = prompt + [mask] * gen
    P = len(prompt)
    t = torch.linspace(1, 1e-3, steps + 1)
    for i in range(steps):
        logits = logits_of(engine, x)  # already aligned: row p predicts token p
        open_ = [p for p in range(P, P + gen) if x[p] == mask]
        probs = torch.softmax(logits[open_], -1)
        conf, top = probs.max(-1)
        if alg == "topk_margin":
            two = probs.sort(-1, descending=True).values
            conf = two[:, 0] - two[:, 1]
        elif alg == "entropy":
            conf = (probs * torch.log(probs + 1e-10)).sum(-1)
        ratio = 1 - t[i + 1] / t[i] if i < steps - 1 else torch.tensor(1.0)
        if alg == "origin":
            cells = torch.tensor([p - P for p in open_])
            u = uniform_noise(noise_keys(torch.tensor([seed]), torch.tensor([i]), 2, cells), 1)[:, 0].float()
            chosen = [j for j in range(len(open_)) if u[j] < ratio or i == steps - 1]
        else:
            k = int(torch.tensor(float(len(open_))) * ratio) if i < steps - 1 else len(open_)
            chosen = sorted(range(len(open_)), key=lambda j: (-conf[j].item(), j))[:k]
        for j in chosen:
            x[open_[j]] = int(top[j])
    return x[P:]


def our_canvas(engine: Engine, prompt, s: GenerationSettings) -> tuple[list[int], list[int]]:
    """(answer of the device decoder, canvas of the host reference with [MASK] for masked cells)."""
    answer = engine.generate([prompt], s)[0].token_ids
    states = engine.new_states([prompt], s)
    run_reference(engine.model, engine.ops, s, states)
    assert answer == states[0].answer_ids()
    return answer, [engine.model.config.mask_id if t < 0 else t for t in states[0].answer]


def answer_of(engine: Engine, cells: list[int]) -> list[int]:
    out = []
    for token in cells:
        if token in engine.tokenizer.end_ids:
            break
        if token != engine.model.config.mask_id:
            out.append(token)
    return out


@pytest.mark.parametrize("block,steps", [(8, 32), (8, 16), (32, 32)])
def test_llada_equals_the_published_sampler_cell_for_cell(llada_engine, block, steps):
    s = GenerationSettings(method="llada", gen_length=32, block_length=block, steps=steps)
    assert s.resolved_end_rule == "official"
    for prompt in PROMPTS:
        ids = llada_engine.tokenizer.encode(prompt)
        expected = plain_llada(llada_engine, ids, 32, block, steps)
        answer, canvas = our_canvas(llada_engine, prompt, s)
        assert canvas == expected
        assert answer == answer_of(llada_engine, expected)


@pytest.mark.parametrize("alg,steps", [("maskgit_plus", 32), ("topk_margin", 32), ("entropy", 16), ("origin", 16)])
def test_dream_equals_the_published_sampler_cell_for_cell(dream_engine, alg, steps):
    s = GenerationSettings(method="dream", gen_length=32, steps=steps, alg=alg, seed=3)
    for prompt in PROMPTS:
        ids = dream_engine.tokenizer.encode(prompt)
        expected = plain_dream(dream_engine, ids, 32, steps, alg, seed=3)
        answer, canvas = our_canvas(dream_engine, prompt, s)
        assert canvas == expected
        assert answer == answer_of(dream_engine, expected)


def test_the_end_rules_differ_where_answers_end_early(tmp_path_factory):
    """Official: no padding, the cells after the end are decoded on; stop: padding after the end. The answers
    of the biased model end early, and at least one differs between the rules (the context differs)."""
    engine = tiny(tmp_path_factory, "llada", end_bias=3.0)
    official = GenerationSettings(method="llada", gen_length=32, block_length=8)
    stop = official.with_overrides(end_rule="stop")
    differ = False
    for prompt in PROMPTS:
        events = []
        a = engine.generate([prompt], official, on_event=events.append)[0]
        b = engine.generate([prompt], stop)[0]
        assert a.finish_reason == "eos" and len(a.token_ids) < 31
        assert all(getattr(e, "padding_from", None) is None for e in events)
        decoded = {c for e in events if getattr(e, "kind", "") == "step" for c in e.committed}
        assert decoded == set(range(32)), "official: every cell is decoded, after the end too"
        differ |= a.token_ids != b.token_ids or a.forward_passes != b.forward_passes
    assert differ


@pytest.mark.parametrize("method", ["llada", "fast-dllm", "flash-cache", "flash-verify", "dream"])
def test_a_predicted_mask_id_is_never_committed(tmp_path_factory, method):
    """With the [MASK] row of the head raised, many cells predict [MASK]: they stay masked (and are predicted
    again), no answer holds the mask id, the threshold methods still finish, device == host reference."""
    engine = tiny(tmp_path_factory, "llada", mask_bias=2.5)
    mask = engine.model.config.mask_id
    s = GenerationSettings(method=method, gen_length=32, block_length=8, window=8, lookahead=8, track=8,
                           threshold=0.6, gamma=0.3)
    states = engine.new_states(PROMPTS, s)
    with torch.no_grad():
        first = forward_full(engine.model, torch.tensor([states[0].prompt_ids + [mask] * 32]))[0, -32:].argmax(-1)
    assert (first == mask).any(), "the bias must make some cell predict [MASK]"
    results = engine.generate(PROMPTS, s)
    run_reference(engine.model, engine.ops, s, states)
    for result, state in zip(results, states):
        assert mask not in result.token_ids and mask not in state.answer
        assert result.token_ids == state.answer_ids()
        assert result.forward_passes == state.forward_passes


def test_end_rule_and_dream_settings_are_validated():
    with pytest.raises(SettingsError, match="end rule"):
        validate(GenerationSettings(end_rule="later"))
    with pytest.raises(SettingsError, match="alg"):
        validate(GenerationSettings(method="dream", alg="greedy"))
    with pytest.raises(SettingsError, match="steps"):
        validate(GenerationSettings(method="dream", gen_length=32, steps=33))
    with pytest.raises(SettingsError, match="top p"):
        validate(GenerationSettings(method="dream", top_p=0.0))
    for method in ("llada", "fast-dllm", "flash-cache", "flash-verify"):  # they would ignore Dream's filters
        with pytest.raises(SettingsError, match=f"^top k filters method dream's sampling only; method {method}"):
            validate(GenerationSettings(method=method, top_k=5))
        with pytest.raises(SettingsError, match="^top p filters method dream's"):
            validate(GenerationSettings(method=method, top_p=0.9))
        validate(GenerationSettings(method=method, top_p=1))  # filters nothing
    validate(GenerationSettings(method="dream", top_p=0.9, top_k=5))
    validate(GenerationSettings(method="dream", gen_length=32, block_length=32, steps=5))  # no block constraint
    assert GenerationSettings(method="flash-cache").resolved_end_rule == "stop"
    assert GenerationSettings(method="fast-dllm").resolved_end_rule == "official"
    assert GenerationSettings(method="flash-cache", end_rule="official").resolved_end_rule == "official"
