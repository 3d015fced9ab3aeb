"""The transformer of every family in plain PyTorch, as functions over a dataclass of tensors.

LLaDA: multi-head attention, no biases, predicts in place. Dream: grouped-query attention with q/k/v bias,
logits shifted by one. All: pre-norm RMSNorm, rotate-half RoPE, SwiGLU MLP. LLaDA-MoE and LLaDA2 add per-head
QK-norm, partial RoPE (LLaDA2) and expert MLPs (engine/moe_model.py); LLaDA2's attention is block-causal.

Two forward paths share every weight and every op but attention:
* ``forward_hidden`` runs whole (left-padded) sequences with SDPA: the reference decoders and training use it;
* ``forward_cached`` runs a packed, ragged set of query tokens of many sequences against the per-slot KV
  cache through the kernel dispatchers (fused QKV+RoPE+cache write, scheduled attention).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flash_dllm.engine.config import ModelConfig
from flash_dllm.engine.moe_model import MoEWeights, attention_inputs, cached_attention_inputs, moe_mlp
from flash_dllm.kernels.add_rms_norm import AddRMSNorm
from flash_dllm.kernels.fused_qkv_rope_cache import FusedQKVRopeCache
from flash_dllm.kernels.moe_experts import MoEExperts
from flash_dllm.kernels.gate_up_silu import GateUpSilu
from flash_dllm.kernels.split_k_linear import SkinnyLinear
from flash_dllm.kernels.scheduled_attention import AttentionPlan, ScheduledAttention


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [D]
    w_qkv: torch.Tensor  # [(Hq + 2 Hkv) * Dh, D], q rows then k rows then v rows
    b_qkv: torch.Tensor | None  # [(Hq + 2 Hkv) * Dh] (Dream) or None (LLaDA)
    w_o: torch.Tensor  # [D, Hq * Dh]
    ffn_norm: torch.Tensor  # [D]
    # The dense SwiGLU; in an expert layer, the shared expert (None when the family has none)
    w_gate_up: torch.Tensor | None  # [2F, D]: gate rows (silu) then up rows
    w_down: torch.Tensor | None  # [D, F]
    q_norm: torch.Tensor | None = None  # [Dh] per-head QK-norm (LLaDA-MoE, LLaDA2)
    k_norm: torch.Tensor | None = None  # [Dh]
    moe: MoEWeights | None = None  # router and stacked routed experts of an expert layer


@dataclass
class DiffusionLM:
    config: ModelConfig
    embed: torch.Tensor  # [V, D]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [D]
    lm_head: torch.Tensor  # [V, D] (the embedding itself when tied)
    rope_cos: torch.Tensor  # [P, R/2] fp32, R = config.rope_dim (the rotated dims of a head)
    rope_sin: torch.Tensor  # [P, R/2] fp32

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype


def rope_tables(head_dim: int, theta: float, n_positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of rotate-half RoPE in fp32 (computed in fp64 so large thetas keep their precision)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def transposed_storage_pays(model: "DiffusionLM") -> bool:
    """Whether the gate/up and LM-head weights should be stored [K, N] (see store_transposed): on Hopper GPUs
    (compute capability 9.0 and later), where cuBLAS streams them faster from that layout at a decode step's
    row counts. Elsewhere (the CPU, Ampere cards such as the RTX 3090) it was not measured, so nothing changes."""
    device = model.device
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def store_transposed(model: "DiffusionLM") -> None:
    """Keep each dense layer's w_gate_up and an untied lm_head as [N, K] tensors whose storage is [K, N]
    (``w.t().contiguous().t()``). F.linear then hands cuBLAS an "NN" problem instead of "TN"; at 16-128 rows
    it picks kernels that read those two weights faster (benchmarks/README.md, 2026-12-06), with the same
    results. Every consumer of these weights goes through F.linear, which accepts either layout; a tied
    head stays as it is (the embedding gathers its rows)."""
    for layer in model.layers:
        if layer.moe is None and layer.w_gate_up is not None:
            layer.w_gate_up = layer.w_gate_up.t().contiguous().t()
    if model.lm_head is not model.embed:
        model.lm_head = model.lm_head.t().contiguous().t()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda and not torch.is_grad_enabled():
        # One fused kernel (fp32 accumulation inside) instead of seven elementwise launches per norm: at
        # batch 1 the decode step is launch-bound, and there are 65 norms per LLaDA forward.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def mlp(x: torch.Tensor, layer: LayerWeights, cfg: ModelConfig | None = None, experts=None) -> torch.Tensor:
    """The layer's feed-forward: a dense SwiGLU, or the expert MLP (routed experts + shared expert)."""
    if layer.moe is not None:
        return moe_mlp(x, layer.moe, cfg.moe, layer.w_gate_up, layer.w_down, experts)
    gate, up = F.linear(x, layer.w_gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, layer.w_down)


