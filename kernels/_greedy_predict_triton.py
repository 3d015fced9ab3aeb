"""Triton kernels behind `greedy_predict` (contract: see greedy_predict.py).

* `_chunk_kernel`, grid (rows, vocabulary chunks of CHUNK): the chunk's max logit and its first index, the same
  without the [MASK] column, and sum(exp(logit - chunk max)) in fp64, into a [rows, chunks] workspace.
* `_merge_kernel`, grid (rows,): the row max M is the largest chunk max (the first chunk holding it gives the
  argmax, so ties go to the lowest index as in torch.argmax); the fp64 sum S = sum over chunks of
  s_c * exp(m_c - M); the argmax's probability is exp(0) / S, the fallback's and the given token's
  exp(logit - M) / S.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 2048  # vocabulary entries per program of the first pass (126,464 for LLaDA: 62 chunks per row)


@triton.jit
def _chunk_kernel(logits_ptr, stride_row, V, mask_id, m_ws, s_ws, idx_ws, fm_ws, fidx_ws, NC,
                  CHUNK: tl.constexpr, HAS_FALLBACK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m_ref = tl.where(m == float("-inf"), 0.0, m).to(tl.float64)  # a chunk of -inf logits adds 0, not NaN
    out = row * NC + chunk
    tl.store(m_ws + out, m)
    tl.store(s_ws + out, tl.sum(tl.exp(x.to(tl.float64) - m_ref), axis=0))
    tl.store(idx_ws + out, chunk.to(tl.int64) * CHUNK + tl.argmax(x, axis=0, tie_break_left=True))
    if HAS_FALLBACK:
        without_mask = tl.where(cols == mask_id, float("-inf"), x)
        tl.store(fm_ws + out, tl.max(without_mask, axis=0))
        tl.store(fidx_ws + out, chunk.to(tl.int64) * CHUNK + tl.argmax(without_mask, axis=0, tie_break_left=True))


@triton.jit
def _merge_kernel(logits_ptr, stride_row, V, m_ws, s_ws, idx_ws, fm_ws, fidx_ws, given_ptr,
                  tokens_ptr, conf_ptr, fallback_ptr, fallback_conf_ptr, given_prob_ptr, NC,
                  BLOCK_C: tl.constexpr, HAS_FALLBACK: tl.constexpr, HAS_GIVEN: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    ok = c < NC
    ws = row * NC + c
    m = tl.load(m_ws + ws, mask=ok, other=float("-inf"))
    s = tl.load(s_ws + ws, mask=ok, other=0.0)
    top = tl.max(m, axis=0)
    top_ref = tl.where(top == float("-inf"), 0.0, top).to(tl.float64)
    total = tl.sum(s * tl.exp(m.to(tl.float64) - top_ref), axis=0)
    first = tl.argmax(m, axis=0, tie_break_left=True)
    tl.store(tokens_ptr + row, tl.load(idx_ws + row * NC + first))
    tl.store(conf_ptr + row, tl.exp(top.to(tl.float64) - top_ref) / total)
    if HAS_FALLBACK:
        fm = tl.load(fm_ws + ws, mask=ok, other=float("-inf"))
        best = tl.argmax(fm, axis=0, tie_break_left=True)
        tl.store(fallback_ptr + row, tl.load(fidx_ws + row * NC + best))
        tl.store(fallback_conf_ptr + row, tl.exp(tl.max(fm, axis=0).to(tl.float64) - top_ref) / total)
    if HAS_GIVEN:
        token = tl.minimum(tl.maximum(tl.load(given_ptr + row), 0), V - 1)
        logit = tl.load(logits_ptr + row * stride_row + token).to(tl.float32).to(tl.float64)
        tl.store(given_prob_ptr + row, tl.exp(logit - top_ref) / total)


def greedy_predict_triton(logits: torch.Tensor, mask_id: int = -1, given_tokens: torch.Tensor | None = None):
    """Launch the two kernels; inputs must satisfy the contract (nothing is checked here)."""
    M, V = logits.shape
    device = logits.device
    tokens = torch.empty(M, dtype=torch.int64, device=device)
    conf = torch.empty(M, dtype=torch.float64, device=device)
    has_fallback, has_given = mask_id >= 0, given_tokens is not None
    fallback = torch.empty_like(tokens) if has_fallback else None
    fallback_conf = torch.empty_like(conf) if has_fallback else None
    given = torch.empty_like(conf) if has_given else None
    if M == 0:
        return tokens, conf, fallback, fallback_conf, given
    n_chunks = triton.cdiv(V, CHUNK)
    m_ws = torch.empty((M, n_chunks), dtype=torch.float32, device=device)
    s_ws = torch.empty((M, n_chunks), dtype=torch.float64, device=device)
    idx_ws = torch.empty((M, n_chunks), dtype=torch.int64, device=device)
    fm_ws, fidx_ws = (torch.empty_like(m_ws), torch.empty_like(idx_ws)) if has_fallback else (m_ws, idx_ws)
    _chunk_kernel[(M, n_chunks)](logits, logits.stride(0), V, mask_id, m_ws, s_ws, idx_ws, fm_ws, fidx_ws,
                                 n_chunks, CHUNK=CHUNK, HAS_FALLBACK=has_fallback, num_warps=4)
    _merge_kernel[(M,)](logits, logits.stride(0), V, m_ws, s_ws, idx_ws, fm_ws, fidx_ws,
                        given_tokens if has_given else tokens, tokens, conf,
                        fallback if has_fallback else tokens, fallback_conf if has_fallback else conf,
                        given if has_given else conf, n_chunks,
                        BLOCK_C=max(16, triton.next_power_of_2(n_chunks)), HAS_FALLBACK=has_fallback,
                        HAS_GIVEN=has_given, num_warps=1)
    return tokens, conf, fallback, fallback_conf, given
