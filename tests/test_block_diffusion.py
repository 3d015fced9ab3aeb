"""Block diffusion (engine/block_diffusion.py) against its plain host reference (engine/block_diffusion_reference.py):
the same tokens, forward passes and StepEvents on tiny LLaDA-format models whose attention is block-causal, in
ragged batches whose prompts end mid-block, with answers that end mid-block and with sampling; the cached block
path's logits equal forward_full's over the same prefix; every other method is refused for such a model, and
block-diffusion for a bidirectional one."""
from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from flash_dllm.engine.block_diffusion import BlockDiffusion, llada2_quota
from flash_dllm.engine.block_diffusion_reference import llada2_commit_indices
from flash_dllm.engine.device_plan import top_k_select
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.model import forward_full, forward_hidden
from flash_dllm.engine.settings import GenerationSettings, SettingsError, validate
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.engine.tokenizer import load_tokenizer
from flash_dllm.engine.weights import load_model
from decoder_testing import compare_to_reference, step_fields

BLOCK = 8
# prompt lengths 36, 54, 24 and 57 tokens (chat template): three end mid-block, one on a block boundary
PROMPTS = ["What is 12*7?", "hello there, how are you today?", "x", "Count: one two three four five six"]
VARIANTS = {
    "threshold": dict(threshold=0.6),
    "low-threshold": dict(threshold=0.3),
    "quota-of-two": dict(threshold=0.95, steps=16),  # 4 steps per block of 8: at least 2 cells a step
    "sampling": dict(threshold=0.5, temperature=0.8, seed=11),
}


def block_engine(folder, block_size: int | None = BLOCK) -> Engine:
    model = load_model(folder)
    model.config = dataclasses.replace(model.config, block_size=block_size)
    return Engine(model, load_tokenizer(folder, model.config), folder.name, folder, "torch")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("llada-block"), TinySpec(family="llada"))


@pytest.fixture(scope="module")
def engine(folder) -> Engine:
    return block_engine(folder)


@pytest.fixture(scope="module")
def ending_engine(folder) -> Engine:
    """The same model with its end tokens pushed towards the answer cells' direction, just enough that some
    answers end after a few tokens, in the middle of a block."""
    biased = block_engine(folder)
    model = biased.model
    ids = torch.tensor([biased.tokenizer.encode(PROMPTS[0]) + [model.config.mask_id] * 32])
    with torch.no_grad():
        direction = forward_hidden(model, ids)[0, -32:].mean(0)
    head = model.lm_head.clone()
    for tenth in range(1, 40):
        model.lm_head = head.clone()
        for end in biased.tokenizer.end_ids:
            model.lm_head[end] += tenth / 10 * direction / direction.norm()
        lengths = [len(r.token_ids) for r in biased.generate(PROMPTS, settings(threshold=0.6))]
        if sum(2 <= n < 30 and n % BLOCK for n in lengths) >= 2:
            return biased
    pytest.fail("no bias ends answers mid-block")


def settings(**changes) -> GenerationSettings:
    return GenerationSettings(method="block-diffusion", gen_length=32, block_length=BLOCK).with_overrides(**changes)


def compare(engine: Engine, s: GenerationSettings, prompts=PROMPTS, lag: int | None = None):
    return compare_to_reference(engine, s, prompts, lag, events_match=same_events)


def same_events(device: list[dict], reference: list[dict]) -> bool:
    """Equal events; confidences (rounded to 4 digits) within one unit of the last digit: the reference's
    cache-free forward and the cached kernels round differently (exactly equal with the torch kernels)."""
    def rest(rows):
        return [{k: v for k, v in row.items() if k != "confidences"} for row in rows]

    close = all(len(a["confidences"]) == len(b["confidences"]) and
                all(abs(x - y) <= 1.5e-4 for x, y in zip(a["confidences"], b["confidences"]))
                for a, b in zip(device, reference))
    return rest(device) == rest(reference) and close


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_device_decoder_equals_the_plain_reference(engine, variant):
    results, _ = compare(engine, settings(**VARIANTS[variant]))
    if variant == "low-threshold":
        assert any(r.steps < 32 for r in results)  # some steps commit several cells above the threshold
    if variant == "quota-of-two":
        assert all(r.steps <= 4 * 5 for r in results)  # 4 steps a block, the answer spans at most 5 blocks


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_device_decoder_equals_the_reference_when_answers_end_mid_block(ending_engine, variant):
    results, _ = compare(ending_engine, settings(**VARIANTS[variant]))
    if variant != "sampling":
        assert any(r.finish_reason == "eos" and len(r.token_ids) % BLOCK for r in results)


