"""The gate/up and LM-head weights stored transposed (engine/model.py:store_transposed): a layout chosen once at
load, on Hopper GPUs only, that must change no result. On the CPU the transform is applied by hand and the
model must compute what it computed before; the decision itself leaves a CPU model alone."""
from __future__ import annotations

import pytest
import torch

from flash_dllm.engine import Engine, GenerationSettings
from flash_dllm.engine.model import forward_full, store_transposed, transposed_storage_pays
from flash_dllm.engine.weights import load_model
from test_families_forward import tiny_llada_moe  # noqa: F401 - a fixture: a family with expert layers


def dense_layers(model):
    return [layer for layer in model.layers if layer.moe is None and layer.w_gate_up is not None]


@pytest.mark.parametrize("family", ["llada", "dream", "llada-moe"])
def test_transposed_storage_computes_the_same(family, tiny_llada, tiny_dream, tiny_llada_moe):
    folder = {"llada": tiny_llada, "dream": tiny_dream, "llada-moe": tiny_llada_moe}[family]
    model = load_model(folder, "cpu", torch.float32)
    assert not transposed_storage_pays(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    before = forward_full(model, ids)
    shapes = [layer.w_gate_up.shape for layer in dense_layers(model)]
    tied = model.lm_head is model.embed
    store_transposed(model)
    layers = dense_layers(model)
    assert [layer.w_gate_up.shape for layer in layers] == shapes
    assert all(layer.w_gate_up.stride() == (1, layer.w_gate_up.shape[0]) for layer in layers)
    assert all(layer.moe.w_gate_up.is_contiguous() for layer in model.layers if layer.moe is not None)
    assert (model.lm_head is model.embed) == tied
    if not tied:
        assert model.lm_head.stride() == (1, model.config.vocab_size)
    assert torch.allclose(forward_full(model, ids), before, atol=1e-5, rtol=1e-5)


def test_an_engine_decodes_the_same_tokens_from_either_layout(tiny_llada):
    settings = GenerationSettings(method="flash-cache", gen_length=32, block_length=32)
    prompts = ["What is 7 + 5?", "Name a colour."]
    plain = Engine.load(str(tiny_llada), device="cpu")
    expected = [r.token_ids for r in plain.generate(prompts, settings)]
    store_transposed(plain.model)
    plain.release_decode_memory()
    assert [r.token_ids for r in plain.generate(prompts, settings)] == expected


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)),
                    reason="the layout is chosen on Hopper GPUs only")
def test_a_hopper_engine_stores_them_transposed_with_the_same_logits(tiny_llada):
    engine = Engine.load(str(tiny_llada), device="cuda")
    assert all(layer.w_gate_up.stride()[0] == 1 for layer in dense_layers(engine.model))
    reference = load_model(tiny_llada, "cuda", engine.model.dtype)
    ids = torch.randint(0, reference.config.vocab_size, (1, 40), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        assert torch.equal(forward_full(engine.model, ids), forward_full(reference, ids))
