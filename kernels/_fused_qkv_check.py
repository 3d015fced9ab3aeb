"""The fused QKV selector's guard (_fused_qkv_select.py): a candidate kernel must reproduce the torch reference on
the tuned call's own inputs before it is timed, so a path or config that computes wrong on some GPU or compiler is
never chosen."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ._fused_qkv_common import COUNTERS, FusedQKVProblem
from ._tuned_choice import within
from .rope_cache_write import rope_cache_write_reference


class ReferenceCheck:
    """The torch reference's q, k and v on a call's own inputs, computed once per tuned problem. Before a candidate
    is timed it runs once into scratch outputs (never the real cache) and must match them: a kernel that computes
    wrong on some GPU or compiler is dropped with a warning instead of chosen. The measure is the skinny-GEMM
    selectors' (`_tuned_choice.within`: the largest error against the largest value); the bound is far above
    rounding (the fused kernels round once where the reference rounds twice, one bf16 ulp) and far below a wrong
    head, half or row (~1)."""

    TOLERANCE = {torch.float32: 1e-4}  # 16-bit: 2e-2

    def __init__(self, call_args: tuple, problem: FusedQKVProblem):
        x, w_qkv, b_qkv, cos, sin, positions, _, _, k_cache, _ = call_args
        rows = torch.arange(x.shape[0], device=x.device)
        self.inputs = (x, w_qkv, b_qkv, cos, sin, positions, rows)
        self.cache_shape, self.cache_dtype = (x.shape[0], k_cache.shape[1]), k_cache.dtype
        k_ref, v_ref = self._scratch()
        qkv = F.linear(x, w_qkv, b_qkv)
        q_ref = rope_cache_write_reference(qkv, cos, sin, positions, rows, k_ref, v_ref, problem.n_heads,
                                           problem.n_kv_heads)
        self.expected = (q_ref, k_ref, v_ref)
        self.tolerance = self.TOLERANCE.get(x.dtype, 2e-2)
        # inputs that make the reference non-finite (a buffer never written) leave nothing to compare: no check
        self.usable = all(bool(t.isfinite().all()) for t in self.expected)

    def _scratch(self) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.inputs[0].device
        return tuple(torch.zeros(self.cache_shape, dtype=self.cache_dtype, device=device) for _ in range(2))

    def accepts(self, launcher) -> bool:
        if not self.usable:
            return True
        k, v = self._scratch()
        q = torch.empty_like(self.expected[0])
        launcher(*self.inputs, q, k, v)
        checks = [within(got, want, self.tolerance) for got, want in zip((q, k, v), self.expected)]
        if all(ok for ok, _ in checks):
            return True
        COUNTERS.rejected += 1
        error = max(error for _, error in checks)
        warnings.warn(f"fused QKV {launcher.path} config {launcher.config} computes wrong here (max error {error:.3g} "
                      f"against the torch reference, bound {self.tolerance:g} of its largest value): not a candidate")
        return False
