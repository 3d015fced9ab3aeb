"""forward_full of each family against an independent, deliberately plain implementation.

The reference below reads config.json and the safetensors by their Hugging Face names itself (no engine code),
and computes attention one head at a time in float64, with RoPE, RMSNorm and SwiGLU written out. It checks the
weight mapping (q/k/v and gate/up order, GQA head sharing, biases) as much as the math.
"""
import json
import math

import pytest
import torch

from flash_dllm.engine.model import forward_full
from flash_dllm.engine.weights import load_model
from reference_testing import read_checkpoint, rms


def rope(x, theta):
    """x [L, Dh]: rotate-half RoPE at positions 0..L-1 (the LLaMA / Qwen2 / LLaDA convention)."""
    length, dim = x.shape
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-x[:, dim // 2:], x[:, : dim // 2]], -1)
    return x * cos + rotated * sin


def reference_logits(folder, ids: list[int]) -> torch.Tensor:
    """Logits [L, V] where row i predicts token i (Dream's shift applied)."""
    raw, w = read_checkpoint(folder)
    if raw["model_type"] == "llada":
        d, hq = raw["d_model"], raw["n_heads"]
        hkv, layers, eps, theta = raw["n_kv_heads"], raw["n_layers"], raw["rms_norm_eps"], raw["rope_theta"]
        t = "model.transformer."
        embed, final, head = w[t + "wte.weight"], w[t + "ln_f.weight"], w[t + "ff_out.weight"]

        def block(i):
            p = f"model.transformer.blocks.{i}."
            return dict(attn_norm=w[p + "attn_norm.weight"], q=w[p + "q_proj.weight"], k=w[p + "k_proj.weight"],
                        v=w[p + "v_proj.weight"], o=w[p + "attn_out.weight"], ffn_norm=w[p + "ff_norm.weight"],
                        gate=w[p + "ff_proj.weight"], up=w[p + "up_proj.weight"], down=w[p + "ff_out.weight"])
    else:
        d, hq = raw["hidden_size"], raw["num_attention_heads"]
        hkv, layers = raw["num_key_value_heads"], raw["num_hidden_layers"]
        eps, theta = raw["rms_norm_eps"], raw["rope_theta"]
        embed, final, head = w["model.embed_tokens.weight"], w["model.norm.weight"], w["lm_head.weight"]

        def block(i):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            return dict(attn_norm=w[p + "input_layernorm.weight"], q=w[a + "q_proj.weight"], k=w[a + "k_proj.weight"],
                        v=w[a + "v_proj.weight"], qb=w[a + "q_proj.bias"], kb=w[a + "k_proj.bias"],
                        vb=w[a + "v_proj.bias"], o=w[a + "o_proj.weight"],
                        ffn_norm=w[p + "post_attention_layernorm.weight"], gate=w[p + "mlp.gate_proj.weight"],
                        up=w[p + "mlp.up_proj.weight"], down=w[p + "mlp.down_proj.weight"])
    dh = d // hq
    h = embed[torch.tensor(ids)]
    for i in range(layers):
        b = block(i)
        x = rms(h, b["attn_norm"], eps)
        q, k, v = x @ b["q"].T, x @ b["k"].T, x @ b["v"].T
        if "qb" in b:
            q, k, v = q + b["qb"], k + b["kb"], v + b["vb"]
        heads = []
        for head_index in range(hq):
            kv_index = head_index // (hq // hkv)  # GQA: consecutive query heads share one KV head
            qh = rope(q[:, head_index * dh:(head_index + 1) * dh], theta)
            kh = rope(k[:, kv_index * dh:(kv_index + 1) * dh], theta)
            vh = v[:, kv_index * dh:(kv_index + 1) * dh]
            scores = torch.einsum("id,jd->ij", qh, kh) / math.sqrt(dh)  # bidirectional: no causal mask
            heads.append(torch.softmax(scores, dim=-1) @ vh)
        h = h + torch.cat(heads, -1) @ b["o"].T
        x = rms(h, b["ffn_norm"], eps)
        gate, up = x @ b["gate"].T, x @ b["up"].T
        h = h + (gate * torch.sigmoid(gate) * up) @ b["down"].T
    logits = rms(h, final, eps) @ head.T
    if raw["model_type"] != "llada":  # Dream: position i-1 predicts token i
        logits = torch.cat([logits[:1], logits[:-1]])
    return logits


@pytest.fixture(params=["llada", "dream"])
def folder(request, tiny_llada, tiny_dream):
    return tiny_llada if request.param == "llada" else tiny_dream


def test_dream_fixture_uses_grouped_query_attention(tiny_dream):
    raw = json.loads((tiny_dream / "config.json").read_text())
    assert raw["num_key_value_heads"] < raw["num_attention_heads"]


def test_forward_full_matches_independent_reference(folder):
    model = load_model(folder, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (13,), generator=gen).tolist()
    ids[5:9] = [model.config.mask_id] * 4
    expected = reference_logits(folder, ids)
    got = forward_full(model, torch.tensor([ids]))[0].double()
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=2e-4, rtol=1e-4), (got - expected).abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_left_padding_changes_nothing(folder):
    """A batch row with left padding (masked out of attention, positions restarting at 0) gives the same
    logits as that sequence alone."""
    model = load_model(folder, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(2)
    long = torch.randint(0, model.config.vocab_size, (11,), generator=gen).tolist()
    short = torch.randint(0, model.config.vocab_size, (6,), generator=gen).tolist()
    pad = 11 - 6
    ids = torch.tensor([long, [model.config.eos_id] * pad + short])
    keep = torch.tensor([[True] * 11, [False] * pad + [True] * 6])
    got = forward_full(model, ids, keep).double()
    assert torch.allclose(got[0], reference_logits(folder, long), atol=2e-4, rtol=1e-4)
    short_expected = reference_logits(folder, short)
    # Dream's first real position copies its own row (nothing precedes it); compare from the second on.
    start = 1 if model.config.shift_logits else 0
    assert torch.allclose(got[1, pad + start:], short_expected[start:], atol=2e-4, rtol=1e-4)


def test_block_diffusion_mask_is_causal_across_blocks_and_bidirectional_inside():
    import torch

    from flash_dllm.engine.config import ModelConfig
    from flash_dllm.engine.model import attention_mask

    cfg = ModelConfig("llada", 8, 1, 1, 1, 8, 8, 10, 1e4, 1e-5, 64, False, False, 1, 2, block_size=2)
    positions = torch.arange(5)[None]
    mask = attention_mask(cfg, None, positions)[0, 0]
    expected = torch.tensor([[j // 2 <= i // 2 for j in range(5)] for i in range(5)])
    assert torch.equal(mask, expected)
    padded = attention_mask(cfg, torch.tensor([[False, True, True, True, True]]), torch.tensor([[0, 0, 1, 2, 3]]))
    assert not padded[0, 0, :, 0].any() and padded[0, 0, 1:, 1].all() and not padded[0, 0, 1, 3]
    assert attention_mask(replace_block(cfg), None, positions) is None


def replace_block(cfg):
    from dataclasses import replace

    return replace(cfg, block_size=None)
