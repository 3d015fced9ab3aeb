"""Engines with random weights at the full geometry of the published models, for benchmarks.

No trained weights are needed to time a step: random bf16 weights stream exactly the bytes real ones do. Such
a model never reaches a confidence threshold, so every method commits one token per iteration and
Flash-Verify accepts nothing: the timings are worst-case iteration times. Prompts are token ids (there is no
tokenizer to speak of: pieces are the ids as text).
"""
from __future__ import annotations

from pathlib import Path

import torch

from flash_dllm.engine.config import ModelConfig
from flash_dllm.engine.model import DiffusionLM, LayerWeights, rope_tables

GEOMETRY = {
    "llada-8b": ModelConfig("llada", 4096, 32, 32, 32, 128, 12288, 126464, 5e5, 1e-5, 4096, False, False, 126336,
                            126081),
    "dream-7b": ModelConfig("dream", 3584, 28, 28, 4, 128, 18944, 152064, 1e6, 1e-6, 4096, False, True, 151666,
                            151643),
}


def random_model(cfg: ModelConfig, device, dtype=torch.bfloat16, seed: int = 0) -> DiffusionLM:
    """Weights drawn from N(0, 0.02), norms at one, built on the device (no host copy of 16 GB)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def w(*shape):
        return torch.randn(shape, device=device, dtype=dtype, generator=generator) * 0.02

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    layers = [LayerWeights(attn_norm=ones(cfg.d_model), w_qkv=w(qkv, cfg.d_model),
                           b_qkv=w(qkv) if cfg.qkv_bias else None, w_o=w(cfg.d_model, cfg.n_heads * cfg.head_dim),
                           ffn_norm=ones(cfg.d_model), w_gate_up=w(2 * cfg.mlp_hidden, cfg.d_model),
                           w_down=w(cfg.d_model, cfg.mlp_hidden))
              for _ in range(cfg.n_layers)]
    cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, cfg.max_seq_len, device)
    return DiffusionLM(cfg, w(cfg.vocab_size, cfg.d_model), layers, ones(cfg.d_model), w(cfg.vocab_size, cfg.d_model),
                       cos, sin)


def weight_bytes(model: DiffusionLM) -> int:
    """Bytes of every weight tensor (the embedding included, as the floors quoted in the README count it)."""
    tensors = [model.embed, model.final_norm] + ([] if model.lm_head is model.embed else [model.lm_head])
    tensors += [t for layer in model.layers for t in vars(layer).values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


class IdTokenizer:
    """The tokenizer interface of an engine whose prompts are token ids: pieces and texts are the ids."""

    def __init__(self, cfg: ModelConfig):
        self.end_ids = frozenset({cfg.eos_id})

    def encode(self, conversation, use_chat_template: bool = True) -> list[int]:
        raise ValueError("this engine has random weights and no tokenizer: give prompts as token ids")

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def piece(self, token_id: int) -> str:
        return str(token_id)


def random_engine(geometry: str, device, kernels: str | None = None, graphs: bool = True):
    """An Engine over random weights at a named geometry (see GEOMETRY)."""
    from flash_dllm.engine.engine import Engine, pick_backend, pick_device

    dev = pick_device(device)
    cfg = GEOMETRY[geometry]
    model = random_model(cfg, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32)
    return Engine(model, IdTokenizer(cfg), geometry, Path(geometry), pick_backend(kernels, dev), graphs=graphs)
