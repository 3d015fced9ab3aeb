"""Triton kernel behind `scheduled_attention` (contract: see scheduled_attention.py).

Grid = (query tiles of the plan, query heads). A program reads its tile's sequence from the plan tensors
(nothing is synchronised to the host), runs an fp32 online softmax over that sequence's cache keys and then
over its in-query keys, and writes the normalised output. Sequence lengths, tile counts and key counts are
all runtime values, so one compiled kernel serves every step; only the tile height, the head dim and which
optional inputs are present select a variant.

Attention mass needs each query's final row max and sum, so tiles holding at least one score_query row run a
second pass over the cache keys that recomputes the logits and atomically adds the normalised probabilities
(summed over the tile's score rows) into score_out.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import interpreting

LOG2E = 1.4426950408889634


# (BLOCK_N, num_warps, num_stages) candidates: 4 warps (one warpgroup) for tiles under 128 rows, 8 above.
_CUDA_CANDIDATES = {4: [(32, 4, 3), (64, 4, 3), (128, 4, 2)], 8: [(64, 8, 3), (128, 8, 3), (64, 8, 2)]}


def _configs() -> list:
    if interpreting():  # multi-config autotune needs a driver; wide key blocks = few interpreted tl.dots
        return [triton.Config({"BLOCK_N": 128}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for rows in _CUDA_CANDIDATES.values()
            for n, w, s in rows]


def _prune_configs(configs, named_args, **kwargs):
    warps = 8 if {**named_args, **kwargs}["BLOCK_M"] >= 128 else 4
    return [c for c in configs if c.num_warps == warps] or configs


# Tuned once per tile height / head dim / feature set / dtype; the step's lengths are not part of the key.
# score_out is restored after every trial launch, since the kernel accumulates into it.
@triton.autotune(configs=_configs(), key=["BLOCK_M", "HEAD_DIM", "HAS_KEEP", "HAS_INQ", "HAS_SCORE"],
                 prune_configs_by={"early_config_prune": _prune_configs}, restore_value=["score_out_ptr"])
@triton.jit(do_not_specialize=["stride_inq", "tile_rows", "group"])  # inq_mask's width changes every step
def _scheduled_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr, kv_start_ptr, kv_len_ptr,
    kv_keep_ptr, inq_start_ptr, inq_mask_ptr, score_query_ptr, score_out_ptr,
    stride_q, stride_k, stride_v, stride_out, stride_inq,
    tile_rows, group, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_KEEP: tl.constexpr, HAS_INQ: tl.constexpr, HAS_SCORE: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_col = (head // group) * HEAD_DIM  # GQA: query head h reads KV head h // (Hq // Hkv)
    seq = tl.load(tile_seq_ptr + tile)
    q0 = tl.load(tile_q0_ptr + tile)
    q_end = tl.load(q_start_ptr + seq) + tl.load(q_len_ptr + seq)
    kv_start = tl.load(kv_start_ptr + seq)
    kv_len = tl.load(kv_len_ptr + seq)

    offs_m = q0 + tl.arange(0, BLOCK_M)
    row_ok = (tl.arange(0, BLOCK_M) < tile_rows) & (offs_m < q_end)  # tiles never cross sequences
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_ptrs = q_ptr + offs_m.to(tl.int64)[:, None] * stride_q + (head * HEAD_DIM + offs_d)[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:  # the interpreter multiplies bf16 bit patterns; do its math in fp32
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(0, kv_len, BLOCK_N):
        key_rows, key_ok = _cache_keys(kv_start, kv_len, n0, kv_keep_ptr, HAS_KEEP, BLOCK_N)
        acc, m_i, l_i = _online_softmax_step(
            q, k_ptr, v_ptr, key_rows, key_ok, key_ok[None, :], stride_k, stride_v, kv_col, offs_d, d_ok,
            qk_scale_log2, acc, m_i, l_i, UPCAST, DOT_PRECISION)
    if HAS_INQ:
        q_len = q_end - tl.load(q_start_ptr + seq)
        inq_start = tl.load(inq_start_ptr + seq)
        for n0 in tl.range(0, q_len, BLOCK_N, num_stages=1):  # few blocks; staging the byte mask spills
            offs_j = n0 + tl.arange(0, BLOCK_N)
            key_ok = offs_j < q_len
            mask_ptrs = inq_mask_ptr + offs_m.to(tl.int64)[:, None] * stride_inq + offs_j[None, :]
            chained = tl.load(mask_ptrs, mask=row_ok[:, None] & key_ok[None, :], other=0) != 0
            acc, m_i, l_i = _online_softmax_step(
                q, k_ptr, v_ptr, inq_start + offs_j, key_ok, chained, stride_k, stride_v, kv_col, offs_d, d_ok,
                qk_scale_log2, acc, m_i, l_i, UPCAST, DOT_PRECISION)

    # l_i is 0 (no visible key: acc is 0 too, so the row outputs zeros) or >= 1 (the max key adds exp2(0)).
    inv_l = 1.0 / tl.maximum(l_i, 1.0)
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_out + (head * HEAD_DIM + offs_d)[None, :]
    tl.store(out_ptrs, (acc * inv_l[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    if HAS_SCORE:
        scored = (tl.load(score_query_ptr + offs_m, mask=row_ok, other=0) != 0) & (l_i > 0.0)
        if tl.sum(scored.to(tl.int32), axis=0) > 0:
            for n0 in range(0, kv_len, BLOCK_N):
                key_rows, key_ok = _cache_keys(kv_start, kv_len, n0, kv_keep_ptr, HAS_KEEP, BLOCK_N)
                visible = key_ok[None, :] & scored[:, None]  # other rows add nothing (and never overflow exp2)
                logits = _scaled_logits(q, k_ptr, key_rows, key_ok, visible, stride_k, kv_col, offs_d, d_ok,
                                        qk_scale_log2, UPCAST, DOT_PRECISION)
                probs = tl.exp2(logits - tl.where(scored, m_i, 0.0)[:, None]) * inv_l[:, None]
                in_range = n0 + tl.arange(0, BLOCK_N) < kv_len
                tl.atomic_add(score_out_ptr + key_rows, tl.sum(probs, axis=0), mask=in_range)


@triton.jit
def _cache_keys(kv_start, kv_len, n0, kv_keep_ptr, HAS_KEEP: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows of one BLOCK_N slice of the sequence's cache range and which of them every query may see."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    key_ok = offs_n < kv_len
    key_rows = kv_start + offs_n
    if HAS_KEEP:
        key_ok = key_ok & (tl.load(kv_keep_ptr + key_rows, mask=key_ok, other=0) != 0)
    return key_rows, key_ok


@triton.jit
def _scaled_logits(q, k_ptr, key_rows, key_ok, visible, stride_k, kv_col, offs_d, d_ok, qk_scale_log2,
                   UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """q . k in fp32, pre-multiplied by log2(e)/sqrt(Dh) for exp2, -inf where not visible.

    key_ok [BLOCK_N]: rows that exist and may be seen at all (only those are loaded, so excluded or
    out-of-range rows cost no traffic and their contents never matter); visible: the per-query mask.
    """
    k_ptrs = k_ptr + key_rows.to(tl.int64)[None, :] * stride_k + (kv_col + offs_d)[:, None]
    k_t = tl.load(k_ptrs, mask=d_ok[:, None] & key_ok[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
    if UPCAST:
        k_t = k_t.to(tl.float32)
    logits = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale_log2
    return tl.where(visible, logits, float("-inf"))


@triton.jit
def _online_softmax_step(q, k_ptr, v_ptr, key_rows, key_ok, visible, stride_k, stride_v, kv_col, offs_d, d_ok,
                         qk_scale_log2, acc, m_i, l_i, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold one block of keys into the running (acc, row max, row sum); all-masked rows stay at zero."""
    logits = _scaled_logits(q, k_ptr, key_rows, key_ok, visible, stride_k, kv_col, offs_d, d_ok, qk_scale_log2,
                            UPCAST, DOT_PRECISION)
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoids -inf - -inf for rows with no key yet
    p = tl.exp2(logits - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    v_ptrs = v_ptr + key_rows.to(tl.int64)[:, None] * stride_v + (kv_col + offs_d)[None, :]
    v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
    if UPCAST:
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, alpha * l_i + tl.sum(p, axis=1)


def _as_flags(t: torch.Tensor) -> torch.Tensor:
    """bool/int8 masks as a byte view (Triton loads bytes; nonzero = True)."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def scheduled_attention_triton(q, k_cache, v_cache, plan, n_heads: int, n_kv_heads: int, score_out=None):
    """Launch the one-shot scheduled attention: returns [N, Hq*Dh] in q's dtype."""
    head_dim = q.shape[1] // n_heads
    if n_heads % n_kv_heads or k_cache.shape[1] != n_kv_heads * head_dim or v_cache.shape[1] != k_cache.shape[1]:
        raise ValueError("caches must be [R, Hkv*Dh] with Hq a multiple of Hkv")
    if q.stride(1) != 1 or k_cache.stride(1) != 1 or v_cache.stride(1) != 1:
        raise ValueError("q and the caches must be contiguous in their last dimension")
    out = torch.empty_like(q)
    if plan.n_tiles == 0 or q.shape[0] == 0:
        return out
    has_inq = plan.inq_start is not None and plan.inq_mask is not None
    has_score = score_out is not None and plan.score_query is not None
    if has_score and (score_out.dtype != torch.float32 or not score_out.is_contiguous()):
        raise ValueError("score_out must be a contiguous fp32 tensor [R]")
    inq_mask = _as_flags(plan.inq_mask) if has_inq else q
    if has_inq and inq_mask.stride(1) != 1:
        inq_mask = inq_mask.contiguous()
    _scheduled_attention_kernel[(plan.n_tiles, n_heads)](
        q, k_cache, v_cache, out,
        plan.tile_seq, plan.tile_q0, plan.q_start, plan.q_len, plan.kv_start, plan.kv_len,
        _as_flags(plan.kv_keep) if plan.kv_keep is not None else q,
        plan.inq_start if has_inq else q, inq_mask,
        _as_flags(plan.score_query) if has_score else q, score_out if has_score else q,
        q.stride(0), k_cache.stride(0), v_cache.stride(0), out.stride(0), inq_mask.stride(0),
        plan.block_m, n_heads // n_kv_heads, LOG2E / math.sqrt(head_dim),
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_M=max(16, triton.next_power_of_2(plan.block_m)),  # covers the plan's tile; tl.dot needs >= 16
        HAS_KEEP=plan.kv_keep is not None, HAS_INQ=has_inq, HAS_SCORE=has_score,
        UPCAST=interpreting(), DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
