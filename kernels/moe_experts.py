"""The routed experts of a mixture-of-experts MLP (LLaDA-MoE, LLaDA2): grouped SwiGLU experts, weighted sum.

Contract (shared by the reference and the Triton kernels):
    x             [T, D]      normed hidden states (bf16/fp16/fp32), last dimension contiguous
    topk_ids      [T, K]      int32/int64, the experts each token was routed to, each in [0, E)
    topk_weights  [T, K]      fp32 or x's dtype, the routing weights (any values: normalised or not, scaled)
    w_gate_up     [E, 2F, D]  in x's dtype, last dimension contiguous; per expert F gate rows then F up rows
    w_down        [E, D, F]   in x's dtype, last dimension contiguous
    out           [T, D]      in x's dtype (optional; last dimension contiguous, must not overlap the inputs)
Returns out with
    out[t] = sum_k topk_weights[t, k] * down_e(silu(gate_e(x[t])) * up_e(x[t])),   e = topk_ids[t, k]
where gate_e / up_e / down_e multiply by the expert's rows (nn.Linear layout). Routing itself (router logits,
softmax or sigmoid, top-k, normalisation, scaling, shared experts) stays in the model family's code.
A token may name an expert twice; both slots then count.

Rounding: the reference is the torch a careful engineer writes (per expert: a gather, F.linear, silu * up,
F.linear, each rounded to x's dtype, then the weighted sum over k in fp32, rounded once). The Triton path
accumulates in fp32, rounds only the SwiGLU activation to x's dtype (the down GEMM's input), keeps the down
output in fp32 and rounds the weighted sum once; so in bf16 it sits within rounding noise of the reference
(rel. error ~1e-3), and in fp32 it agrees to ~1e-6. The sum over k runs in slot order k = 0 .. K-1 with no
atomics, so the same inputs give the same bits on every run.

Bind once: `MoEExperts(backend)` resolves the backend at construction ("auto": Triton on CUDA, the torch
reference on CPU; "triton" / "torch" force one, "triton" on CPU only under TRITON_INTERPRET=1). The Triton
path groups the (token, slot) pairs by expert on the device with static shapes and no host synchronisation,
so a call can be captured in a CUDA graph and replayed with new x / ids / weights copied into its buffers;
each expert that got tokens has its weights streamed once per call, the others are never read. The torch
reference loops over the experts present (a host sync), so it cannot be captured.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import resolve_backend
from .silu_mul import silu_mul_reference

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_ID_DTYPES = (torch.int32, torch.int64)


def moe_experts_reference(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                          w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Per expert present: gather its tokens, SwiGLU through its weights; then the weighted sum over slots."""
    n_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1).long()
    token_of_pair = torch.arange(n_tokens * top_k, device=x.device) // top_k
    pair_out = torch.zeros(n_tokens * top_k, x.shape[1], dtype=torch.float32, device=x.device)
    for expert in flat_ids.unique().tolist():
        pairs = (flat_ids == expert).nonzero().squeeze(1)
        act = silu_mul_reference(F.linear(x[token_of_pair[pairs]], w_gate_up[expert]))
        pair_out[pairs] = F.linear(act, w_down[expert]).float()
    weighted = pair_out.view(n_tokens, top_k, x.shape[1]) * topk_weights.float().unsqueeze(-1)
    return weighted.sum(dim=1).to(x.dtype)


def check_moe_experts_inputs(x, topk_ids, topk_weights, w_gate_up, w_down, out=None,
                             check_values: bool = False) -> None:
    """The contract's shape/dtype/layout rules; raises ValueError. check_values also reads the ids (a host
    sync: debugging only) and requires each in [0, E)."""
    if x.dim() != 2 or x.dtype not in _DTYPES or x.stride(1) != 1:
        raise ValueError(f"x must be [T, D] bf16/fp16/fp32, last dimension contiguous; got {tuple(x.shape)} "
                         f"{x.dtype}")
    n_tokens, d_model = x.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != n_tokens or topk_ids.dtype not in _ID_DTYPES:
        raise ValueError(f"topk_ids must be [{n_tokens}, K] int32/int64, got {tuple(topk_ids.shape)} "
                         f"{topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape or topk_weights.dtype not in (torch.float32, x.dtype):
        raise ValueError(f"topk_weights must be {list(topk_ids.shape)} fp32 or {x.dtype}, got "
                         f"{tuple(topk_weights.shape)} {topk_weights.dtype}")
    if w_gate_up.dim() != 3 or w_gate_up.shape[2] != d_model or w_gate_up.shape[1] % 2:
        raise ValueError(f"w_gate_up must be [E, 2F, {d_model}], got {tuple(w_gate_up.shape)}")
    n_experts, ffn = w_gate_up.shape[0], w_gate_up.shape[1] // 2
    if w_down.shape != (n_experts, d_model, ffn):
        raise ValueError(f"w_down must be [{n_experts}, {d_model}, {ffn}], got {tuple(w_down.shape)}")
    for name, weight in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if weight.dtype != x.dtype or weight.stride(2) != 1:
            raise ValueError(f"{name} must be in x's dtype ({x.dtype}), last dimension contiguous; got {weight.dtype}")
    if topk_ids.shape[1] > n_experts:
        raise ValueError(f"top-k ({topk_ids.shape[1]}) exceeds the number of experts ({n_experts})")
    tensors = (x, topk_ids, topk_weights, w_gate_up, w_down) + (() if out is None else (out,))
    if len({t.device for t in tensors}) != 1:
        raise ValueError("all tensors must be on one device")
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.stride(1) != 1):
        raise ValueError(f"out must be [{n_tokens}, {d_model}] {x.dtype}, last dimension contiguous")
    if check_values and topk_ids.numel() and not bool(((topk_ids >= 0) & (topk_ids < n_experts)).all()):
        raise ValueError(f"topk_ids must lie in [0, {n_experts})")


class MoEExperts:
    """The routed-experts op bound to one backend at construction; call it as the contract says.

    backend: "auto" (or None) picks Triton on CUDA and the reference on CPU for `device`; "triton" or "torch"
    forces one (see kernels.resolve_backend). check_inputs checks every call against the contract, ids
    included (a host sync; tests and debugging). tiles (Triton only) fixes the block sizes instead of the
    per-shape choice (tests, benchmark sweeps). A call only launches: no environment reads, no imports.
    """

    def __init__(self, backend: str | None = "auto", device: torch.device | str | None = None, *,
                 check_inputs: bool = False, tiles=None):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.backend = resolve_backend(backend, device)
        self.check_inputs = check_inputs
        self.tiles = tiles
        self._triton = None
        if self.backend == "triton":
            from ._moe_experts_triton import moe_experts_triton

            self._triton = moe_experts_triton

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w_gate_up: torch.Tensor,
                 w_down: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.check_inputs:
            check_moe_experts_inputs(x, topk_ids, topk_weights, w_gate_up, w_down, out, check_values=True)
        if self._triton is not None:
            return self._triton(x, topk_ids, topk_weights, w_gate_up, w_down, out, self.tiles)
        result = moe_experts_reference(x, topk_ids, topk_weights, w_gate_up, w_down)
        return result if out is None else out.copy_(result)
