"""Greedy predictions from a step's logits: the argmax, its fp64 softmax probability, the best token other than
[MASK] with its probability, and the probability of a given token (Flash-Verify's drafts), in two launches.

As tensor operations (engine/sampling.py's greedy path) a step converts its [rows, vocabulary] logits to fp64,
takes a full softmax, two argmaxes over a copy with [MASK] removed and a few gathers: a dozen kernels, several of
them latency-bound with only 16 rows (the fp64 softmax alone took 0.09 ms of a 6.9 ms LLaDA-8B step on the
H200). The Triton path reads the logits once: programs over (row, vocabulary chunk) write each chunk's max,
first argmax, best non-[MASK] logit and its index, and its fp64 sum of exp(logit - chunk max); one program per
row then merges the chunks.

Contract:
    logits        [M, V] bf16 / fp16 / fp32, last dimension contiguous
    mask_id       int: the [MASK] id (the fallback excludes it), or -1 for no fallback
    given_tokens  [M] int64 or None
Returns (tokens [M] int64, confidences [M] float64, fallback_tokens [M] int64 | None,
         fallback_confidences [M] float64 | None, probs_of_given [M] float64 | None).
tokens: the first index of the row's largest logit, as torch.argmax; the same for the fallback over the
logits without column mask_id. Probabilities: softmax of the logits in fp64. Tokens are exact; probabilities
match the reference's to fp64 rounding (the sum runs in another order: relative difference ~1e-15).
"""
from __future__ import annotations

import torch

from . import bind_backend


def greedy_predict_reference(logits: torch.Tensor, mask_id: int = -1, given_tokens: torch.Tensor | None = None):
    probs = torch.softmax(logits.double(), dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    conf = probs.gather(-1, tokens[:, None])[:, 0]
    fallback = fallback_conf = given = None
    if mask_id >= 0:
        # a Python index, not an index tensor: building one would copy from the host inside a CUDA graph capture
        without_mask = logits.clone()
        without_mask[:, mask_id] = float("-inf")
        fallback = torch.argmax(without_mask, dim=-1)
        fallback_conf = probs.gather(-1, fallback[:, None])[:, 0]
    if given_tokens is not None:
        given = probs.gather(-1, given_tokens.long().clamp(0, logits.shape[-1] - 1)[:, None])[:, 0]
    return tokens, conf, fallback, fallback_conf, given


def check_greedy_predict_inputs(logits: torch.Tensor, mask_id: int, given_tokens: torch.Tensor | None) -> None:
    """The contract's rules; raises ValueError. Run by the dispatcher, not by GreedyPredict."""
    if logits.dim() != 2 or logits.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"logits must be [M, V] bf16/fp16/fp32, got {list(logits.shape)} {logits.dtype}")
    if logits.shape[1] and logits.stride(1) != 1:
        raise ValueError("logits must be contiguous in their last dimension")
    if mask_id >= logits.shape[1]:
        raise ValueError(f"mask_id {mask_id} is outside the vocabulary of {logits.shape[1]}")
    if given_tokens is not None and (tuple(given_tokens.shape) != (logits.shape[0],)
                                     or given_tokens.dtype != torch.int64):
        raise ValueError(f"given_tokens must be [{logits.shape[0]}] int64")


def _bind(backend: str):
    return bind_backend(backend, greedy_predict_reference, "._greedy_predict_triton", "greedy_predict_triton")


def greedy_predict(logits, mask_id: int = -1, given_tokens=None, *, backend: str = "torch"):
    """Checked dispatcher: "torch" runs the reference, "triton" the kernels."""
    check_greedy_predict_inputs(logits, mask_id, given_tokens)
    return _bind(backend)(logits, mask_id, given_tokens)


class GreedyPredict:
    """greedy_predict bound to one backend; a call only launches (a CUDA graph can capture it)."""

    def __init__(self, backend: str):
        self.backend = backend
        self._run = _bind(backend)

    def __call__(self, logits, mask_id: int = -1, given_tokens=None):
        return self._run(logits, mask_id, given_tokens)
