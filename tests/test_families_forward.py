"""LLaDA-MoE and LLaDA2 forwards (forward_full and forward_cached on the torch kernels) against an independent
float64 reference written here from the published architectures, reading config.json and the safetensors by
their Hugging Face names (no engine code): per-head QK-norm, partial RoPE, the two routers (softmax without
renormalisation; sigmoid + expert bias + group-limited top-k + renormalisation + scaling), shared expert,
dense first layer, GQA, and LLaDA2's block-causal attention over a sequence longer than one block."""
import math

import pytest
import torch

from flash_dllm.engine.model import CachedStep, bind_kernels, forward_cached, forward_full, forward_hidden, lm_logits
from flash_dllm.engine.moe_model import route
from flash_dllm.kernels.moe_experts import moe_experts_reference
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from flash_dllm.engine.weights import load_model
from flash_dllm.kernels.scheduled_attention import build_plan
from reference_testing import read_checkpoint, rms

LLADA2_BLOCK = 32  # the trained block of LLaDA2 (sglang's DLLM_PARAMS), not a config.json key


@pytest.fixture(scope="module")
def tiny_llada_moe(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada-moe", TinySpec(family="llada-moe"))


@pytest.fixture(scope="module")
def tiny_llada2(tmp_path_factory):
    """GQA (4 query heads on 2 KV heads), layer 0 dense, 8 experts in 4 groups, one shared expert."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada2", TinySpec(family="llada2", n_kv_heads=2),
                            shards=2)


def rope_first(x, theta, rotary):
    """x [L, Dh]: rotate-half RoPE on the first `rotary` dims at positions 0..L-1, frequencies over `rotary`."""
    length = x.shape[0]
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rot, rest = x[:, :rotary], x[:, rotary:]
    turned = torch.cat([-rot[:, rotary // 2:], rot[:, : rotary // 2]], -1)
    return torch.cat([rot * cos + turned * sin, rest], -1)


def swiglu(x, gate, up, down):
    g = x @ gate.T
    return (g * torch.sigmoid(g) * (x @ up.T)) @ down.T


def llada_moe_choice(scores, bias, raw):
    """OLMoE / LLaDA-MoE: top-k of the softmax (+ bias), the chosen values are the weights, not renormalised."""
    biased = scores + bias if bias is not None else scores
    order = sorted(range(len(biased)), key=lambda e: -float(biased[e]))[: raw["num_experts_per_tok"]]
    return [(e, float(biased[e])) for e in order]


def llada2_choice(scores, bias, raw):
    """Ling 2.0 / LLaDA2: choose on sigmoid + bias among the best groups (a group = sum of its 2 best), weigh
    by the raw sigmoid renormalised over the chosen, times routed_scaling_factor."""
    biased = [float(s + b) for s, b in zip(scores, bias)]
    n_group, size = raw["n_group"], len(biased) // raw["n_group"]
    group_score = [sum(sorted(biased[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
    groups = sorted(range(n_group), key=lambda g: -group_score[g])[: raw["topk_group"]]
    allowed = [e for e in range(len(biased)) if e // size in groups]
    chosen = sorted(allowed, key=lambda e: -biased[e])[: raw["num_experts_per_tok"]]
    total = sum(float(scores[e]) for e in chosen)
    return [(e, float(scores[e]) / (total + 1e-20) * raw["routed_scaling_factor"]) for e in chosen]


def reference_logits(folder, ids: list[int]) -> torch.Tensor:
    raw, w = read_checkpoint(folder)
    llada2 = raw["model_type"] == "llada2_moe"
    d, hq, hkv = raw["hidden_size"], raw["num_attention_heads"], raw["num_key_value_heads"]
    dh = raw.get("head_dim") or d // hq
    rotary = int(dh * (raw.get("partial_rotary_factor") or 1.0))
    eps, theta, length = raw["rms_norm_eps"], raw["rope_theta"], len(ids)
    embed = w["model.word_embeddings.weight" if llada2 else "model.embed_tokens.weight"]
    h = embed[torch.tensor(ids)]
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"], eps)
        if llada2:
            a = p + "attention."
            heads = (x @ w[a + "query_key_value.weight"].T).view(length, hq + 2 * hkv, dh)
            q, k, v = heads[:, :hq], heads[:, hq:hq + hkv], heads[:, hq + hkv:]
            q_norm, k_norm, out = w[a + "query_layernorm.weight"], w[a + "key_layernorm.weight"], w[a + "dense.weight"]
        else:
            a = p + "self_attn."
            q = (x @ w[a + "q_proj.weight"].T).view(length, hq, dh)
            k = (x @ w[a + "k_proj.weight"].T).view(length, hkv, dh)
            v = (x @ w[a + "v_proj.weight"].T).view(length, hkv, dh)
            q_norm, k_norm, out = w[a + "q_norm.weight"], w[a + "k_norm.weight"], w[a + "o_proj.weight"]
        heads_out = []
        for head in range(hq):
            kv = head // (hq // hkv)
            qh = rope_first(rms(q[:, head], q_norm, eps), theta, rotary)
            kh = rope_first(rms(k[:, kv], k_norm, eps), theta, rotary)
            scores = qh @ kh.T / math.sqrt(dh)
            if llada2:  # a key is seen when its block is not after the query's
                blocks = torch.arange(length) // LLADA2_BLOCK
                scores = scores.masked_fill(blocks[None, :] > blocks[:, None], float("-inf"))
            heads_out.append(torch.softmax(scores, -1) @ v[:, kv])
        h = h + torch.cat(heads_out, -1) @ out.T
        x = rms(h, w[p + "post_attention_layernorm.weight"], eps)
        m = p + "mlp."
        if llada2 and i < raw["first_k_dense_replace"]:
            h = h + swiglu(x, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
            continue
        logits = x @ w[m + "gate.weight"].T
        mixed = torch.zeros_like(x)
        for t in range(length):
            if llada2:
                choice = llada2_choice(torch.sigmoid(logits[t]), w[m + "gate.expert_bias"], raw)
            else:
                choice = llada_moe_choice(torch.softmax(logits[t], -1), None, raw)
            for e, weight in choice:
                ex = f"{m}experts.{e}."
                mixed[t] += weight * swiglu(x[t:t + 1], w[ex + "gate_proj.weight"], w[ex + "up_proj.weight"],
                                            w[ex + "down_proj.weight"])[0]
        if llada2 and raw["num_shared_experts"]:
            s = m + "shared_experts."
            mixed = mixed + swiglu(x, w[s + "gate_proj.weight"], w[s + "up_proj.weight"], w[s + "down_proj.weight"])
        h = h + mixed
    return rms(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


@pytest.fixture(params=["llada-moe", "llada2"])
def folder(request, tiny_llada_moe, tiny_llada2):
    return tiny_llada_moe if request.param == "llada-moe" else tiny_llada2


def prompt(model, length: int, seed: int) -> list[int]:
    ids = torch.randint(0, model.config.vocab_size, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    ids[5:11] = [model.config.mask_id] * 6
    return ids


def test_families_are_what_their_configs_say(tiny_llada_moe, tiny_llada2):
    moe, two = load_model(tiny_llada_moe).config, load_model(tiny_llada2).config
    assert (moe.family, moe.block_size, moe.qk_norm, moe.rope_dim, moe.moe.score_function) == \
        ("llada-moe", None, True, moe.head_dim, "softmax")
    assert (two.family, two.block_size, two.rope_dim, two.n_kv_heads, two.moe.dense_layers) == \
        ("llada2", LLADA2_BLOCK, two.head_dim // 2, 2, (0,))


def test_forward_full_matches_independent_reference(folder):
    model = load_model(folder, "cpu", torch.float32)
    ids = prompt(model, 45, 1)  # 45 > 32: LLaDA2's second block sees the first, not the other way round
    expected = reference_logits(folder, ids)
    got = forward_full(model, torch.tensor([ids]))[0].double()
    assert torch.allclose(got, expected, atol=2e-4, rtol=1e-4), (got - expected).abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_llada2_first_block_ignores_later_blocks(tiny_llada2):
    model = load_model(tiny_llada2, "cpu", torch.float32)
    ids = prompt(model, 45, 2)
    changed = ids[:40] + [(t + 7) % model.config.vocab_size for t in ids[40:]]
    a, b = forward_full(model, torch.tensor([ids, changed]))
    assert torch.equal(a[:LLADA2_BLOCK], b[:LLADA2_BLOCK]) and not torch.allclose(a[LLADA2_BLOCK:], b[LLADA2_BLOCK:])


def cached_logits(model, ids: list[int], chunks: list[tuple[int, int]]) -> torch.Tensor:
    """forward_cached on the torch kernels, one step per chunk [start, stop): the chunk's tokens are the
    queries, its K/V go into cache rows start..stop, and it attends to cache rows 0..stop."""
    cfg = model.config
    ops = bind_kernels(cfg, "torch")
    rows = len(ids)
    k_cache = torch.zeros(cfg.n_layers, rows, cfg.n_kv_heads * cfg.head_dim)
    v_cache = torch.zeros_like(k_cache)
    out = []
    for start, stop in chunks:
        span = torch.arange(start, stop)
        step = CachedStep(token_ids=torch.tensor(ids[start:stop]), positions=span, write_rows=span,
                          plan=build_plan([stop - start], [0], [stop], "cpu", block_m=8),
                          hidden_rows=torch.arange(stop - start))
        out.append(lm_logits(model, forward_cached(model, k_cache, v_cache, step, ops)))
    return torch.cat(out)


def test_forward_cached_matches_forward_full(folder):
    model = load_model(folder, "cpu", torch.float32)
    ids = prompt(model, 45, 3)
    full = forward_full(model, torch.tensor([ids]))[0]
    if model.config.block_size:  # block by block, each block against the cached blocks before it
        chunks = [(0, 32), (32, 45)]
    else:
        chunks = [(0, 45)]
    got = cached_logits(model, ids, chunks)
    assert torch.allclose(got, full, atol=1e-4, rtol=1e-4), (got - full).abs().max()


@pytest.mark.parametrize("tokens, experts", [(7, 5), (2, 11)])  # every expert over all tokens; gathered per token
def test_moe_experts_reference_is_the_contract(tokens, experts):
    gen = torch.Generator().manual_seed(4)
    dim, hidden, top_k = 12, 6, 3
    x = torch.randn(tokens, dim, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    w_gate_up = torch.randn(experts, 2 * hidden, dim, generator=gen)
    w_down = torch.randn(experts, dim, hidden, generator=gen)
    expected = torch.zeros(tokens, dim, dtype=torch.float64)
    for t in range(tokens):
        for k in range(top_k):
            e = int(ids[t, k])
            g, u = w_gate_up[e, :hidden].double() @ x[t].double(), w_gate_up[e, hidden:].double() @ x[t].double()
            expected[t] += float(weights[t, k]) * (w_down[e].double() @ (g * torch.sigmoid(g) * u))
    got = moe_experts_reference(x, ids, weights, w_gate_up, w_down)
    assert got.dtype == x.dtype and torch.allclose(got.double(), expected, atol=1e-4, rtol=1e-4)


def test_group_limited_routing_never_picks_a_losing_group(tiny_llada2):
    model = load_model(tiny_llada2, "cpu", torch.float32)
    layer, cfg = model.layers[1], model.config.moe
    x = torch.randn(64, model.config.d_model, generator=torch.Generator().manual_seed(5))
    ids, weights = route(x, layer.moe, cfg)
    scores = torch.sigmoid(x @ layer.moe.router.T) + layer.moe.expert_bias
    size = cfg.n_experts // cfg.n_group
    group_score = scores.view(64, cfg.n_group, size).topk(2, -1).values.sum(-1)
    winners = group_score.topk(cfg.topk_group, -1).indices
    assert all(set((ids[t] // size).tolist()) <= set(winners[t].tolist()) for t in range(64))
    assert torch.allclose(weights.sum(-1), torch.full((64,), cfg.routed_scaling))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="full-size geometry on a GPU")
@pytest.mark.parametrize("geometry", ["llada-moe", "llada2-mini"])
def test_full_geometry_cached_matches_hidden_on_gpu(geometry):
    from flash_dllm.engine.geometry import GEOMETRY, random_model

    model = random_model(GEOMETRY[geometry], "cuda")
    ids = torch.randint(0, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(6)).tolist()
    with torch.no_grad():
        full = forward_hidden(model, torch.tensor([ids], device="cuda"))[0].float()
        cfg, ops = model.config, bind_kernels(model.config, "triton")
        k_cache = torch.zeros(cfg.n_layers, 64, cfg.n_kv_heads * cfg.head_dim, device="cuda", dtype=model.dtype)
        v_cache = torch.zeros_like(k_cache)
        got = []
        for start, stop in ([(0, 32), (32, 64)] if cfg.block_size else [(0, 64)]):
            span = torch.arange(start, stop, device="cuda")
            step = CachedStep(torch.tensor(ids[start:stop], device="cuda"), span, span,
                              build_plan([stop - start], [0], [stop], "cuda"),
                              torch.arange(stop - start, device="cuda"))
            got.append(forward_cached(model, k_cache, v_cache, step, ops).float())
    got = torch.cat(got)
    cosine = torch.nn.functional.cosine_similarity(got, full, dim=-1)
    # bf16 rounding differs between the paths, so a near-tie in a router may pick another expert for a token
    assert cosine.mean() > 0.99 and cosine.min() > 0.9, (cosine.mean(), cosine.min())


@pytest.mark.parametrize("n_layers, scored_layers", [(4, [2, 3]), (2, [0, 1])])
def test_attention_mass_sums_the_layers_after_the_first_two(tmp_path, n_layers, scored_layers):
    """Flash-Cache's tracked-token score is the window's logit mass of the layers after the first two, as in
    Flash-dLLM's code (a model of two layers or fewer: every layer)."""
    model = load_model(write_tiny_model(tmp_path / "m", TinySpec("llada", n_layers=n_layers)), "cpu", torch.float32)
    cfg = model.config
    ops = bind_kernels(cfg, "torch")
    reference, per_layer, asked = ops.attention, [], []

    def attention(q, k, v, plan, score_out=None):  # every layer's own mass, and whether the engine asked for it
        mass = torch.zeros(k.shape[0])
        reference(q, k, v, plan, mass)
        per_layer.append(mass)
        asked.append(score_out is not None)
        return reference(q, k, v, plan, score_out)

    ops.attention = attention
    ids, rows = prompt(model, 20, 5), 20
    k_cache = torch.zeros(cfg.n_layers, rows, cfg.n_kv_heads * cfg.head_dim)
    v_cache = torch.zeros_like(k_cache)
    span = torch.arange(rows)
    window = torch.zeros(rows, dtype=torch.bool)
    window[12:16] = True
    step = CachedStep(token_ids=torch.tensor(ids), positions=span, write_rows=span,
                      plan=build_plan([rows], [0], [rows], "cpu", block_m=8, score_query=window),
                      hidden_rows=torch.arange(rows))
    score = torch.zeros(rows)
    forward_cached(model, k_cache, v_cache, step, ops, score)
    assert [i for i, a in enumerate(asked) if a] == scored_layers
    assert torch.allclose(score, sum(per_layer[i] for i in scored_layers), rtol=1e-5, atol=1e-5)
    assert score.abs().sum() > 0
