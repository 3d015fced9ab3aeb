"""Per-cell predictions from logits: argmax or a Gumbel-max sample, and its fp64 softmax confidence.

Tensor in, tensor out, on any device and inside a CUDA graph: nothing here synchronises. Both the device
step and the host reference call `predict`, so they see the same numbers.

Sampling noise is keyed, not drawn from a generator's stream: the uniform for (row, vocabulary id) is a hash
of (seed, step, pass, cell, vocabulary id). So a cell's sample does not depend on which other cells, slots or
padded rows share the step, on the device, or on how many random numbers were drawn before: a sequence samples
the same tokens alone or in any batch (given its seed), on CPU or GPU, eager or replayed as a graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flash_dllm.kernels.greedy_predict import GreedyPredict, greedy_predict_reference

_M32 = 0xFFFFFFFF
DRAFT_PASS, VERIFY_PASS = 0, 1


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on int64 tensors holding values in [0, 2^32) (products wrap mod 2^64,
    whose low 32 bits are exact)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def noise_keys(seed: torch.Tensor, step: torch.Tensor, pass_id: int, cell: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per row from broadcastable int64 tensors (seed per sequence, step per sequence, cell)."""
    h = _fmix32((seed & _M32) ^ 0x9E3779B9)
    h = _fmix32(h ^ ((step * 2 + pass_id) & _M32))
    return _fmix32(h ^ (cell & _M32))


def uniform_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """[M] keys -> [M, vocab] fp64 uniforms in (0, 1), one per (row, vocabulary id)."""
    ids = _fmix32(torch.arange(vocab, device=keys.device, dtype=torch.int64) * 0x27D4EB2F & _M32)
    h = _fmix32(keys[:, None] ^ ids[None, :])
    return (h.double() + 0.5) * (1.0 / 4294967296.0)


@dataclass
class Predictions:
    """Per row: chosen token, its softmax probability and, when asked, the probability of a given token
    (Flash-Verify: the mask view's probability of the drafted token). Device tensors.

    The token is chosen over the whole vocabulary, [MASK] included, as the published samplers do; a cell whose
    token is the mask id is not committed (it stays masked). `fallback_tokens` is the best token other than
    [MASK] and its probability: the threshold methods commit it when every chosen cell predicted [MASK]
    (where the published code would repeat the same step forever)."""

    tokens: torch.Tensor  # [M] int64
    confidences: torch.Tensor  # [M] float64
    probs_of_given: torch.Tensor | None = None  # [M] float64
    fallback_tokens: torch.Tensor | None = None  # [M] int64, never the mask id
    fallback_confidences: torch.Tensor | None = None  # [M] float64


def predict(logits: torch.Tensor, temperature: torch.Tensor | None = None, keys: torch.Tensor | None = None,
            given_tokens: torch.Tensor | None = None, mask_id: int | None = None,
            native_confidence: bool = False, greedy: GreedyPredict | None = None) -> Predictions:
    """logits [M, V] -> Predictions. Softmax in fp64, so thresholds such as 0.9 compare exactly as the
    reference implementations do; with native_confidence the confidence is the softmax in the logits' own
    dtype instead (LLaDA's generate.py ranks on it: in bf16 many cells tie at 1.0, and which of them are
    committed depends on it). With `temperature` ([M] float64; None = greedy) the token of a row whose
    temperature T > 0 is argmax(logits / T + Gumbel(keys)), of the others the plain argmax. With `mask_id`,
    also the fallback token (the same choice with [MASK] excluded). A greedy call with fp64 confidences runs
    `greedy` (kernels/greedy_predict.py bound to a backend; default its tensor-operation reference)."""
    if temperature is None and not native_confidence:
        run = greedy if greedy is not None else greedy_predict_reference
        tokens, conf, fallback, fallback_conf, given = run(logits, -1 if mask_id is None else mask_id, given_tokens)
        return Predictions(tokens=tokens, confidences=conf, probs_of_given=given, fallback_tokens=fallback,
                           fallback_confidences=fallback_conf)
    probs = torch.softmax(logits.double(), dim=-1)
    scores = logits
    if temperature is not None:
        if keys is None:
            raise ValueError("sampling at temperature > 0 needs noise keys")
        gumbel = -torch.log(-torch.log(uniform_noise(keys, logits.shape[-1])))
        scale = torch.where(temperature > 0, temperature, 1.0)[:, None]
        scores = torch.where(temperature[:, None] > 0, logits.double() / scale + gumbel, logits.double())
    tokens = torch.argmax(scores, dim=-1)
    ranked = probs if not native_confidence else torch.softmax(logits, dim=-1).double()
    conf = ranked.gather(-1, tokens[:, None])[:, 0]
    given = fallback = fallback_conf = None
    if given_tokens is not None:
        given = probs.gather(-1, given_tokens.long().clamp(0, logits.shape[-1] - 1)[:, None])[:, 0]
    if mask_id is not None:
        # a Python index, not an index tensor: building one would copy from the host inside a CUDA graph capture
        without_mask = scores.clone()
        without_mask[:, mask_id] = float("-inf")
        fallback = torch.argmax(without_mask, dim=-1)
        fallback_conf = ranked.gather(-1, fallback[:, None])[:, 0]
    return Predictions(tokens=tokens, confidences=conf, probs_of_given=given, fallback_tokens=fallback,
                       fallback_confidences=fallback_conf)
