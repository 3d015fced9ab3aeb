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


def _fp32_copy(model):
    """The same weights in fp32 (the reference both bf16 paths are measured against)."""
    f32 = lambda t: None if t is None else t.float()  # noqa: E731
    layers = [dataclasses.replace(layer, **{f.name: f32(getattr(layer, f.name)) for f in dataclasses.fields(layer)
                                            if isinstance(getattr(layer, f.name), torch.Tensor)})
              for layer in model.layers]
    return dataclasses.replace(model, embed=f32(model.embed), layers=layers, final_norm=f32(model.final_norm),
                               lm_head=f32(model.lm_head))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@needs_cuda
def test_full_geometry_block_path_matches_forward_full_and_replays_as_graphs():
    """LLaDA-8B's geometry with a block-causal mask of 32 (bf16, random weights): the first step's logits (the
    ragged prompts prefilled block by block in one forward) match forward_full over the prefix, and the
    graph-replayed decode equals the eager one.

    Both are measured against forward_full in fp32 on the same weights: the block path (bf16, Triton kernels)
    must be as close to it as bf16 forward_full is (its rounding noise over 32 random layers is several
    percent, so no fixed bound fits), and far closer than the same forward with the wrong, bidirectional mask."""
    from flash_dllm.engine.geometry import random_engine

    engine = random_engine("llada-8b", "cuda")
    engine.model.config = dataclasses.replace(engine.model.config, block_size=32)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(n)] for n in (800, 517)]
    s = GenerationSettings(method="block-diffusion", gen_length=64, block_length=32, seed=0, use_chat_template=False)
    try:
        (graph, _, run), (eager, _, _) = graph_and_eager(engine, prompts, s)
        assert run.graph_replays > 0
        assert [r.token_ids for r in graph] == [r.token_ids for r in eager]
        engine.generate(prompts, s)  # builds the session (graph_and_eager leaves none)
        session = engine._decode[1]
        captured, logits_of = [], session._logits
        session._logits = lambda plan, layout, mask_prompt=False: captured.append(
            (plan.cells.clone(), session.canvas.tokens.clone(), logits_of(plan, layout))) or captured[-1][2]
        engine.generate(prompts, s)
        del session._logits
        cells, tokens, logits = captured[0]
        model = engine.model
        reference = _fp32_copy(model)
        for slot, prompt in enumerate(prompts):
            row = [c for c in cells[slot].tolist() if c >= 0]
            end = (len(prompt) // 32 + 1) * 32
            at = [len(prompt) + c for c in row]
            ids = tokens[slot: slot + 1, :end]
            with torch.no_grad():
                exact = forward_full(reference, ids)[0, at].float()
                full = forward_full(model, ids)[0, at].float()
                config = model.config
                reference.config = dataclasses.replace(config, block_size=None)  # the wrong, bidirectional mask
                wrong = forward_full(reference, ids)[0, at].float()
                reference.config = config
            got = logits.view(len(prompts), 32, -1)[slot, : len(row)].float()
            noise, error, mask_gap = _rel(full, exact), _rel(got, exact), _rel(wrong, exact)
            print(f"slot {slot}: block path {error:.4f}, bf16 forward_full {noise:.4f}, wrong mask {mask_gap:.4f}")
            assert error < 2 * max(noise, 1e-3) and error < 0.5 * mask_gap
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
