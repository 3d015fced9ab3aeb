"""The production decoder (device-resident step, engine/decode_loop.py) against the host reference
(engine/host_reference.py): the same tokens, forward passes and StepEvents for every method, on LLaDA and
Dream tiny models, batches of different prompt lengths, answers that end mid-window, sampling with a seed, and
the pipelined loop that reads records late."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

from flash_dllm.engine.tokenizer import load_tokenizer
from flash_dllm.engine.device_canvas import NOT_NEW, DeviceCanvas
from flash_dllm.engine.device_plan import top_k_select
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.model import forward_hidden
from flash_dllm.engine.sampling import noise_keys, uniform_noise
from flash_dllm.engine.sequence import SequenceState
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.strategies import threshold_select, top_k
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.kernels.threshold_select import threshold_select_reference
from flash_dllm.engine.weights import load_model
from decoder_testing import compare_to_reference, graph_and_eager, needs_cuda

PROMPTS = ["What is 12*7?", "hello there, how are you today?", "x", "Count: one two three four five six"]
FAMILIES = {"llada": TinySpec(family="llada"), "dream": TinySpec(family="dream", n_kv_heads=2)}
VARIANTS = {
    "llada": dict(method="llada"),
    "llada-cfg": dict(method="llada", cfg_scale=1.0, steps=16),
    "fast-dllm-dual": dict(method="fast-dllm"),
    "fast-dllm-prefix": dict(method="fast-dllm", cache_mode="prefix"),
    "flash-cache": dict(method="flash-cache"),
    "flash-cache-refresh-all": dict(method="flash-cache", track=-1),
    "flash-cache-track-beyond-slot": dict(method="flash-cache", track=500),
    "flash-verify-paper": dict(method="flash-verify", gamma=0.3),
    "flash-verify-cumulative": dict(method="flash-verify", gamma=0.05, acceptance="cumulative"),
    "flash-verify-cap-above-window": dict(method="flash-verify", gamma=0.3, max_candidates=12),  # window 8
    "llada-stop": dict(method="llada", end_rule="stop"),
    "flash-cache-official-end": dict(method="flash-cache", end_rule="official"),
    "dream-entropy": dict(method="dream", steps=16),
    "dream-origin": dict(method="dream", alg="origin", steps=16),
    "dream-margin-top-p-alg-temp": dict(method="dream", alg="topk_margin", top_p=0.9, alg_temp=0.5),
}


def make_engine(folder: Path) -> Engine:
    model = load_model(folder)
    return Engine(model, load_tokenizer(folder, model.config), folder.name, folder, "torch")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request, tmp_path_factory) -> Engine:
    return make_engine(write_tiny_model(tmp_path_factory.mktemp(request.param), FAMILIES[request.param]))


@pytest.fixture(scope="module")
def ending_engine(engine, tmp_path_factory) -> Engine:
    """The same model with its end-token rows of the head pushed towards the answer cells' hidden direction,
    just enough that flash-cache answers end after a few tokens, inside a window, and not at once."""
    biased = make_engine(engine.folder)
    model = biased.model
    ids = torch.tensor([biased.tokenizer.encode(PROMPTS[0]) + [model.config.mask_id] * 32])
    with torch.no_grad():
        direction = forward_hidden(model, ids)[0, -32:].mean(0)
    head = model.lm_head.clone()
    for tenth in range(1, 40):
        model.lm_head = head.clone()
        for end in biased.tokenizer.end_ids:
            model.lm_head[end] += tenth / 10 * direction / direction.norm()
        lengths = [len(r.token_ids) for r in biased.generate(PROMPTS, settings(method="flash-cache"))]
        if sum(3 <= n < 30 for n in lengths) >= 2:
            return biased
    pytest.fail("no bias ends answers mid-window")


def settings(**changes) -> GenerationSettings:
    base = GenerationSettings(method="flash-cache", gen_length=32, block_length=8, window=8, lookahead=8, track=8,
                              threshold=0.6)
    return base.with_overrides(**changes)


def compare(engine: Engine, s: GenerationSettings, prompts=PROMPTS, lag: int | None = None, defer: bool = False):
    """Generate with the device decoder and the host reference; assert the same outcome and events."""
    return compare_to_reference(engine, s, prompts, lag, defer=defer)[0]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_device_decoder_equals_host_reference(engine, variant):
    compare(engine, settings(**VARIANTS[variant]))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_device_decoder_equals_host_reference_when_answers_end_mid_window(ending_engine, variant):
    results = compare(ending_engine, settings(**VARIANTS[variant]))
    if not variant.startswith(("llada", "dream")):
        assert any(r.finish_reason == "eos" and 0 < len(r.token_ids) < 32 for r in results)


@pytest.mark.parametrize("variant", ["flash-cache", "flash-verify-paper", "fast-dllm-dual", "llada", "dream-entropy"])
def test_sampling_with_a_seed_equals_the_reference_and_repeats(engine, variant):
    s = settings(temperature=0.8, seed=11, **VARIANTS[variant])
    first = compare(engine, s)
    assert [r.token_ids for r in engine.generate(PROMPTS, s)] == [r.token_ids for r in first]
    greedy = engine.generate(PROMPTS, s.with_overrides(temperature=0.0))
    assert [r.token_ids for r in greedy] != [r.token_ids for r in first]


@pytest.mark.parametrize("variant", ["flash-cache", "flash-verify-paper", "llada"])
def test_pipelined_loop_reads_late_and_finished_sequences_commit_nothing(ending_engine, variant):
    """With the host two steps ahead of its reads (as on a GPU, where it is one), steps launched after a
    sequence finished must change nothing: same tokens, counters and events."""
    compare(ending_engine, settings(**VARIANTS[variant]), lag=2)


@pytest.mark.parametrize("variant", ["fast-dllm-dual", "fast-dllm-prefix"])
def test_events_built_after_the_next_launch_equal_the_reference(ending_engine, variant):
    """On a GPU a method that reads each record at once (fast-dllm: the next step's layout follows it) builds
    the record's events only after it has launched the next step; the events, tokens and counters stay the
    reference's, and each step's events reach the caller only once the step after it was launched."""
    s = settings(**VARIANTS[variant])
    ending_engine.generate(PROMPTS, s)
    session = ending_engine._decode[1]
    launches, seen = [], []
    launch = session.launch
    session.launch = lambda layouts: launches.append(len(launches)) or launch(layouts)
    try:
        results = compare(ending_engine, s, defer=True)
        launches.clear()
        ending_engine.generate(PROMPTS, s, on_event=lambda e: seen.append((e.step, len(launches)))
                               if getattr(e, "kind", "") == "step" else None)
    finally:
        session.launch = launch
    assert any(r.finish_reason == "eos" for r in results)
    last = max(step for step, _ in seen)  # step k's events follow launch k + 1 (k counts from 0), the last's its own
    assert all(n >= k + 2 for k, n in seen if k < last) and all(n == k + 1 for k, n in seen if k == last)


def test_prompt_alone_samples_what_it_samples_first_in_a_batch(engine):
    s = settings(temperature=0.9, seed=5)
    alone = engine.generate(PROMPTS[:1], s)[0]
    batch = engine.generate(PROMPTS, s)[0]
    assert alone.token_ids == batch.token_ids


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the commit kernel runs on the CPU only in the interpreter"))])
def test_device_commit_matches_the_host_commit_on_random_lists(backend):
    """Commits in any list order (Flash-Verify commits in confidence order), end tokens included: the device
    canvas keeps the same cells, end, padding and 'committed by this step' order as SequenceState.commit,
    with the tensor-operation commit and with the Triton kernel."""
    rng = random.Random(7)
    for _ in range(200 if backend == "torch" else 60):
        gen = rng.randrange(4, 20)
        canvas = DeviceCanvas.allocate(1, 40, gen, mask_id=99, eos_id=98, end_ids={97, 98}, device="cpu")
        canvas.use_kernels(backend)
        canvas.load([[1, 2, 3]], [gen], [0])
        state = SequenceState(0, [1, 2, 3], gen, 99, 98, frozenset({97, 98}))
        for _ in range(rng.randrange(1, 4)):
            canvas.begin_step()
            state.begin_step()
            base = None
            for _ in range(2):
                cells = rng.sample(range(gen), rng.randrange(0, gen + 1))
                tokens = [rng.choice([5, 6, 97, 98]) if rng.random() < 0.15 else rng.randrange(10, 20) for _ in cells]
                conf = [rng.random() for _ in cells]
                chosen = [rng.random() < 0.7 for _ in cells]
                committed = canvas.commit(torch.tensor([cells], dtype=torch.int64).reshape(1, -1),
                                          torch.tensor([tokens], dtype=torch.int64).reshape(1, -1),
                                          torch.tensor([conf], dtype=torch.float64).reshape(1, -1),
                                          torch.tensor([chosen], dtype=torch.bool).reshape(1, -1), rank_base=base)
                base = committed
                state.commit([c for c, k in zip(cells, chosen) if k], [t for t, k in zip(tokens, chosen) if k],
                             [p for p, k in zip(conf, chosen) if k])
                assert canvas.answer[0].tolist() == state.answer
                assert int(canvas.end[0]) == (gen if state.end is None else state.end)
                rank = canvas.newly_rank[0].tolist()
                assert sorted((r, c) for c, r in enumerate(rank) if r < NOT_NEW) == \
                    sorted((rank[c], c) for c in state.newly_committed)
                assert [c for _, c in sorted((r, c) for c, r in enumerate(rank) if r < NOT_NEW)] == state.newly_committed
            expected_tokens = state.tokens() + [98] * (40 - state.total_len)
            assert canvas.tokens[0, :40].tolist() == expected_tokens


def test_device_selection_rules_equal_the_host_rules():
    rng = random.Random(2)
    for _ in range(300):
        n, width = rng.randrange(0, 9), 8
        conf = [rng.choice([0.2, 0.5, 0.9, rng.random()]) for _ in range(n)]
        cells = torch.tensor([list(range(n)) + [-1] * (width - n)])
        padded_conf = torch.tensor([conf + [0.0] * (width - n)], dtype=torch.float64)
        real = torch.full_like(cells, 7)  # no [MASK] prediction: the fallback never steps in
        chosen = threshold_select_reference(cells, padded_conf, real, real, padded_conf,
                                            torch.tensor([0.9], dtype=torch.float64), 5)[0][0].tolist()
        assert [i for i in range(width) if chosen[i]] == threshold_select(conf, 0.9)
        k = rng.randrange(0, n + 1)
        picked = top_k_select(cells, padded_conf, torch.tensor([k]))[0].tolist()
        assert [i for i in range(width) if picked[i]] == top_k(conf, k)


def test_sampling_noise_is_keyed_uniform_and_differs_between_keys():
    keys = noise_keys(torch.tensor([[3], [3], [4]]), torch.tensor([[0], [1], [0]]), 0, torch.tensor([[5], [5], [5]]))
    noise = uniform_noise(keys.reshape(-1), 4096)
    assert bool(((noise > 0) & (noise < 1)).all())
    assert abs(noise.mean().item() - 0.5) < 0.02 and abs(noise.var().item() - 1 / 12) < 0.01
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    again = uniform_noise(noise_keys(torch.tensor([3]), torch.tensor([0]), 0, torch.tensor([5])), 4096)
    assert torch.equal(again[0], noise[0])


@needs_cuda
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cuda_graph_replay_equals_eager_on_tiny_models(tmp_path, variant):
    folder = write_tiny_model(tmp_path / "dream", TinySpec(family="dream", n_kv_heads=2))
    engine = Engine.load(str(folder), device="cuda", dtype="fp32", kernels="triton")
    (graph, graph_events, run), (eager, eager_events, _) = graph_and_eager(engine, PROMPTS, settings(**VARIANTS[variant]))
    assert run.graph_replays > 0
    assert [r.token_ids for r in graph] == [r.token_ids for r in eager]
    assert graph_events == eager_events


@needs_cuda
@pytest.mark.parametrize("geometry", ["llada-8b", "dream-7b"])
def test_cuda_graph_replay_equals_eager_at_full_geometry(geometry):
    assert_graph_equals_eager_at_full_geometry(geometry, (800, 517), ("flash-cache", "flash-verify", "fast-dllm"))


@needs_cuda
def test_cuda_graph_replay_equals_eager_with_wide_attention_tiles():
    """Eight full-budget sequences take the wide attention tiles (packing.attention_tile_rows) at full geometry."""
    from flash_dllm.engine.packing import WIDE_TILE_ROWS, Layout, attention_tile_rows

    assert attention_tile_rows(Layout.uniform(8, 128)) == WIDE_TILE_ROWS
    assert_graph_equals_eager_at_full_geometry("llada-8b", (800, 517, 640, 300, 800, 129, 701, 450),
                                               ("flash-cache", "flash-verify"))


def assert_graph_equals_eager_at_full_geometry(geometry: str, prompt_lengths, methods) -> None:
    from flash_dllm.engine.geometry import random_engine

    engine = random_engine(geometry, "cuda")
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(n)] for n in prompt_lengths]
    try:
        for method in methods:
            s = GenerationSettings(method=method, gen_length=64, block_length=32, seed=0, use_chat_template=False)
            (graph, _, run), (eager, _, _) = graph_and_eager(engine, prompts, s)
            assert run.graph_replays > 0, method
            assert [r.token_ids for r in graph] == [r.token_ids for r in eager], method
    finally:
        del engine
        torch.cuda.empty_cache()


@pytest.mark.parametrize("path", ["generate", "scheduler"])
def test_a_step_that_commits_nothing_ends_with_an_error_not_a_hang(engine, monkeypatch, path):
    """Every method commits at least one cell per step, so a sequence that outlives 2 x its cells + 8 steps has
    a broken step: the call ends with a message (and the engine still works), instead of decoding forever."""
    from flash_dllm.engine.engine import EngineError
    from flash_dllm.kernels.canvas_commit import CanvasCommit

    working = CanvasCommit.__call__
    monkeypatch.setattr(CanvasCommit, "__call__", lambda self, *args, **kw: torch.zeros_like(args[3]))
    s = settings(method="flash-cache", gen_length=16)
    if path == "generate":
        with pytest.raises(EngineError, match="stalled"):
            engine.generate([PROMPTS[0]], s)
    else:
        with pytest.raises(RuntimeError, match="stalled"):
            engine.submit(PROMPTS[0], s).result(timeout=120)
    monkeypatch.setattr(CanvasCommit, "__call__", working)
    assert len(engine.generate([PROMPTS[0]], s)[0].token_ids) > 0
