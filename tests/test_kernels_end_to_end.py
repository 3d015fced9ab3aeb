"""Interpreted Triton kernels give the same greedy tokens as the torch references, end to end."""
from __future__ import annotations

import pytest

from flash_dllm.engine.tokenizer import load_tokenizer
from flash_dllm.engine.engine import Engine
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.engine.weights import load_model
from flash_dllm.kernels import interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1 (set by tests/conftest.py)")


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_triton_and_torch_kernel_paths_agree(tmp_path, family):
    folder = write_tiny_model(tmp_path, TinySpec(family=family, n_kv_heads=2 if family == "dream" else 4))
    model = load_model(folder)
    tokenizer = load_tokenizer(folder, model.config)
    torch_engine = Engine(model, tokenizer, "tiny", folder, "torch")
    triton_engine = Engine(model, tokenizer, "tiny", folder, "triton")
    prompts = ["What is 12*7?", "hi"]
    for method in ("fast-dllm", "flash-cache", "flash-verify"):
        settings = GenerationSettings(method=method, gen_length=16, block_length=8, window=8, lookahead=4,
                                      track=4, threshold=0.6, gamma=0.3)
        expected = torch_engine.generate(prompts, settings)
        got = triton_engine.generate(prompts, settings)
        assert [r.token_ids for r in got] == [r.token_ids for r in expected], method
        assert [r.forward_passes for r in got] == [r.forward_passes for r in expected], method
        assert all(r.kernels == "triton" for r in got)


def test_wide_attention_tiles_give_the_same_tokens(tmp_path, monkeypatch):
    """The tile height chosen per layout (packing.attention_tile_rows) changes the tile table, never the tokens:
    here every forward of two or more sequences takes 8-row tiles, two per sequence's 16 query rows."""
    import flash_dllm.engine.packing as packing

    folder = write_tiny_model(tmp_path, TinySpec(family="llada", n_kv_heads=4))
    model = load_model(folder)
    tokenizer = load_tokenizer(folder, model.config)
    prompts = ["What is 12*7?", "hi", "Name three colours."]
    settings = GenerationSettings(method="flash-cache", gen_length=16, block_length=8, window=8, lookahead=4, track=4,
                                  threshold=0.6)
    expected = Engine(model, tokenizer, "tiny", folder, "torch").generate(prompts, settings)
    monkeypatch.setattr(packing, "WIDE_TILE_ROWS", 8)
    monkeypatch.setattr(packing, "WIDE_TILE_MIN_SLOTS", 2)
    assert packing.attention_tile_rows(packing.Layout.uniform(3, 16)) == 8
    got = Engine(model, tokenizer, "tiny", folder, "triton").generate(prompts, settings)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]


def test_attention_tile_rows_widen_only_for_many_full_budgets():
    from flash_dllm.engine.packing import ATTENTION_BLOCK_M, WIDE_TILE_ROWS, Layout, attention_tile_rows

    assert attention_tile_rows(Layout.uniform(8, 128)) == WIDE_TILE_ROWS
    assert attention_tile_rows(Layout.uniform(32, 160, dynamic=True)) == WIDE_TILE_ROWS
    assert attention_tile_rows(Layout.uniform(1, 128)) == ATTENTION_BLOCK_M  # batch 1 splits keys instead
    assert attention_tile_rows(Layout.uniform(7, 128)) == ATTENTION_BLOCK_M
    assert attention_tile_rows(Layout.uniform(8, 48)) == ATTENTION_BLOCK_M  # a verify pass's rows would pad it
    assert attention_tile_rows(Layout((0, 1, 2, 3, 4, 5, 6, 7), (128,) * 7 + (64,))) == ATTENTION_BLOCK_M


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_split_k_projections_give_the_same_tokens(tmp_path, family):
    """The output and down projections as split-K partials summed by the norm (what the selector may pick on a
    GPU) decode the same tokens as the torch path; the forced config covers every forward's rows in 16-row
    tiles, prompt forwards included."""
    from flash_dllm.kernels._split_k_select import COUNTERS, forced_skinny_linear
    from flash_dllm.kernels._split_k_linear_triton import SplitKConfig

    folder = write_tiny_model(tmp_path, TinySpec(family=family, n_kv_heads=2 if family == "dream" else 4))
    model = load_model(folder)
    tokenizer = load_tokenizer(folder, model.config)
    prompts = ["What is 12*7?", "hi"]
    settings = GenerationSettings(method="flash-cache", gen_length=16, block_length=8, window=8, lookahead=4,
                                  track=4, threshold=0.6)
    expected = Engine(model, tokenizer, "tiny", folder, "torch").generate(prompts, settings)
    resolutions = COUNTERS.resolutions
    with forced_skinny_linear(SplitKConfig(16, 16, 16, 3, 2, 4, True)):
        got = Engine(model, tokenizer, "tiny", folder, "triton").generate(prompts, settings)
    assert COUNTERS.resolutions > resolutions  # the projections did go through the split-K op
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