def test_pipelined_loop_reads_late_and_finished_sequences_commit_nothing(ending_engine):
    compare(ending_engine, settings(threshold=0.6), lag=2)


def test_sampling_repeats_with_its_seed_and_differs_from_greedy(engine):
    s = settings(**VARIANTS["sampling"])
    first = [r.token_ids for r in engine.generate(PROMPTS, s)]
    assert [r.token_ids for r in engine.generate(PROMPTS, s)] == first
    assert [r.token_ids for r in engine.generate(PROMPTS, s.with_overrides(temperature=0.0))] != first


def test_cached_block_logits_equal_forward_full_over_the_prefix(engine):
    """Every forward of the block path: its logits at the block's cells equal forward_full's over the prefix
    [0, block end) as the canvas stood before the step; its queries are the current block (and, right after
    a block completed, that block once more), its keys end at the current block's end."""
    engine._decode = None
    engine.generate(PROMPTS, settings(threshold=0.6))  # builds the session
    session = engine._decode[1]
    seen, pack, logits_of = [], session.packer.pack, session._logits

    def recording_pack(plan, layout, mask_prompt=False):
        step = pack(plan, layout, mask_prompt)
        seen[-1]["step"] = step
        return step

    def recording_logits(plan, layout, mask_prompt=False):
        seen.append(dict(tokens=session.canvas.tokens.clone(), cells=plan.cells.clone(),
                         block=session.method.block.clone(), first=bool((session.canvas.steps == 0).any())))
        out = logits_of(plan, layout, mask_prompt)
        seen[-1]["logits"] = out
        return out

    session.packer.pack, session._logits = recording_pack, recording_logits
    try:
        engine.generate(PROMPTS, settings(threshold=0.6))
    finally:
        del session.packer.pack, session._logits
    prompt_len = session.canvas.prompt_len.tolist()
    total = (session.canvas.prompt_len + session.canvas.gen_len).tolist()
    trash = session.cache.trash_row
    assert len(seen) > 4
    for record in seen:
        logits = record["logits"].view(len(PROMPTS), BLOCK, -1)
        step = record["step"]
        for s in range(len(PROMPTS)):
            cells = [c for c in record["cells"][s].tolist() if c >= 0]
            if not cells:
                continue
            end = min((int(record["block"][s]) + 1) * BLOCK, total[s])
            full = forward_full(engine.model, record["tokens"][s: s + 1, :end])[0]
            expected = full[[prompt_len[s] + c for c in cells]]
            assert torch.allclose(logits[s, : len(cells)], expected, atol=1e-4, rtol=1e-4)
            if not record["first"]:  # steady: 2 entries of B rows per slot, keys ending by the block's end
                assert int((step.write_rows.view(len(PROMPTS), 2 * BLOCK)[s] != trash).sum()) <= 2 * BLOCK
                assert int(step.plan.kv_len.view(len(PROMPTS), 2)[s].max()) <= end
                assert int(step.plan.q_len.view(len(PROMPTS), 2)[s, 1]) == end - int(record["block"][s]) * BLOCK


def test_commit_rule_device_equals_host_on_random_lists():
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randrange(0, BLOCK + 1)
        conf = [rng.choice([0.2, 0.5, 0.9, 0.95, rng.random()]) for _ in range(n)]
        quota = rng.randrange(0, 4)
        cells = torch.tensor([list(range(n)) + [-1] * (BLOCK - n)])
        padded = torch.tensor([conf + [0.0] * (BLOCK - n)], dtype=torch.float64)
        count = llada2_quota(padded, cells, torch.tensor([0.9], dtype=torch.float64), torch.tensor([quota]))
        picked = top_k_select(cells, padded, count)[0].tolist()
        assert [i for i in range(BLOCK) if picked[i]] == llada2_commit_indices(conf, 0.9, quota)
    assert llada2_commit_indices([0.9, 0.95, 0.1], 0.9, 1) == [1]  # strictly above the threshold
    assert llada2_commit_indices([0.3, 0.95, 0.4], 0.9, 2) == [1, 2]  # too few above: the quota's best


