"""The "cublas" path of `fused_qkv_rope_cache` (contract: see fused_qkv_rope_cache.py): the projection as one
vendor GEMM (F.linear, bias included), then RoPE and the cache write in one small kernel (rope_cache_write.py).

Two launches and a round trip of the [N, (Hq + 2*Hkv) * Dh] product instead of one fused kernel. It is a
candidate because the vendor GEMM can stream the weight faster than our fused kernels on some problems (an H100
at 256 rows, Dream's narrow GQA weight), and because a GPU our Triton configs were never tuned on (an RTX 3090)
should not run a slower kernel than the one it already has: the selector times it beside the fused paths on the
user's GPU and keeps the fastest. Its q equals the torch reference's, which rounds the product the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from ._fused_qkv_common import FusedQKVProblem
from ._rope_cache_write_triton import rope_cache_write_triton


@dataclass(frozen=True)
class CublasConfig:
    """Nothing to tune on our side (the vendor GEMM picks its own kernel): one config, with no fields."""


def default_configs(bucket: int) -> tuple[CublasConfig, ...]:
    return (CublasConfig(),)


class CublasLauncher:
    """F.linear, then the RoPE + cache-write kernel; the product is allocated per call (a captured call takes
    it from the graph's pool)."""

    path = "cublas"

    def __init__(self, config: CublasConfig, problem: FusedQKVProblem):
        self.config = config
        self.q_shape = problem.q_shape
        self.heads = (problem.n_heads, problem.n_kv_heads)

    def __call__(self, x, w_qkv, b_qkv, cos, sin, positions, cache_rows, q, k_cache, v_cache) -> None:
        rope_cache_write_triton(F.linear(x, w_qkv, b_qkv), cos, sin, positions, cache_rows, q, k_cache, v_cache,
                                *self.heads)
