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
