"""The models shipped under assets/models load and answer held-out items as well as when they were bundled.

Each folder carries ``expected_accuracy.json``: the decoder, the items (the first N of each family's fixed
held-out set) and the exact-match rates measured when the model was bundled. Greedy decoding is deterministic,
so only floating-point differences between machines can move a few items; the margin allows for that.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[1] / "assets" / "models"
MARGIN = 15.0  # percentage points


def _record(name: str) -> dict:
    path = MODELS / name / "expected_accuracy.json"
    if not path.is_file():
        pytest.skip(f"{name} is not bundled in this checkout")
    return json.loads(path.read_text())


def _check(name: str):
    from flash_dllm.engine.training.evaluate import evaluate, load_engine

    record = _record(name)
    engine = load_engine(MODELS / name, "cpu")
    results = evaluate(engine, record["per_family"], [record["decoder"]], list(record["exact"]),
                       record["gen_length"], record["block_length"], log=lambda line: None)
    row = results["decoders"][record["decoder"]]
    for family, expected in record["exact"].items():
        assert row[family]["exact"] >= expected - MARGIN, (name, family, row[family])


def test_tiny_cpu_model_answers_its_held_out_set():
    _check("tiny-cpu")


def test_tiny_chat_folder_fits_the_transfer_and_size_limits():
    folder = MODELS / "tiny-chat"
    if not (folder / "config.json").is_file():
        pytest.skip("tiny-chat is not bundled in this checkout")
    from flash_dllm.engine.config import load_config

    shards = sorted(folder.glob("*.safetensors"))
    assert shards and all(p.stat().st_size < 16_000_000 for p in shards)
    assert sum(p.stat().st_size for p in shards) <= 40_000_000
    assert 15e6 <= load_config(folder).n_params <= 25e6


@pytest.mark.slow
def test_tiny_chat_model_answers_its_held_out_set():
    _check("tiny-chat")