def test_other_methods_are_refused_for_a_block_model_and_block_diffusion_for_a_bidirectional_one(engine, folder):
    cfg = engine.model.config
    for method in ("flash-cache", "flash-verify", "fast-dllm", "llada"):
        with pytest.raises(SettingsError, match="block-diffusion"):
            validate(settings(method=method), model_config=cfg)
        with pytest.raises(SettingsError, match="block-diffusion model"):
            engine.generate(PROMPTS[:1], settings(method=method))  # the decode session refuses it too
        with pytest.raises(SettingsError, match="block-diffusion"):
            engine.submit(PROMPTS[0], settings(method=method))
    with pytest.raises(SettingsError, match="block size 8"):
        validate(settings(block_length=16), model_config=cfg)
    with pytest.raises(SettingsError, match="block size 8"):
        engine.generate(PROMPTS[:1], settings(block_length=16))
    validate(settings(), model_config=cfg)
    plain = block_engine(folder, block_size=None)
    with pytest.raises(SettingsError, match="bidirectionally"):
        validate(settings(), model_config=plain.model.config)
    with pytest.raises(SettingsError, match="bidirectionally"):
        plain.generate(PROMPTS[:1], settings())
    validate(settings(method="flash-cache"), model_config=plain.model.config)
    with pytest.raises(SettingsError, match="guidance"):
        validate(settings(cfg_scale=1.0))


def test_dream_style_shifted_models_are_refused(tmp_path):
    folder = write_tiny_model(tmp_path / "dream", TinySpec(family="dream", n_kv_heads=2))
    engine = block_engine(folder)
    with pytest.raises(SettingsError, match="in place"):
        validate(settings(), model_config=engine.model.config)
    with pytest.raises(SettingsError, match="in place"):
        engine.generate(PROMPTS[:1], settings())


def test_the_scheduler_runs_block_diffusion_and_each_request_gets_its_solo_answer(engine):
    s = settings(threshold=0.6)
    solo = []
    for prompt in PROMPTS:
        events = []
        solo.append((engine.generate([prompt], s, on_event=events.append)[0], step_fields(events)))
    streams = [[] for _ in PROMPTS]
    requests = [engine.submit(p, s, on_event=events.append) for p, events in zip(PROMPTS, streams)]
    results = [r.result(120) for r in requests]
    assert [r.token_ids for r in results] == [r.token_ids for r, _ in solo]
    assert [r.forward_passes for r in results] == [r.forward_passes for r, _ in solo]
    assert [step_fields(events) for events in streams] == [events for _, events in solo]


def test_block_diffusion_method_reports_its_blocks():
    from flash_dllm.engine.device_canvas import DeviceCanvas

    canvas = DeviceCanvas.allocate(2, 48, 16, mask_id=99, eos_id=98, end_ids={98}, device="cpu")
    canvas.load([[1] * 13, [2] * 16], [16, 16], [0, 0])
    method = BlockDiffusion(canvas, BLOCK, 4, shift=False)
    assert method.block.tolist() == [1, 2]  # the prompt's last block (13 // 8) and, aligned, the next one
    plan = method.plan(canvas)
    assert plan.cells[0].tolist() == [0, 1, 2, -1, -1, -1, -1, -1]  # cells 0-2 share block 1 with the prompt
    assert plan.in_query[0].nonzero().flatten().tolist() == list(range(16))  # first step: the whole prefix
    assert plan.in_query[1].nonzero().flatten().tolist() == list(range(24))


def test_flash_verify_inside_the_block_accepting_nothing_changes_nothing(engine):
    """gamma above 1 rejects every draft: the verify pass (scratch rows only, later blocks hidden) must leave
    the draft path's tokens exactly as plain block-diffusion commits them."""
    plain = engine.generate(PROMPTS, settings(threshold=0.6))
    verified = engine.generate(PROMPTS, settings(method="block-diffusion-verify", threshold=0.6, gamma=1.5))
    assert [r.token_ids for r in verified] == [r.token_ids for r in plain]
    assert [r.forward_passes - r.verify_passes for r in verified] == [r.forward_passes for r in plain]
    assert all(r.verify_passes > 0 and r.accepted_drafts == 0 for r in verified)