def lm_logits(model: DiffusionLM, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of already-normed hidden states (the caller picks which rows need them)."""
    return F.linear(hidden, model.lm_head)


def default_positions(key_mask: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    """RoPE positions that start at 0 on each row's first real token, so left padding changes nothing."""
    if key_mask is None:
        return torch.arange(length, device=device).expand(batch, length)
    return (key_mask.long().cumsum(-1) - 1).clamp(min=0)


def attention_mask(cfg: ModelConfig, key_mask: torch.Tensor | None, positions: torch.Tensor) -> torch.Tensor | None:
    """SDPA's boolean mask [B, 1, L|1, L] (True = attended): padding keys are never attended, and a block
    diffusion model (``cfg.block_size``) sees a key only when its block (by RoPE position) is not after the
    query's, which is what lets committed blocks be cached exactly."""
    mask = None if key_mask is None else key_mask[:, None, None, :].bool()
    if cfg.block_size:
        block = torch.div(positions, cfg.block_size, rounding_mode="floor")
        causal = (block[:, None, None, :] <= block[:, None, :, None])
        mask = causal if mask is None else causal & mask
    return mask


def forward_hidden(
    model: DiffusionLM,
    input_ids: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Whole-sequence forward. input_ids [B, L]; key_mask [B, L] (False = padding, never attended).

    Returns the final-normed hidden states [B, L, D]. No in-place ops, so it is differentiable (training).
    """
    cfg = model.config
    batch, length = input_ids.shape
    if positions is None:
        positions = default_positions(key_mask, batch, length, input_ids.device)
    flat_cos, flat_sin = model.rope_cos[positions.reshape(-1)], model.rope_sin[positions.reshape(-1)]
    attn_mask = attention_mask(cfg, key_mask, positions)
    h = F.embedding(input_ids, model.embed)
    hq, hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    for layer in model.layers:
        x = rms_norm(h, layer.attn_norm, cfg.norm_eps)
        q, k, v = attention_inputs(cfg, x.reshape(batch * length, -1), layer.w_qkv, layer.b_qkv, layer.q_norm,
                                   layer.k_norm, flat_cos, flat_sin)
        q = q.view(batch, length, hq, dh).transpose(1, 2)
        k = k.view(batch, length, hkv, dh).transpose(1, 2)
        v = v.reshape(batch, length, hkv, dh).transpose(1, 2)
        if hkv != hq:
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        h = h + F.linear(attn.transpose(1, 2).reshape(batch, length, hq * dh), layer.w_o)
        h = h + mlp(rms_norm(h, layer.ffn_norm, cfg.norm_eps), layer, cfg)
    return rms_norm(h, model.final_norm, cfg.norm_eps)


def forward_full(
    model: DiffusionLM,
    input_ids: torch.Tensor,
    key_mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits [B, L, V] of every position, aligned so that logits[:, i] predicts token i for both families."""
    logits = lm_logits(model, forward_hidden(model, input_ids, key_mask, positions))
    if model.config.shift_logits:
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
    return logits


@dataclass
class CachedStep:
    """A packed, ragged forward of query tokens of many sequences against the slot KV cache."""

    token_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N] RoPE position inside its sequence
    write_rows: torch.Tensor  # [N] cache row receiving each token's K/V (scratch rows for verify passes)
    plan: AttentionPlan
    hidden_rows: torch.Tensor  # [M] packed rows whose final hidden state is returned (for logits)


@dataclass
class KernelOps:
    """The kernels a cached forward runs, bound once to a backend ("triton" or the "torch" references)."""

    backend: str
    fused_qkv: FusedQKVRopeCache
    attention: ScheduledAttention
    norm: AddRMSNorm  # the residual add folded into the norm that follows it
    # a dense MLP's gate/up projection and its activation: cuBLAS then the activation kernel, or one fused kernel,
    # whichever was faster for the problem (kernels/gate_up_silu.py)
    gate_up: GateUpSilu
    # (x, topk_ids, topk_weights, w_gate_up, w_down) -> [T, D]: the routed experts of MoE families
    moe_experts: MoEExperts
    # the output and down projections, whose result only the next norm reads: cuBLAS's [M, D] or split-K
    # partials [S, M, D] that the norm sums, whichever was faster for the problem (kernels/split_k_linear.py)
    into_norm: SkinnyLinear


def bind_kernels(config: ModelConfig, backend: str) -> KernelOps:
    return KernelOps(backend, FusedQKVRopeCache(backend, config.n_heads, config.n_kv_heads),
                     ScheduledAttention(backend, config.n_heads, config.n_kv_heads, config.head_dim),
                     AddRMSNorm(backend), GateUpSilu(backend), MoEExperts(backend), SkinnyLinear(backend))


# Flash-dLLM's official code ranks tracked tokens by the window's attention logits summed over the layers after
# the first two (it does not say why); a model of two layers or fewer scores every layer, so it still ranks.
MASS_SKIPS_LAYERS = 2


def forward_cached(
    model: DiffusionLM,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    step: CachedStep,
    ops: KernelOps,
    score_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run the step through every layer. k_cache/v_cache: [layers, R, Hkv*Dh]. Returns normed hidden [M, D].

    Each residual add is folded into the RMSNorm that follows it (the MLP's into the next layer's attention
    norm, the last one into the final norm, on the read-out rows only). score_out (Flash-Cache's attention
    mass, see kernels/scheduled_attention.py) is summed over the layers after the first MASS_SKIPS_LAYERS."""
    cfg = model.config
    eps = cfg.norm_eps
    # QK-norm sits between the projection and RoPE, which the fused kernel does not do (yet): torch path
    unfused_qkv = cfg.qk_norm or cfg.rope_dim != cfg.head_dim
    h = F.embedding(step.token_ids, model.embed)
    update = None
    first_scored = MASS_SKIPS_LAYERS if len(model.layers) > MASS_SKIPS_LAYERS else 0
    for index, layer in enumerate(model.layers):
        h, x = ops.norm(h, update, layer.attn_norm, eps, inplace=True)
        if unfused_qkv:
            q = cached_attention_inputs(cfg, x, layer.w_qkv, layer.b_qkv, layer.q_norm, layer.k_norm,
                                        model.rope_cos, model.rope_sin, step.positions, step.write_rows,
                                        k_cache[index], v_cache[index])
        else:
            q = ops.fused_qkv(x, layer.w_qkv, layer.b_qkv, model.rope_cos, model.rope_sin, step.positions,
                              step.write_rows, k_cache[index], v_cache[index])
        attn = ops.attention(q, k_cache[index], v_cache[index], step.plan,
                             score_out if index >= first_scored else None)
        h, x = ops.norm(h, ops.into_norm(attn, layer.w_o), layer.ffn_norm, eps, inplace=True)
        if layer.moe is not None:
            update = mlp(x, layer, cfg, ops.moe_experts)
        else:
            update = ops.into_norm(ops.gate_up(x, layer.w_gate_up), layer.w_down)
    rows = step.hidden_rows
    return ops.norm(h, update, model.final_norm, eps, rows=rows)[1]  # gathers the rows the head reads
