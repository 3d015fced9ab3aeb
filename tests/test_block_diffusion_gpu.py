"""Block diffusion on the GPU (skipped on CPU: graph replay equals eager and the reference; LLaDA-8B's geometry
with blocks of 32 against forward_full) and `flash-dllm-chat bench decode --methods block-diffusion`."""
from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

from flash_dllm.app.cli import main
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.model import forward_full
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from decoder_testing import graph_and_eager, needs_cuda
from test_block_diffusion import BLOCK, PROMPTS, compare, settings


@pytest.mark.slow
def test_bench_decode_times_block_diffusion_on_a_model_without_a_block_size(tiny_llada, tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "decode", "--model", str(tiny_llada), "--methods", "block-diffusion,flash-cache",
                 "--batch-sizes", "1", "--prompt-length", "12", "--gen-length", "16", "--iterations", "4",
                 "--repeats", "1", "--device", "cpu", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = json.loads((out / "decode.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["block-diffusion", "flash-cache"]
    assert all(r["iterations_per_process"] >= 1 and r["tokens_per_s"] > 0 for r in rows)


@needs_cuda
@pytest.mark.parametrize("method", ["block-diffusion", "block-diffusion-verify"])
def test_cuda_graph_replay_equals_eager_and_the_reference_on_a_tiny_model(tmp_path, method):
    folder = write_tiny_model(tmp_path / "llada", TinySpec(family="llada"))
    engine = Engine.load(str(folder), device="cuda", dtype="fp32", kernels="triton")
    engine.model.config = dataclasses.replace(engine.model.config, block_size=BLOCK)
    s = settings(method=method, threshold=0.6, gamma=0.05, acceptance="cumulative")
    (graph, graph_events, run), (eager, eager_events, _) = graph_and_eager(engine, PROMPTS, s)
    assert run.graph_replays > 0
    assert [r.token_ids for r in graph] == [r.token_ids for r in eager]
    assert graph_events == eager_events
    if method == "block-diffusion":  # Triton kernels on the GPU against the plain reference, in fp32
        compare(engine, s)


@needs_cuda
def test_full_geometry_block_path_matches_forward_full_and_replays_as_graphs():
    """LLaDA-8B's geometry with a block-causal mask of 32 (bf16, random weights): the first step's logits (the
    ragged prompts prefilled block by block in one forward) match forward_full over the prefix, and the
    graph-replayed decode equals the eager one."""
    from flash_dllm.engine.geometry import random_engine

    engine = random_engine("llada-8b", "cuda")
    engine.model.config = dataclasses.replace(engine.model.config, block_size=32)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(n)] for n in (800, 517)]
    s = GenerationSettings(method="block-diffusion", gen_length=64, block_length=32, seed=0, use_chat_template=False)
    try:
        engine.generate(prompts, s)
        session = engine._decode[1]
        captured, logits_of = [], session._logits
        session._logits = lambda plan, layout, mask_prompt=False: captured.append(
            (plan.cells.clone(), session.canvas.tokens.clone(), logits_of(plan, layout))) or captured[-1][2]
        engine.generate(prompts, s)
        del session._logits
        cells, tokens, logits = captured[0]
        for slot, prompt in enumerate(prompts):
            row = [c for c in cells[slot].tolist() if c >= 0]
            end = (len(prompt) // 32 + 1) * 32
            at = [len(prompt) + c for c in row]
            full = forward_full(engine.model, tokens[slot: slot + 1, :end])[0, at].float()
            config = engine.model.config
            engine.model.config = dataclasses.replace(config, block_size=None)  # the wrong, bidirectional mask
            wrong = forward_full(engine.model, tokens[slot: slot + 1, :end])[0, at].float()
            engine.model.config = config
            got = logits.view(len(prompts), 32, -1)[slot, : len(row)].float()
            error = (got - full).norm() / full.norm()
            assert error < 5e-2 and error < 0.5 * (wrong - full).norm() / full.norm()
        (graph, _, run), (eager, _, _) = graph_and_eager(engine, prompts, s)
        assert run.graph_replays > 0
        assert [r.token_ids for r in graph] == [r.token_ids for r in eager]
    finally:
        del engine
        torch.cuda.empty_cache()


@needs_cuda
def test_bench_decode_block_diffusion_at_full_geometry(tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "decode", "--geometry", "llada-8b", "--methods", "block-diffusion,block-diffusion-verify",
                 "--batch-sizes", "1,8", "--iterations", "20", "--repeats", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = json.loads((out / "decode.json").read_text())["rows"]
    assert all(r["iterations_per_process"] >= 1 for r in rows)
