"""The training loop on CPU: the loss falls in a few steps, saved folders reload bit-exactly, runs resume."""
from __future__ import annotations

import json

import pytest
import torch

from flash_dllm.engine.training import artifacts, train
from flash_dllm.engine.training.objective import loss_terms


def tiny_args(out, *extra):
    return ["--preset", "tiny-cpu", "--out", str(out), "--d-model", "64", "--n-layers", "2", "--n-heads", "4",
            "--mlp-hidden", "128", "--pool", "3000", "--bpe-texts", "3000", "--workers", "1",
            "--tokens-per-step", "3000", "--val-per-family", "8", "--val-every", "1000", "--log-every", "1",
            "--lr", "2e-3", "--warmup", "5", "--minutes", "10", "--ckpt-every", "1000", "--block-view-share", "0.5",
            *extra]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("run") / "tiny"
    trainer = train.Trainer(train.parse_args(tiny_args(out, "--max-steps", "40")))
    trainer.train()
    trainer.save()
    return trainer


def test_loss_falls_in_a_few_cpu_steps(trained):
    losses = [row["loss"] for row in trained.log["train"]]
    assert len(losses) >= 35
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, (first, last)
    val = trained.log["val"]
    assert len(val) >= 2 and all(val[-1]["loss"][f] < val[0]["loss"][f] for f in val[0]["loss"])


def test_folder_has_the_llada_layout(trained):
    folder = trained.out
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llada" and config["architectures"] == ["LLaDAModelLM"]
    assert config["embedding_size"] % 64 == 0 and config["embedding_size"] >= config["vocab_size"]
    assert config["weight_tying"] is True and config["n_kv_heads"] == config["n_heads"]
    for name in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        assert (folder / name).is_file()
    assert (folder.parent / "tiny-loss.png").is_file() and (folder.parent / "tiny-training-log.json").is_file()


def test_saved_model_reloads_bit_exactly(trained, tmp_path):
    from safetensors.torch import load_file

    from flash_dllm.engine.weights import load_model

    saved = load_file(str(trained.out / "model.safetensors"))
    assert set(saved) == set(trained.params)
    for name, value in trained.params.items():
        assert saved[name].dtype == torch.bfloat16
        assert torch.equal(saved[name], value.detach().to(torch.bfloat16))
    # fp32 and sharded: the engine's loader gets back exactly the trained tensors
    folder = tmp_path / "fp32"
    artifacts.save_model_folder(folder, trained.params, trained.config, trained.tokenizer, dtype=torch.float32,
                                max_shard_bytes=100_000)
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1 and (folder / "model.safetensors.index.json").is_file()
    model = load_model(folder, "cpu", torch.float32)
    assert torch.equal(model.embed, trained.params["model.transformer.wte.weight"].detach())
    assert torch.equal(model.layers[1].w_down, trained.params["model.transformer.blocks.1.ff_out.weight"].detach())


def test_engine_forward_matches_training_forward(trained):
    """The loaded folder and the training parameters give the same loss on the same masked batch."""
    from flash_dllm.engine.weights import load_model

    batch, _, _ = trained.batcher.next()
    prompt, lens, answers = batch
    t = torch.full((len(answers),), 0.5)
    masked = torch.rand(answers.shape, generator=torch.Generator().manual_seed(0)) < 0.5
    with torch.no_grad():
        ours = loss_terms(trained.params, trained.model_cfg, trained.mask_id, prompt, lens, answers, masked, t)[0]
        engine = load_model(trained.out, "cpu", torch.float32)
        state = {name: value.detach().to(torch.bfloat16).float() for name, value in trained.params.items()}
        theirs = loss_terms(state, trained.model_cfg, trained.mask_id, prompt, lens, answers, masked, t)[0]
    assert torch.allclose(ours, theirs, atol=0.05)
    assert torch.equal(engine.embed, state["model.transformer.wte.weight"])


