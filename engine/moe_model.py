"""The parts of LLaDA-MoE and LLaDA2 that LLaDA and Dream lack: the expert MLP (router, routed experts, shared
expert) and the attention input with per-head QK-norm and partial RoPE. Plain PyTorch, no host syncs (the
decode step runs in a CUDA graph); engine/model.py calls these from both forward paths.

Routing (``route``), re-derived from the published modeling code:
  * LLaDA-MoE (OLMoE style): p = softmax(x W_r^T) over all experts (fp32); the K largest of p (+ expert bias
    when configured, which then also shifts the weights) are chosen; the weights are those values, never
    renormalised.
  * LLaDA2 (Ling 2.0): s = sigmoid(x W_r^T) in fp32; experts are chosen on s + expert_bias, restricted to
    the topk_group best of n_group groups (a group scores the sum of its 2 best biased scores); the weights
    are the *unbiased* s of the chosen experts, divided by their sum, times routed_scaling_factor.
The routed experts then run through ONE call with the contract of kernels/moe_experts.py (see ``MoEExperts``
below); the shared expert is a dense SwiGLU added to it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flash_dllm.engine.config import ModelConfig, MoEConfig
from flash_dllm.kernels.fused_qkv_rope_cache import rope_rotate_half


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


def moe_experts_reference(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                          w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """sum_k w[t,k] * down_e(silu(gate_e x_t) * up_e x_t) with e = topk_ids[t,k], in x's dtype.

    No data-dependent sizes anywhere (no host sync: this can run inside a CUDA graph). The way is chosen from
    static shapes: when the T*K (token, expert) pairs outnumber the experts, every expert runs once over all
    tokens with a combine weight that is zero for tokens that did not choose it (each expert's weights read
    once); otherwise each token's K experts are gathered and run as batched matmuls (K expert matrices read
    per token, which is what a decode step of a few tokens costs anyway). The grouped Triton kernel
    (kernels/moe_experts.py) computes only the chosen pairs and reads each expert once."""
    tokens, top_k = topk_ids.shape
    n_experts = w_gate_up.shape[0]
    if tokens * top_k >= n_experts:
        combine = torch.zeros(tokens, n_experts, device=x.device, dtype=torch.float32)
        combine.scatter_add_(1, topk_ids, topk_weights.float())
        out = torch.zeros(tokens, x.shape[1], device=x.device, dtype=torch.float32)
        for e in range(n_experts):
            gate, up = F.linear(x, w_gate_up[e]).chunk(2, dim=-1)
            out += combine[:, e:e + 1] * F.linear(F.silu(gate) * up, w_down[e]).float()
        return out.to(x.dtype)
    per_token = top_k * (w_gate_up[0].numel() + w_down[0].numel()) * w_gate_up.element_size()
    chunk = max(1, min(tokens, (256 << 20) // max(1, per_token)))  # about 256 MiB of gathered weights per chunk
    out = []
    for start in range(0, tokens, chunk):
        ids = topk_ids[start:start + chunk]
        gate_up = torch.matmul(w_gate_up[ids], x[start:start + chunk, None, :, None]).squeeze(-1)  # [t, K, 2F]
        gate, up = gate_up.chunk(2, dim=-1)
        down = torch.matmul(w_down[ids], (F.silu(gate) * up)[..., None]).squeeze(-1)  # [t, K, D]
        out.append((down.float() * topk_weights[start:start + chunk, :, None].float()).sum(1))
    return torch.cat(out).to(x.dtype) if out else x.new_zeros(0, x.shape[1])


# The single place the routed experts are called from (both forward paths). The lead switches it to
# flash_dllm.kernels.moe_experts.MoEExperts (same signature) when that kernel lands.
MoEExperts = moe_experts_reference


def moe_mlp(x: torch.Tensor, moe: MoEWeights, cfg: MoEConfig, shared_gate_up: torch.Tensor | None,
            shared_down: torch.Tensor | None, experts=None) -> torch.Tensor:
    """The expert MLP of any leading shape [..., D]: routed experts plus the shared expert (when present)."""
    flat = x.reshape(-1, x.shape[-1])
    ids, weights = route(flat, moe, cfg)
    out = (experts or MoEExperts)(flat, ids, weights, moe.w_gate_up, moe.w_down)
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
