"""The threshold methods' commit rule (Fast-dLLM, Flash-Cache), in one launch.

Which of a step's candidate cells to commit: every one whose confidence reaches the sequence's threshold, at
least the most confident one, and, where every chosen candidate predicted [MASK] (which is never committed),
also the candidate with the most probable real token, whose token and probability replace its prediction.
As tensor operations that is about twenty small kernels per step; the Triton kernel does a row per program.

Contract (S sequences, R candidates, one device):
    cells                 [S, R] int64: candidate cells, -1 = none
    confidences           [S, R] float64, tokens [S, R] int64: each candidate's prediction
    fallback_tokens       [S, R] int64, fallback_confidences [S, R] float64: its best token other than [MASK]
    threshold             [S] float64
Returns (chosen [S, R] bool, tokens [S, R] int64, confidences [S, R] float64), new tensors; the inputs are
not written. Ties go to the earlier candidate (torch.argmax's rule). Exact: comparisons and copies only.
The host rules are engine/strategies.py: threshold_select and ensure_progress.
"""
from __future__ import annotations

import torch

from . import bind_backend


def threshold_select_reference(cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold,
                               mask_id: int):
    valid = cells >= 0
    chosen = valid & (confidences >= threshold[:, None])
    best = torch.where(valid, confidences, -1.0).argmax(1, keepdim=True)
    nothing = (valid.any(1) & ~chosen.any(1))[:, None]
    chosen = chosen | torch.zeros_like(chosen).scatter_(1, best, nothing)
    return ensure_progress_reference(cells, chosen, tokens, confidences, fallback_tokens, fallback_confidences,
                                     mask_id)


def ensure_progress_reference(cells, chosen, tokens, confidences, fallback_tokens, fallback_confidences,
                              mask_id: int):
    """The second half of the rule, for any choice (the engine's top-k methods use it too): where no chosen
    candidate predicted a real token, also choose the candidate with the most probable real token and swap its
    fallback token and probability in. Returns (chosen, tokens, confidences)."""
    valid = cells >= 0
    stuck = valid.any(1) & ~(chosen & (tokens != mask_id)).any(1)
    best = torch.where(valid, fallback_confidences, -1.0).argmax(1, keepdim=True)
    swap = torch.zeros_like(chosen).scatter_(1, best, stuck[:, None])
    return (chosen | swap, torch.where(swap, fallback_tokens, tokens),
            torch.where(swap, fallback_confidences, confidences))


def check_threshold_select_inputs(cells, confidences, tokens, fallback_tokens, fallback_confidences,
                                  threshold) -> None:
    """The contract's shapes and dtypes; raises ValueError. Run by the dispatcher, not by ThresholdSelect."""
    shape = tuple(cells.shape)
    if len(shape) != 2:
        raise ValueError(f"cells must be [S, R], got {list(shape)}")
    want = {"cells": (cells, torch.int64), "confidences": (confidences, torch.float64),
            "tokens": (tokens, torch.int64), "fallback_tokens": (fallback_tokens, torch.int64),
            "fallback_confidences": (fallback_confidences, torch.float64)}
    for name, (t, dtype) in want.items():
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{name} must be {list(shape)} {dtype}, got {list(t.shape)} {t.dtype}")
        if shape[1] and t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if tuple(threshold.shape) != shape[:1] or threshold.dtype != torch.float64:
        raise ValueError(f"threshold must be [{shape[0]}] float64")


def _bind(backend: str):
    return bind_backend(backend, threshold_select_reference, "._threshold_select_triton", "threshold_select_triton")


def threshold_select(cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold, *,
                     mask_id: int, backend: str = "torch"):
    """Checked dispatcher: "torch" runs the reference, "triton" the kernel."""
    check_threshold_select_inputs(cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold)
    return _bind(backend)(cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold, mask_id)


class ThresholdSelect:
    """threshold_select bound to one backend; a call only launches (a CUDA graph can capture it)."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = _bind(backend)

    def __call__(self, cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold, *,
                 mask_id: int):
        return self._run(cells, confidences, tokens, fallback_tokens, fallback_confidences, threshold, mask_id)
