"""The issue-22 pipeline end to end on the CPU, at tiny sizes: train on the everyday families, warm-start with
the full mix (the H200 run's path), evaluate the new families through the engine's decoders."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from flash_dllm.engine.training import data, evaluate, train

BUNDLED = Path(__file__).resolve().parents[1] / "assets" / "models" / "tiny-chat"
NEW = ",".join(data.EVERYDAY_FAMILIES)


def tiny_args(out, *extra):
    return ["--preset", "tiny-cpu", "--out", str(out), "--d-model", "64", "--n-layers", "2", "--n-heads", "4",
            "--mlp-hidden", "128", "--pool", "2000", "--bpe-texts", "2000", "--workers", "1",
            "--tokens-per-step", "3000", "--val-per-family", "4", "--val-every", "1000", "--log-every", "1",
            "--lr", "2e-3", "--warmup", "3", "--minutes", "5", "--ckpt-every", "1000", *extra]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("everyday") / "fresh"
    trainer = train.Trainer(train.parse_args(tiny_args(out, "--max-steps", "12", "--families", NEW)))
    trainer.train()
    trainer.save()
    return trainer


def test_training_on_the_everyday_families_lowers_their_loss(fresh):
    losses = [row["loss"] for row in fresh.log["train"]]
    assert all(math.isfinite(x) for x in losses) and sum(losses[-3:]) < sum(losses[:3])
    assert set(fresh.log["val"][-1]["loss"]) == set(data.EVERYDAY_FAMILIES)


def test_a_warm_start_trains_the_full_mix_on_the_same_weights(fresh, tmp_path):
    args = tiny_args(tmp_path / "warm", "--max-steps", "4", "--init-from", str(fresh.out),
                     "--families", ",".join(data.FAMILIES))
    warm = train.Trainer(train.parse_args(args))
    start = {name: value.detach().clone() for name, value in warm.params.items()}
    assert all(torch.equal(start[n], fresh.params[n].detach().to(torch.bfloat16).float()) for n in start)
    assert set(warm.val.families) >= set(data.FAMILIES)  # every family validated, old and new
    warm.train()
    assert warm.log["previous"]["n_params"] == fresh.n_params  # the history of the weights is kept
    assert all(math.isfinite(row["loss"]) for row in warm.log["train"])


def test_the_new_families_evaluate_per_family_through_the_decoders(fresh, tmp_path):
    out = tmp_path / "probe.json"
    code = evaluate.main(["--model", str(fresh.out), "--per-family", "3", "--device", "cpu", "--families", NEW,
                          "--decoders", "flash-cache,llada", "--gen-length", "32", "--block-length", "16",
                          "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    for decoder in ("flash-cache", "llada"):
        row = results["decoders"][decoder]
        assert set(row) == set(data.EVERYDAY_FAMILIES)
        assert all(row[f]["n"] == 3 and 0.0 <= row[f]["exact"] <= 100.0 for f in row)
        for cell in row.values():  # the per-kind counts add up to the cell and to its exact rate
            assert sum(n for _, n in cell["by_kind"].values()) == 3
            assert abs(100.0 * sum(r for r, _ in cell["by_kind"].values()) / 3 - cell["exact"]) < 1e-9
            assert len(cell["failures"]) == min(3, round(3 - 3 * cell["exact"] / 100))
            assert all(f["kind"] in cell["by_kind"] for f in cell["failures"])
    assert "| everyday_word |" in evaluate.markdown_table(results)
    assert "final" in evaluate.markdown_table(results).split("| everyday_word |")[1].split("\n")[0]


def test_a_warm_start_from_the_bundled_model_runs_with_its_tokenizer(tmp_path):
    """The H200 command's path: the bundled weights and tokenizer, the full mix, a few CPU steps."""
    if not (BUNDLED / "config.json").is_file():
        pytest.fail("the bundled tiny-chat model is missing")
    args = ["--out", str(tmp_path / "tiny-chat"), "--init-from", str(BUNDLED), "--device", "cpu", "--no-compile",
            "--no-bf16", "--pool", "400", "--workers", "1", "--tokens-per-step", "1500", "--val-per-family", "2",
            "--val-every", "1000", "--log-every", "1", "--max-steps", "2", "--warmup", "1", "--lr", "1e-4",
            "--ckpt-every", "1000"]
    trainer = train.Trainer(train.parse_args(args))
    assert trainer.tokenizer.get_vocab_size() == json.loads((BUNDLED / "config.json").read_text())["vocab_size"]
    trainer.train()
    first = trainer.log["val"][0]["loss"]
    assert set(first) >= set(data.FAMILIES) and all(math.isfinite(v) for v in first.values())
    assert first["arith"] < first["everyday"]  # the bundled model knows the old forms, not yet the new ones


def test_the_reference_decoders_evaluate_with_the_stop_end_rule_the_records_used():
    """The recorded held-out numbers were measured with the stop end rule; the reference methods now default to
    the official one (decoding past the end), so the evaluator pins stop for them, and only for them."""
    for name, decoder in evaluate.DECODERS.items():
        settings = evaluate.settings_for(decoder, 128, 32)
        assert settings.resolved_end_rule == "stop", name
        assert ("end_rule" in decoder.settings) == (settings.method in ("llada", "fast-dllm")), name
