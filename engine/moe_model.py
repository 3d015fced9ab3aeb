"""The parts of LLaDA-MoE and LLaDA2 that LLaDA and Dream lack: the expert MLP (router, routed experts, shared
expert) and the attention input with per-head QK-norm and partial RoPE. Plain PyTorch; routing has no host syncs
(the decode step runs in a CUDA graph); engine/model.py calls these from both forward paths.

Routing (``route``), re-derived from the published modeling code:
  * LLaDA-MoE (OLMoE style): p = softmax(x W_r^T) over all experts (fp32); the K largest of p (+ expert bias
    when configured, which then also shifts the weights) are chosen; the weights are those values, never
    renormalised.
  * LLaDA2 (Ling 2.0): s = sigmoid(x W_r^T) in fp32; experts are chosen on s + expert_bias, restricted to
    the topk_group best of n_group groups (a group scores the sum of its 2 best biased scores); the weights
    are the *unbiased* s of the chosen experts, divided by their sum, times routed_scaling_factor.
The routed experts then run through ONE call with the contract of kernels/moe_experts.py: the cached path passes
the op bound once (KernelOps.moe_experts: the Triton kernel on CUDA), the whole-sequence path its plain reference;
the shared expert is a dense SwiGLU added to it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flash_dllm.engine.config import ModelConfig, MoEConfig
from flash_dllm.kernels.rope_cache_write import rope_rotate_half
from flash_dllm.kernels.moe_experts import moe_experts_reference


@dataclass
class MoEWeights:
    router: torch.Tensor  # [E, D]
    expert_bias: torch.Tensor | None  # [E] fp32 (added to the scores that choose experts)
    w_gate_up: torch.Tensor  # [E, 2F, D]: per expert, F gate rows (silu) then F up rows
    w_down: torch.Tensor  # [E, D, F]


def route(x: torch.Tensor, moe: MoEWeights, cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] -> (topk_ids [T, K] int64, topk_weights [T, K] fp32)."""
    logits = F.linear(x.float(), moe.router.float())
    scores = logits.softmax(-1) if cfg.score_function == "softmax" else torch.sigmoid(logits)
    choice = scores + moe.expert_bias.float() if moe.expert_bias is not None else scores
    if cfg.n_group > 1:
        tokens = choice.shape[0]
        grouped = choice.view(tokens, cfg.n_group, -1)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)  # [T, G]
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, -1)
    chosen, ids = choice.topk(cfg.top_k, dim=-1)
    weights = chosen if cfg.bias_in_weights else scores.gather(1, ids)
    if cfg.normalize_top_k:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return ids, weights * cfg.routed_scaling


def moe_mlp(x: torch.Tensor, moe: MoEWeights, cfg: MoEConfig, shared_gate_up: torch.Tensor | None,
            shared_down: torch.Tensor | None, experts=None) -> torch.Tensor:
    """The expert MLP of any leading shape [..., D]: routed experts plus the shared expert (when present)."""
    flat = x.reshape(-1, x.shape[-1])
    ids, weights = route(flat, moe, cfg)
    out = (experts or moe_experts_reference)(flat, ids, weights, moe.w_gate_up, moe.w_down)
    if shared_gate_up is not None:
        gate, up = F.linear(flat, shared_gate_up).chunk(2, dim=-1)
        out = out + F.linear(F.silu(gate) * up, shared_down)
    return out.reshape(x.shape)


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim (one head) in fp32, returned in fp32. x [..., H, Dh]; weight [Dh]."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def partial_rope(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first 2 * cos.shape[-1] dims of each head; the rest pass through. h [N, H, Dh]
    (any float dtype); cos/sin [N, R/2] fp32. Returns fp32."""
    rotated = 2 * cos.shape[-1]
    h = h.float()
    if rotated == h.shape[-1]:
        return rope_rotate_half(h, cos, sin)
    return torch.cat([rope_rotate_half(h[..., :rotated], cos, sin), h[..., rotated:]], dim=-1)


def attention_inputs(cfg: ModelConfig, x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None,
                     q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed tokens x [N, D] -> q [N, Hq, Dh], k [N, Hkv, Dh] (QK-normed, then RoPE on the rotary dims),
    v [N, Hkv, Dh], all in x's dtype. cos/sin: [N, rope_dim/2] at each token's position."""
    hq, hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    q, k, v = F.linear(x, w_qkv, b_qkv).split([hq * dh, hkv * dh, hkv * dh], dim=-1)
    q, k = q.reshape(-1, hq, dh), k.reshape(-1, hkv, dh)
    if q_norm is not None:
        q, k = head_rms_norm(q, q_norm, cfg.norm_eps), head_rms_norm(k, k_norm, cfg.norm_eps)
    q, k = partial_rope(q, cos, sin), partial_rope(k, cos, sin)
    return q.to(x.dtype), k.to(x.dtype), v.reshape(-1, hkv, dh)


def cached_attention_inputs(cfg: ModelConfig, x, w_qkv, b_qkv, q_norm, k_norm, rope_cos, rope_sin, positions,
                            write_rows, k_cache, v_cache) -> torch.Tensor:
    """The cached path's QKV for QK-normed / partial-RoPE families: what FusedQKVRopeCache does for LLaDA and
    Dream (project, rotate, write K/V into the cache rows, return q [N, Hq*Dh]) with the head norm between
    projection and rotation, in torch. The fused kernel has no QK-norm yet (see the report to the lead)."""
    pos = positions.long()
    q, k, v = attention_inputs(cfg, x, w_qkv, b_qkv, q_norm, k_norm, rope_cos.index_select(0, pos),
                               rope_sin.index_select(0, pos))
    rows = write_rows.long()
    k_cache.index_copy_(0, rows, k.reshape(k.shape[0], -1).to(k_cache.dtype))
    v_cache.index_copy_(0, rows, v.reshape(v.shape[0], -1).to(v_cache.dtype))
    return q.reshape(q.shape[0], -1)
