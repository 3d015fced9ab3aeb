"""Triton kernels behind `scheduled_attention` (contract: see scheduled_attention.py; launcher:
_scheduled_attention_launcher.py).

Two launches when the keys are split (flash-decoding style), one when they are not:

* `_attention_split_kernel`, grid (query tiles, query heads, parts). A program reads its tile's sequence from
  the plan tensors (nothing is synchronised to the host) and runs an fp32 online softmax over one part of that
  sequence's keys: part s < n_splits is a contiguous range of its cache keys [0, kv_len) (the range is cut from
  the runtime kv_len, so every split has work while kv_len >= n_splits * KEY_GRANULE; later ones are empty),
  part n_splits its in-query keys (Flash-Verify). It writes the unnormalised partial (acc, row max, row sum)
  to a workspace. With ONE_PASS (a single split) one program walks all keys, then in-query keys, and writes
  the normalised output itself, so no workspace and no second launch.
* `_attention_combine_kernel`, grid (query tiles, query heads, max(BLOCK_M / 16, key chunks if attention
  mass)): program z merges the parts of 16 of the tile's rows into their final (row max, row sum) and
  normalised output. The number of parts is a compile-time constant (fixed per schedule bucket), so the loops
  over parts unroll and their loads are issued together instead of one dependent round trip per part: at
  batch 1 the combine is a chain of memory latencies, not a bandwidth problem.

Attention mass needs each query's final row max and sum, known only after every part. Split calls: combine
program z recomputes the score_query rows' logits over key chunk z (MASS_KEYS keys) from q and the keys,
gathered 16 rows at a time, and adds their probabilities under the merged stats. With STORE_LOGITS
(mass_from="stored") the split kernel instead scores those rows once more against each key block it has loaded
(a 16-row dot) and stores their logits (-inf at excluded keys) densely to a workspace [tiles, heads, rank,
key] (rank: the row's place among its tile's score rows); the combine then only exponentiates them. The
one-pass program recomputes its score rows over all keys after its loop (its keys are still in L2).
Probabilities are added into score_out with relaxed float atomics: the summation order, hence the low bits,
varies from run to run on a GPU.

Sequence lengths, tile counts and key counts are runtime values, so one compiled variant serves every step;
only the tile height, the head dim, which optional inputs are present and ONE_PASS select a variant.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import interpreting

LOG2E = 1.4426950408889634
# Split ranges are cut in whole granules, so a split never starts inside another's key block of this size.
KEY_GRANULE = tl.constexpr(64)
SCORE_ROWS = tl.constexpr(16)  # score rows recomputed together (tl.dot needs at least 16 rows)
COMBINE_ROWS = tl.constexpr(16)  # output rows one combine program merges ([16, Dh] fp32 fits in registers)
MASS_KEYS = tl.constexpr(128)  # cache keys one combine program scores (a multiple of every combine BLOCK_N)

# (BLOCK_N, num_warps, num_stages) candidates: 4 warps (one warpgroup) for tiles under 128 rows, 8 above.
_CUDA_CANDIDATES = {4: [(32, 4, 3), (64, 4, 3), (128, 4, 2)], 8: [(64, 8, 3), (128, 8, 3), (64, 8, 2)]}


def _configs() -> list:
    if interpreting():  # multi-config autotune needs a driver; wide key blocks = few interpreted tl.dots
        return [triton.Config({"BLOCK_N": 128}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for rows in _CUDA_CANDIDATES.values()
            for n, w, s in rows]


def _combine_configs() -> list:
    """The combine works on 16 rows at a time (output chunks, score rows), whatever the tile height."""
    if interpreting():
        return [triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_N": n}, num_warps=4, num_stages=s) for n, s in ((32, 2), (64, 2), (128, 1), (128, 2))]


def _prune_configs(configs, named_args, **kwargs):
    warps = 8 if {**named_args, **kwargs}["BLOCK_M"] >= 128 else 4
    return [c for c in configs if c.num_warps == warps] or configs


# Tuned once per tile height / head dim / feature set / dtype; the step's lengths are not part of the key.
# score_out is restored after every trial launch, since the one-pass variant accumulates into it.
@triton.autotune(configs=_configs(), key=["BLOCK_M", "HEAD_DIM", "HAS_KEEP", "HAS_INQ", "HAS_SCORE", "ONE_PASS",
                                          "STORE_LOGITS"],
                 prune_configs_by={"early_config_prune": _prune_configs}, restore_value=["score_out_ptr"])
@triton.jit(do_not_specialize=["stride_inq", "tile_rows", "group", "n_splits", "n_rows", "max_keys"])
def _attention_split_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr, kv_start_ptr, kv_len_ptr,
    kv_keep_ptr, inq_start_ptr, inq_mask_ptr, score_query_ptr, score_out_ptr,
    acc_ws_ptr, m_ws_ptr, l_ws_ptr, logit_ws_ptr,
    stride_q, stride_k, stride_v, stride_out, stride_inq,
    tile_rows, group, n_splits, n_rows, max_keys, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_KEEP: tl.constexpr, HAS_INQ: tl.constexpr, HAS_SCORE: tl.constexpr, ONE_PASS: tl.constexpr,
    STORE_LOGITS: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    kv_col = (head // group) * HEAD_DIM  # GQA: query head h reads KV head h // (Hq // Hkv)
    seq, q0, q_end, kv_start, kv_len = _tile_bounds(tile, tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr,
                                                    kv_start_ptr, kv_len_ptr)
    offs_m, row_ok = _tile_slice(q0, q_end, tile_rows, 0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_ptrs = q_ptr + offs_m.to(tl.int64)[:, None] * stride_q + (head * HEAD_DIM + offs_d)[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:  # the interpreter multiplies bf16 bit patterns; do its math in fp32
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, hi = _split_range(part, n_splits, kv_len, KEY_GRANULE)  # empty for the in-query part
    if STORE_LOGITS:  # the tile's score rows, by rank: their logits go to [tile, head, rank, key]
        scored = tl.load(score_query_ptr + offs_m, mask=row_ok, other=0) != 0
        rank = tl.cumsum(scored.to(tl.int32), axis=0) - 1
        n_scored = tl.sum(scored.to(tl.int32), axis=0)
        logit_base = logit_ws_ptr + (tile * tl.num_programs(1) + head).to(tl.int64) * BLOCK_M * max_keys
    for n0 in range(lo, hi, BLOCK_N):
        key_rows, key_ok = _cache_keys(kv_start, hi, n0, kv_keep_ptr, HAS_KEEP, BLOCK_N)
        acc, m_i, l_i, k_t = _online_softmax_step(
            q, k_ptr, v_ptr, key_rows, key_ok, key_ok[None, :], stride_k, stride_v, kv_col, offs_d, d_ok,
            qk_scale_log2, acc, m_i, l_i, UPCAST, DOT_PRECISION)
        if STORE_LOGITS:
            _store_score_logits(q_ptr, logit_base, k_t, key_ok, n0 + tl.arange(0, BLOCK_N), hi, stride_q,
                                head * HEAD_DIM, offs_m, scored, rank, n_scored, max_keys, offs_d, d_ok,
                                qk_scale_log2, UPCAST, DOT_PRECISION)
    if HAS_INQ:
        if ONE_PASS:
            inq_part = 0  # the one program of the tile also walks the in-query keys
        else:
            inq_part = n_splits
        if part == inq_part:
            q_len = tl.load(q_len_ptr + seq)
            inq_start = tl.load(inq_start_ptr + seq)
            for n0 in tl.range(0, q_len, BLOCK_N, num_stages=1):  # few blocks; staging the byte mask spills
                offs_j = n0 + tl.arange(0, BLOCK_N)
                key_ok = offs_j < q_len
                mask_ptrs = inq_mask_ptr + offs_m.to(tl.int64)[:, None] * stride_inq + offs_j[None, :]
                chained = tl.load(mask_ptrs, mask=row_ok[:, None] & key_ok[None, :], other=0) != 0
                acc, m_i, l_i, _ = _online_softmax_step(
                    q, k_ptr, v_ptr, inq_start + offs_j, key_ok, chained, stride_k, stride_v, kv_col, offs_d,
                    d_ok, qk_scale_log2, acc, m_i, l_i, UPCAST, DOT_PRECISION)

    if ONE_PASS:
        # l_i is 0 (no visible key: acc is 0 too, so the row outputs zeros) or >= 1 (the max key adds exp2(0)).
        inv_l = 1.0 / tl.maximum(l_i, 1.0)
        out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_out + (head * HEAD_DIM + offs_d)[None, :]
        tl.store(out_ptrs, (acc * inv_l[:, None]).to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
        if HAS_SCORE:
            scored = tl.load(score_query_ptr + offs_m, mask=row_ok, other=0) != 0
            _add_attention_mass(q_ptr, k_ptr, kv_keep_ptr, score_out_ptr, stride_q, stride_k, head * HEAD_DIM,
                                kv_col, offs_m, scored, m_i, l_i, kv_start, 0, kv_len, qk_scale_log2,
                                HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, HAS_KEEP, UPCAST, DOT_PRECISION)
    else:
        # Workspace [parts, rows, heads] (+ [head_dim] for acc); only the plan's valid rows are written.
        ws_row = (part.to(tl.int64) * n_rows + offs_m) * tl.num_programs(1) + head
        tl.store(m_ws_ptr + ws_row, m_i, mask=row_ok)
        tl.store(l_ws_ptr + ws_row, l_i, mask=row_ok)
        tl.store(acc_ws_ptr + ws_row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])


@triton.autotune(configs=_combine_configs(), key=["BLOCK_M", "HEAD_DIM", "HAS_KEEP", "HAS_SCORE", "N_PARTS",
                                                  "STORED_LOGITS"],
                 restore_value=["score_out_ptr"])
@triton.jit(do_not_specialize=["tile_rows", "group", "n_rows", "max_keys"])
def _attention_combine_kernel(
    q_ptr, k_ptr, out_ptr,
    tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr, kv_start_ptr, kv_len_ptr,
    kv_keep_ptr, score_query_ptr, score_out_ptr,
    acc_ws_ptr, m_ws_ptr, l_ws_ptr, logit_ws_ptr,
    stride_q, stride_k, stride_out,
    tile_rows, group, n_rows, max_keys, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    N_PARTS: tl.constexpr, HAS_KEEP: tl.constexpr, HAS_SCORE: tl.constexpr, STORED_LOGITS: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program z merges output rows [16z, 16z + 16) of its tile (while z < BLOCK_M / 16) and, with attention
    mass, scores the tile's score rows over cache keys [z * MASS_KEYS, (z + 1) * MASS_KEYS): from the logits
    the split kernel stored (STORED_LOGITS), or by recomputing them."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    z = tl.program_id(2)
    seq, q0, q_end, kv_start, kv_len = _tile_bounds(tile, tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr,
                                                    kv_start_ptr, kv_len_ptr)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    part_stride = (n_rows * tl.num_programs(1)).to(tl.int64)

    if z < BLOCK_M // COMBINE_ROWS:
        rows, row_ok = _tile_slice(q0, q_end, tile_rows, z * COMBINE_ROWS, COMBINE_ROWS)
        ws_row = rows.to(tl.int64) * tl.num_programs(1) + head
        m_f, l_f = _merged_row_stats(m_ws_ptr, l_ws_ptr, ws_row, row_ok, part_stride, N_PARTS, COMBINE_ROWS)
        m_ref = tl.where(m_f == float("-inf"), 0.0, m_f)
        acc = tl.zeros([COMBINE_ROWS, BLOCK_D], dtype=tl.float32)
        for p in tl.static_range(N_PARTS):
            m_p = tl.load(m_ws_ptr + p * part_stride + ws_row, mask=row_ok, other=float("-inf"))
            acc_ptrs = acc_ws_ptr + (p * part_stride + ws_row)[:, None] * HEAD_DIM + offs_d[None, :]
            acc_p = tl.load(acc_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            acc += acc_p * tl.exp2(m_p - m_ref)[:, None]
        out = acc * (1.0 / tl.maximum(l_f, 1.0))[:, None]  # l_f == 0: no visible key, acc is 0, output 0
        out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + (head * HEAD_DIM + offs_d)[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    if HAS_SCORE:
        lo = z * MASS_KEYS
        if lo < kv_len:
            hi = tl.minimum(lo + MASS_KEYS, kv_len)
            offs_m, row_ok = _tile_slice(q0, q_end, tile_rows, 0, BLOCK_M)
            scored = tl.load(score_query_ptr + offs_m, mask=row_ok, other=0) != 0
            ws_row = offs_m.to(tl.int64) * tl.num_programs(1) + head
            m_f, l_f = _merged_row_stats(m_ws_ptr, l_ws_ptr, ws_row, row_ok & scored, part_stride, N_PARTS,
                                         BLOCK_M)
            if STORED_LOGITS:
                logit_base = (tile * tl.num_programs(1) + head).to(tl.int64) * BLOCK_M * max_keys
                _add_stored_mass(logit_ws_ptr + logit_base, score_out_ptr, max_keys, scored, m_f, l_f, kv_start,
                                 lo, hi, MASS_KEYS)
            else:
                _add_attention_mass(q_ptr, k_ptr, kv_keep_ptr, score_out_ptr, stride_q, stride_k, head * HEAD_DIM,
                                    (head // group) * HEAD_DIM, offs_m, scored, m_f, l_f, kv_start, lo, hi,
                                    qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, HAS_KEEP, UPCAST,
                                    DOT_PRECISION)


@triton.jit
def _tile_bounds(tile, tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr, kv_start_ptr, kv_len_ptr):
    """The tile's sequence, its first packed row, the end of the sequence's real rows, its cache range."""
    seq = tl.load(tile_seq_ptr + tile)
    q_end = tl.load(q_start_ptr + seq) + tl.load(q_len_ptr + seq)
    return seq, tl.load(tile_q0_ptr + tile), q_end, tl.load(kv_start_ptr + seq), tl.load(kv_len_ptr + seq)


@triton.jit
def _tile_slice(q0, q_end, tile_rows, first, BLOCK: tl.constexpr):
    """Packed rows [first, first + BLOCK) of the tile and which are real queries: rows past q_len (a static
    plan's padding, or the next sequence of a ragged one) are never loaded or stored."""
    local = first + tl.arange(0, BLOCK)
    rows = q0 + local
    return rows, (local < tile_rows) & (rows < q_end)


@triton.jit
def _merged_row_stats(m_ws_ptr, l_ws_ptr, ws_row, row_ok, part_stride, N_PARTS: tl.constexpr, BLOCK: tl.constexpr):
    """Final (row max, row sum) of each row over every part, the in-query part included (rows not row_ok:
    (-inf, 0)). Unrolled: every part's loads go out at once."""
    m_f = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_f = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(N_PARTS):
        m_p = tl.load(m_ws_ptr + p * part_stride + ws_row, mask=row_ok, other=float("-inf"))
        l_p = tl.load(l_ws_ptr + p * part_stride + ws_row, mask=row_ok, other=0.0)
        m_new = tl.maximum(m_f, m_p)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # empty parts carry (-inf, 0, 0)
        l_f = l_f * tl.exp2(m_f - m_ref) + l_p * tl.exp2(m_p - m_ref)
        m_f = m_new
    return m_f, l_f


@triton.jit
def _split_range(split, n_splits, kv_len, GRANULE: tl.constexpr):
    """Cache-key range [lo, hi) of one split: whole granules, as even as possible. The in-query part
    (split == n_splits) gets lo = n_granules * GRANULE >= kv_len >= hi: nothing."""
    n_granules = tl.cdiv(kv_len, GRANULE)
    lo = (split * n_granules // n_splits) * GRANULE
    hi = tl.minimum(((split + 1) * n_granules // n_splits) * GRANULE, kv_len)
    return lo, hi


@triton.jit
def _cache_keys(kv_start, hi, n0, kv_keep_ptr, HAS_KEEP: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows of one BLOCK_N slice of the sequence's cache range (ending at hi) and which of them every query sees."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    key_ok = offs_n < hi
    key_rows = kv_start + offs_n
    if HAS_KEEP:
        key_ok = key_ok & (tl.load(kv_keep_ptr + key_rows, mask=key_ok, other=0) != 0)
    return key_rows, key_ok


@triton.jit
def _keys_t(k_ptr, key_rows, key_ok, stride_k, kv_col, offs_d, d_ok, UPCAST: tl.constexpr):
    """[BLOCK_D, BLOCK_N] the key block, transposed. key_ok [BLOCK_N]: rows that exist and may be seen at all
    (only those are loaded, so excluded or out-of-range rows cost no traffic and their contents never matter)."""
    k_ptrs = k_ptr + key_rows.to(tl.int64)[None, :] * stride_k + (kv_col + offs_d)[:, None]
    k_t = tl.load(k_ptrs, mask=d_ok[:, None] & key_ok[None, :], other=0.0)
    if UPCAST:
        k_t = k_t.to(tl.float32)
    return k_t


@triton.jit
def _logits(q, k_t, visible, qk_scale_log2, DOT_PRECISION: tl.constexpr):
    """q . k in fp32, pre-multiplied by log2(e)/sqrt(Dh) for exp2, -inf where not visible (the per-query mask)."""
    logits = tl.dot(q, k_t, input_precision=DOT_PRECISION) * qk_scale_log2
    return tl.where(visible, logits, float("-inf"))


@triton.jit
def _scaled_logits(q, k_ptr, key_rows, key_ok, visible, stride_k, kv_col, offs_d, d_ok, qk_scale_log2,
                   UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """_logits of q against the key block at key_rows (loaded here)."""
    k_t = _keys_t(k_ptr, key_rows, key_ok, stride_k, kv_col, offs_d, d_ok, UPCAST)
    return _logits(q, k_t, visible, qk_scale_log2, DOT_PRECISION)


@triton.jit
def _online_softmax_step(q, k_ptr, v_ptr, key_rows, key_ok, visible, stride_k, stride_v, kv_col, offs_d, d_ok,
                         qk_scale_log2, acc, m_i, l_i, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold one block of keys into the running (acc, row max, row sum); all-masked rows stay at zero. Also
    returns the loaded key block (transposed), for a caller that scores more rows against it."""
    k_t = _keys_t(k_ptr, key_rows, key_ok, stride_k, kv_col, offs_d, d_ok, UPCAST)
    logits = _logits(q, k_t, visible, qk_scale_log2, DOT_PRECISION)
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoids -inf - -inf for rows with no key yet
    p = tl.exp2(logits - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    v_ptrs = v_ptr + key_rows.to(tl.int64)[:, None] * stride_v + (kv_col + offs_d)[None, :]
    v = tl.load(v_ptrs, mask=key_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
    if UPCAST:
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, m_new, alpha * l_i + tl.sum(p, axis=1), k_t


@triton.jit
def _slots(scored, rank, s0):
    """Slots s0 .. s0 + SCORE_ROWS - 1 of the tile's score rows (by rank) and the one-hot [SCORE_ROWS, BLOCK_M]
    selection of each slot's row (an all-False row for a slot past the last score row)."""
    slot = s0 + tl.arange(0, SCORE_ROWS)
    return slot, scored[None, :] & (rank[None, :] == slot[:, None])


@triton.jit
def _by_slot(pick, values):
    """values [BLOCK_M] of the tile rows, gathered into slot order (0 for a slot without a row)."""
    return tl.sum(tl.where(pick, values[None, :], 0), axis=1)


@triton.jit
def _slot_queries(q_ptr, stride_q, q_col, offs_m, pick, live, offs_d, d_ok, UPCAST: tl.constexpr):
    """[SCORE_ROWS, BLOCK_D] the query rows of the live slots (zeros elsewhere)."""
    rows = _by_slot(pick, offs_m)
    q_c = tl.load(q_ptr + rows.to(tl.int64)[:, None] * stride_q + (q_col + offs_d)[None, :],
                  mask=live[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q_c = q_c.to(tl.float32)
    return q_c


@triton.jit
def _add_attention_mass(q_ptr, k_ptr, kv_keep_ptr, score_out_ptr, stride_q, stride_k, q_col, kv_col,
                        offs_m, scored, m_f, l_f, kv_start, lo, hi, qk_scale_log2,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, HAS_KEEP: tl.constexpr, UPCAST: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """score_out[key] += sum over the tile's scored rows of p(row -> key), for cache keys in [lo, hi).

    m_f / l_f: each tile row's final (log2-domain) row max and sum. Only scored rows are recomputed: they are
    gathered SCORE_ROWS at a time by rank (a [SCORE_ROWS, BLOCK_M] one-hot selection), so a tile with 16
    window rows out of 64 costs a quarter of a full second pass.
    """
    scored = scored & (l_f > 0.0)  # a row that saw no key has no distribution to add
    rank = tl.cumsum(scored.to(tl.int32), axis=0) - 1
    n_scored = tl.sum(scored.to(tl.int32), axis=0)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for s0 in range(0, n_scored, SCORE_ROWS):
        slot, pick = _slots(scored, rank, s0)
        has_row = slot < n_scored
        m_c = _by_slot(pick, m_f)
        inv_l_c = 1.0 / tl.maximum(_by_slot(pick, l_f), 1.0)
        q_c = _slot_queries(q_ptr, stride_q, q_col, offs_m, pick, has_row, offs_d, d_ok, UPCAST)
        for n0 in range(lo, hi, BLOCK_N):
            key_rows, key_ok = _cache_keys(kv_start, hi, n0, kv_keep_ptr, HAS_KEEP, BLOCK_N)
            logits = _scaled_logits(q_c, k_ptr, key_rows, key_ok, has_row[:, None] & key_ok[None, :], stride_k,
                                    kv_col, offs_d, d_ok, qk_scale_log2, UPCAST, DOT_PRECISION)
            probs = tl.exp2(logits - m_c[:, None]) * inv_l_c[:, None]
            # relaxed: nothing here orders other memory; the default acq_rel fences every add
            tl.atomic_add(score_out_ptr + key_rows, tl.sum(probs, axis=0), mask=key_ok, sem="relaxed")


@triton.jit
def _store_score_logits(q_ptr, logit_base, k_t, key_ok, offs_n, hi, stride_q, q_col, offs_m, scored, rank, n_scored,
                        max_keys, offs_d, d_ok, qk_scale_log2, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """logit_base[rank * max_keys + key] = the score rows' logits against this key block (-inf at excluded keys,
    so they get no mass). The rows are scored again, SCORE_ROWS at a time, against the key block already loaded,
    so each store is a dense [SCORE_ROWS, BLOCK_N] block instead of the whole tile's logits masked to the few
    score rows."""
    for s0 in range(0, n_scored, SCORE_ROWS):
        slot, pick = _slots(scored, rank, s0)
        live = slot < n_scored
        q_c = _slot_queries(q_ptr, stride_q, q_col, offs_m, pick, live, offs_d, d_ok, UPCAST)
        logits = _logits(q_c, k_t, key_ok[None, :], qk_scale_log2, DOT_PRECISION)
        tl.store(logit_base + slot.to(tl.int64)[:, None] * max_keys + offs_n[None, :], logits,
                 mask=live[:, None] & (offs_n < hi)[None, :])


@triton.jit
def _add_stored_mass(logit_ptr, score_out_ptr, max_keys, scored, m_f, l_f, kv_start, lo, hi,
                     BLOCK_K: tl.constexpr):
    """score_out[key] += sum over the tile's score rows of p(row -> key), for cache keys in [lo, hi), from the
    logits the split kernel stored at logit_ptr[rank * max_keys + key] (rank: the row's place among the tile's
    score rows, the same cumsum as there). No key or query is read again."""
    rank = tl.cumsum(scored.to(tl.int32), axis=0) - 1
    n_scored = tl.sum(scored.to(tl.int32), axis=0)
    keys = lo + tl.arange(0, BLOCK_K)
    key_ok = keys < hi
    total = tl.zeros([BLOCK_K], dtype=tl.float32)
    for s0 in range(0, n_scored, SCORE_ROWS):
        slot, pick = _slots(scored, rank, s0)
        m_c = _by_slot(pick, m_f)
        l_c = _by_slot(pick, l_f)
        live = (slot < n_scored) & (l_c > 0.0)  # a row that saw no key has no distribution to add
        logits = tl.load(logit_ptr + slot.to(tl.int64)[:, None] * max_keys + keys[None, :],
                         mask=live[:, None] & key_ok[None, :], other=float("-inf"))
        probs = tl.exp2(logits - tl.where(live, m_c, 0.0)[:, None]) * (1.0 / tl.maximum(l_c, 1.0))[:, None]
        total += tl.sum(probs, axis=0)
    tl.atomic_add(score_out_ptr + kv_start + keys, total, mask=key_ok & (n_scored > 0), sem="relaxed")


# bench_kernels.py reads .best_config of the kernel that serves the one-split (many tiles) case.
_scheduled_attention_kernel = _attention_split_kernel
