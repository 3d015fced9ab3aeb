"""Engines with random weights at the full geometry of the published models, for benchmarks.

No trained weights are needed to time a step: random bf16 weights stream exactly the bytes real ones do. Such
a model never reaches a confidence threshold, so every method commits one token per iteration and
Flash-Verify accepts nothing: the timings are worst-case iteration times. Prompts are token ids (there is no
tokenizer to speak of: pieces are the ids as text).
"""
from __future__ import annotations

from pathlib import Path

import torch

from flash_dllm.engine.config import ModelConfig, MoEConfig
from flash_dllm.engine.model import DiffusionLM, LayerWeights, rope_tables
from flash_dllm.engine.moe_model import MoEWeights

GEOMETRY = {
    "llada-8b": ModelConfig("llada", 4096, 32, 32, 32, 128, 12288, 126464, 5e5, 1e-5, 4096, False, False, 126336,
                            126081),
    "dream-7b": ModelConfig("dream", 3584, 28, 28, 4, 128, 18944, 152064, 1e6, 1e-6, 4096, False, True, 151666,
                            151643),
    # inclusionAI/LLaDA-MoE-7B-A1B: 64 experts of 1024, 8 per token, softmax router, QK-norm, no shared expert
    "llada-moe": ModelConfig(
        "llada-moe", d_model=2048, n_layers=16, n_heads=16, n_kv_heads=16, head_dim=128, mlp_hidden=8192,
        vocab_size=157184, rope_theta=50000.0, norm_eps=1e-5, max_seq_len=8192, tie_embeddings=False,
        qkv_bias=False, mask_id=156895, eos_id=156892, qk_norm=True,
        moe=MoEConfig(n_experts=64, top_k=8, expert_hidden=1024, bias_in_weights=True)),
    # inclusionAI/LLaDA2.0-mini: 256 experts of 512, 8 per token in 4 of 8 groups, sigmoid router with bias,
    # one shared expert, layer 0 dense, QK-norm, RoPE on half of each head, blocks of 32
    "llada2-mini": ModelConfig(
        "llada2", d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, head_dim=128, mlp_hidden=5120,
        vocab_size=157184, rope_theta=600000.0, norm_eps=1e-6, max_seq_len=32768, tie_embeddings=False,
        qkv_bias=False, mask_id=156895, eos_id=156892, block_size=32, qk_norm=True, rotary_dim=64,
        moe=MoEConfig(n_experts=256, top_k=8, expert_hidden=512, n_shared_experts=1, shared_hidden=512,
                      score_function="sigmoid", normalize_top_k=True, routed_scaling=2.5, n_group=8, topk_group=4,
                      expert_bias=True, dense_layers=(0,))),
}


def random_model(cfg: ModelConfig, device, dtype=torch.bfloat16, seed: int = 0) -> DiffusionLM:
    """Weights drawn from N(0, 0.02), norms at one, built on the device (no host copy of 16 GB)."""
    generator = torch.Generator(device=device).manual_seed(seed)

    def w(*shape):
        return torch.randn(shape, device=device, dtype=dtype, generator=generator) * 0.02

    def ones(n):
        return torch.ones(n, device=device, dtype=dtype)

    def ffn(index: int) -> dict:
        moe, d = cfg.moe, cfg.d_model
        if moe is None or not moe.is_moe_layer(index):
            return dict(w_gate_up=w(2 * cfg.mlp_hidden, d), w_down=w(d, cfg.mlp_hidden))
        shared = moe.n_shared_experts * moe.shared_hidden
        bias = torch.zeros(moe.n_experts, device=device, dtype=torch.float32) if moe.expert_bias else None
        return dict(w_gate_up=w(2 * shared, d) if shared else None, w_down=w(d, shared) if shared else None,
                    moe=MoEWeights(router=w(moe.n_experts, d), expert_bias=bias,
                                   w_gate_up=w(moe.n_experts, 2 * moe.expert_hidden, d),
                                   w_down=w(moe.n_experts, d, moe.expert_hidden)))

    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    head_norms = dict(q_norm=ones(cfg.head_dim), k_norm=ones(cfg.head_dim)) if cfg.qk_norm else {}
    layers = [LayerWeights(attn_norm=ones(cfg.d_model), w_qkv=w(qkv, cfg.d_model),
                           b_qkv=w(qkv) if cfg.qkv_bias else None, w_o=w(cfg.d_model, cfg.n_heads * cfg.head_dim),
                           ffn_norm=ones(cfg.d_model), **ffn(index), **head_norms)
              for index in range(cfg.n_layers)]
    cos, sin = rope_tables(cfg.rope_dim, cfg.rope_theta, cfg.max_seq_len, device)
    return DiffusionLM(cfg, w(cfg.vocab_size, cfg.d_model), layers, ones(cfg.d_model), w(cfg.vocab_size, cfg.d_model),
                       cos, sin)


def weight_bytes(model: DiffusionLM) -> int:
    """Bytes of every weight tensor (the embedding included, as the floors quoted in the README count it)."""
    tensors = [model.embed, model.final_norm] + ([] if model.lm_head is model.embed else [model.lm_head])
    for layer in model.layers:
        tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        if layer.moe is not None:
            tensors += [t for t in vars(layer.moe).values() if isinstance(t, torch.Tensor)]
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