def test_run_resumes_from_its_checkpoint(trained):
    args = tiny_args(trained.out, "--max-steps", "45", "--resume")
    resumed = train.Trainer(train.parse_args(args))
    assert resumed.step == trained.step
    assert torch.equal(resumed.params["model.transformer.ln_f.weight"].detach(),
                       trained.params["model.transformer.ln_f.weight"].detach())
    resumed.train()
    assert resumed.step == 45


def test_loss_is_one_over_t_weighted_masked_cross_entropy(trained):
    batch, _, _ = trained.batcher.next()
    prompt, lens, answers = batch
    t = torch.linspace(0.2, 1.0, len(answers))
    masked = torch.rand(answers.shape, generator=torch.Generator().manual_seed(1)) < t[:, None]
    with torch.no_grad():
        weighted, ce_sum, _, count = loss_terms(trained.params, trained.model_cfg, trained.mask_id, prompt, lens,
                                                answers, masked, t)
        only_masked = loss_terms(trained.params, trained.model_cfg, trained.mask_id, prompt, lens, answers,
                                 masked, torch.ones_like(t))
    assert torch.allclose(weighted * t, only_masked[0], atol=1e-5)  # weight is exactly 1/t per row
    assert torch.all((count == 0) | (ce_sum > 0))


def test_block_view_masks_match_what_the_decoders_see():
    """Share 1: every row is clean before one 32-aligned block, masked after it, masked with probability t
    and weight 1/t inside it. Share 0: exactly the uniform masks, weight 1/t."""
    from flash_dllm.engine.training.objective import draw_masks

    torch.manual_seed(3)
    rows, width = 2000, 100
    answers = torch.zeros(rows, width, dtype=torch.long)
    t = torch.rand(rows) * 0.9 + 0.05
    masked, weight = draw_masks(answers, t, block_view_share=1.0, block_length=32)
    starts, inside, inside_masked = [], 0, 0
    for row in range(rows):
        after_weight_one = (weight[row] == 1.0).nonzero()
        end = int(after_weight_one[0]) if len(after_weight_one) else width  # where the fully masked suffix starts
        start = end - 32 if len(after_weight_one) else (width - 1) // 32 * 32
        starts.append(start)
        assert start % 32 == 0 and not masked[row, :start].any() and masked[row, end:].all()
        assert torch.allclose(weight[row, start:end], 1 / t[row])
        assert torch.all(weight[row, end:] == 1.0)
        inside += end - start
        inside_masked += int((masked[row, start:end].float()).sum())
    assert set(starts) == {0, 32, 64, 96}
    assert abs(inside_masked / inside - float(t.mean())) < 0.02  # in-block masks follow t
    torch.manual_seed(5)
    uniform, w0 = draw_masks(answers, t, 0.0)
    torch.manual_seed(5)
    assert torch.equal(uniform, torch.rand(answers.shape) < t[:, None])
    assert torch.allclose(w0, 1 / t[:, None].expand(rows, width))
    half, _ = draw_masks(answers, t, 0.5)
    clean_start = (~half[:, :40]).all(1).float().mean()  # only block views with a start > 0 keep 40 clean
    assert 0.25 < float(clean_start) < 0.45


def test_bf16_on_the_cpu_is_opt_in_and_trains(tmp_path):
    """--bf16-cpu runs the CPU's forward and backward under bf16 autocast (AVX512-BF16 matmuls), and still learns;
    without it the CPU trains in fp32 whatever --bf16 says (that flag is CUDA's)."""
    assert not train.Trainer(train.parse_args(tiny_args(tmp_path / "fp32", "--max-steps", "1"))).use_bf16
    torch.manual_seed(0)
    trainer = train.Trainer(train.parse_args(tiny_args(tmp_path / "bf16", "--max-steps", "25", "--bf16-cpu")))
    assert trainer.use_bf16
    seen = []
    loss = trainer.loss_fn

    def watched(*args):  # what autocast is in force while the loss (forward and graph) is built
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return loss(*args)

    trainer.loss_fn = watched
    trainer.train()
    assert seen and set(seen) == {(True, torch.bfloat16)}, set(seen)
    losses = [row["loss"] for row in trainer.log["train"]]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
