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


def _forced_skinny_kernel(which: str):
    """(the forcing context, its family's counters) of one of our skinny-GEMM ops, forced to a small config whose
    16-row tiles cover every forward's rows, prompt forwards included."""
    if which == "split_k":
        from flash_dllm.kernels._split_k_linear_triton import SplitKConfig
        from flash_dllm.kernels._split_k_select import COUNTERS, forced_skinny_linear
        return forced_skinny_linear(SplitKConfig(16, 16, 16, 3, 2, 4, True)), COUNTERS
    from flash_dllm.kernels._gate_up_select import COUNTERS, forced_gate_up_silu
    from flash_dllm.kernels._gate_up_silu_triton import GateUpConfig
    return forced_gate_up_silu(GateUpConfig(16, 16, 16, 2, 4, True)), COUNTERS


@pytest.mark.parametrize("which", ["split_k", "gate_up"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_skinny_gemm_kernels_give_the_same_tokens(tmp_path, family, which):
    """What the selectors may pick on a GPU: the output and down projections as split-K partials summed by the
    norm, or the MLP's gate/up projection fused with its activation; either decodes the torch path's tokens."""
    folder = write_tiny_model(tmp_path, TinySpec(family=family, n_kv_heads=2 if family == "dream" else 4))
    model = load_model(folder)
    tokenizer = load_tokenizer(folder, model.config)
    prompts = ["What is 12*7?", "hi"]
    settings = GenerationSettings(method="flash-cache", gen_length=16, block_length=8, window=8, lookahead=4,
                                  track=4, threshold=0.6)
    expected = Engine(model, tokenizer, "tiny", folder, "torch").generate(prompts, settings)
    forcing, counters = _forced_skinny_kernel(which)
    resolutions = counters.resolutions
    with forcing:
        got = Engine(model, tokenizer, "tiny", folder, "triton").generate(prompts, settings)
    assert counters.resolutions > resolutions  # the forward did go through the op
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