def test_flash_verify_inside_the_block_accepts_drafts_and_saves_steps(engine):
    s = settings(method="block-diffusion-verify", threshold=0.6, gamma=0.05, acceptance="cumulative")
    first = engine.generate(PROMPTS, s)
    assert sum(r.accepted_drafts for r in first) > 0
    assert sum(r.steps for r in first) < sum(r.steps for r in engine.generate(PROMPTS, settings(threshold=0.6)))
    assert [r.token_ids for r in engine.generate(PROMPTS, s)] == [r.token_ids for r in first]
    assert [r.token_ids for r in engine.generate(PROMPTS[:1], s)] == [first[0].token_ids]  # alone = in a batch


def test_flash_verify_inside_the_block_never_reads_past_the_block(engine):
    """Whatever the cache holds past the current block's end (never written this call, or another call's),
    the verify pass must not see it: garbage there changes no decision."""
    s = settings(method="block-diffusion-verify", threshold=0.6, gamma=0.05, acceptance="cumulative")
    engine._decode = None
    clean = engine.generate(PROMPTS, s)
    cache = engine._decode[1].cache
    generator = torch.Generator().manual_seed(0)
    cache.k.copy_(torch.randn(cache.k.shape, generator=generator) * 30)
    cache.v.copy_(torch.randn(cache.v.shape, generator=generator) * 30)
    dirty = engine.generate(PROMPTS, s)
    assert [(r.token_ids, r.accepted_drafts, r.steps) for r in dirty] == \
        [(r.token_ids, r.accepted_drafts, r.steps) for r in clean]


def test_the_canvas_shows_block_diffusion_blocks_where_they_are_and_as_they_complete(engine):
    import re

    from flash_dllm.app.canvas import Canvas
    from flash_dllm.engine.events import CanvasStart

    events = []
    engine.generate(PROMPTS[:1], settings(threshold=0.6), on_event=events.append)
    canvas = Canvas.from_start(next(e for e in events if isinstance(e, CanvasStart)))
    steps = [e for e in events if getattr(e, "kind", "") == "step"]
    prompt_len = len(engine.tokenizer.encode(PROMPTS[0]))
    first = BLOCK - prompt_len % BLOCK  # answer cells that share the prompt's last block

    def classes() -> list[set[str]]:
        cells = canvas.render().split('<div class="fd-cells">', 1)[1].split('<div class="fd-legend">')[0]
        return [set(m.split()) for m in re.findall(r'<i class="(k [^"]*)"', cells)]

    canvas.apply(steps[0])
    assert [i for i, c in enumerate(classes()) if "b" in c] == list(range(first, 32, BLOCK))
    for event in steps[1:]:
        canvas.apply(event)
        done = [i for i, c in enumerate(classes()) if "x" in c]
        complete = [b for b in [range(0, first)] + [range(s, min(s + BLOCK, 32)) for s in range(first, 32, BLOCK)]
                    if all(canvas.state[c] != "masked" for c in b)]
        assert done == sorted(c for b in complete for c in b if canvas.state[c] == "committed")
    assert len(done) == 32 - canvas.padding_cells


@pytest.mark.slow
def test_triton_kernels_in_the_interpreter_equal_the_reference(folder):
    """The block entries (B-row attention sequences, their tiles) through the Triton kernels (interpreted here)."""
    engine = Engine.load(str(folder), device="cpu", kernels="triton")
    engine.model.config = dataclasses.replace(engine.model.config, block_size=BLOCK)
    compare(engine, settings(threshold=0.6, gen_length=16), prompts=PROMPTS[:2])


@pytest.mark.parametrize("mask_bias", [2.5, 50.0], ids=["some-mask", "all-mask"])
def test_predicted_mask_ids_are_never_committed_and_decoding_still_ends(folder, mask_bias):
    """A cell predicting [MASK] stays masked; when every chosen cell of a step predicts it (a greedy step would
    then repeat forever), the most probable real token is committed, on the device as in the reference."""
    biased = block_engine(folder)
    model = biased.model
    ids = torch.tensor([biased.tokenizer.encode(PROMPTS[0]) + [model.config.mask_id] * 32])
    with torch.no_grad():
        direction = forward_hidden(model, ids)[0, -32:].mean(0)
    model.lm_head = model.lm_head.clone()
    model.lm_head[model.config.mask_id] += mask_bias * direction / direction.norm()
    results, states = compare(biased, settings(threshold=0.6))
    assert all(model.config.mask_id not in r.token_ids for r in results)
    assert all(r.finish_reason in ("eos", "length") for r in results)
