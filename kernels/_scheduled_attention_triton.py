"""Triton kernels behind `scheduled_attention` (contract: see scheduled_attention.py; launcher:
_scheduled_attention_launcher.py).

Two launches when the keys are split (flash-decoding style), one when they are not:

* `_attention_split_kernel`, grid (query tiles, query heads, parts). A program reads its tile's sequence from
  the plan tensors (nothing is synchronised to the host) and runs an fp32 online softmax over one part of that
  sequence's keys: part s < n_splits is a contiguous range of its cache keys [0, kv_len) (the range is cut from
  the runtime kv_len, so every split has work while kv_len >= n_splits * KEY_GRANULE; later ones are empty),
  part n_splits its in-query keys (Flash-Verify). It writes its partial to a workspace: the part's own
  normalised output (acc / row sum, in the workspace's dtype: the inputs' for 16-bit inputs, since a convex
  combination of V rows fits V's range, which halves the bytes the partials cost at batch 1, where 128 query
  rows per split weigh about as much as the split's keys) and its (row max, row sum) in fp32. With ONE_PASS (a
  single split) one program walks all keys, then in-query keys, and writes the normalised output itself, so no
  workspace and no second launch.
* `_attention_combine_kernel`, grid (query tiles, query heads, BLOCK_M / 16): program z merges the parts of
  16 of the tile's rows into their final (row max, row sum) and normalised output. The number of parts is a
  compile-time constant (fixed per schedule bucket), so the loops over parts unroll and their loads are issued
  together instead of one dependent round trip per part: at batch 1 the combine is a chain of memory
  latencies, not a bandwidth problem.

Attention mass (the window rows' raw q.k logits, summed; contract in scheduled_attention.py) is linear in the
queries, so a program sums its tile's score rows into one query per head (fp32) and, for every cache key
block it loads anyway, adds that query's dot with each key into score_out: no second pass over the keys, no
row statistics, nothing for the combine to do. Tiles and heads add with relaxed float atomics: the summation
order, hence the low bits, varies from run to run on a GPU.

Sequence lengths, tile counts and key counts are runtime values, so one compiled variant serves every step;
only the tile height, the head dim, which optional inputs are present and ONE_PASS select a variant.
"""
from __future__ import annotations

import inspect

import triton
import triton.language as tl

from . import interpreting

LOG2E = 1.4426950408889634
# Split ranges are cut in whole granules, so a split never starts inside another's key block of this size.
KEY_GRANULE = tl.constexpr(64)
COMBINE_ROWS = tl.constexpr(16)  # output rows one combine program merges ([16, Dh] fp32 fits in registers)

# (BLOCK_N, num_warps, num_stages) candidates: 4 warps (one warpgroup) for tiles under 128 rows, 8 above.
# (32, 4, 2) is the one whose 36 KB of shared memory fit twice in an RTX 3090's 100 KB SM (the key-split count
# follows the tuned config's occupancy, `_scheduled_attention_launcher`); Hopper's tuner keeps (64, 4, 3).
_CUDA_CANDIDATES = {4: [(32, 4, 2), (32, 4, 3), (64, 4, 3), (128, 4, 2)], 8: [(64, 8, 3), (128, 8, 3), (64, 8, 2)]}


# Tuned configs kept in Triton's cache directory (keyed by its version, the GPU architecture, the kernel source,
# the tuning key and the candidates), so a new process does not time them again; triton before 3.3 re-tunes.
_KEEP_TUNING = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def _configs() -> list:
    if interpreting():  # multi-config autotune needs a driver; wide key blocks = few interpreted tl.dots
        return [triton.Config({"BLOCK_N": 128}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s) for rows in _CUDA_CANDIDATES.values()
            for n, w, s in rows]


def _combine_configs() -> list:
    """The combine merges 16 rows at a time, whatever the tile height; it reads no keys."""
    if interpreting():
        return [triton.Config({}, num_warps=4, num_stages=1)]
    return [triton.Config({}, num_warps=w, num_stages=1) for w in (2, 4)]


def _prune_configs(configs, named_args, **kwargs):
    warps = 8 if {**named_args, **kwargs}["BLOCK_M"] >= 128 else 4
    return [c for c in configs if c.num_warps == warps] or configs


# Tuned once per tile height / head dim / feature set / dtype; the step's lengths are not part of the key.
# score_out is restored after every trial launch, since the kernel accumulates into it.
@triton.autotune(configs=_configs(), key=["BLOCK_M", "HEAD_DIM", "HAS_KEEP", "HAS_INQ", "HAS_SCORE", "ONE_PASS"],
                 prune_configs_by={"early_config_prune": _prune_configs}, restore_value=["score_out_ptr"], **_KEEP_TUNING)
@triton.jit(do_not_specialize=["stride_inq", "tile_rows", "group", "n_splits", "n_rows"])
def _attention_split_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr, kv_start_ptr, kv_len_ptr,
    kv_keep_ptr, inq_start_ptr, inq_mask_ptr, score_query_ptr, score_out_ptr,
    acc_ws_ptr, m_ws_ptr, l_ws_ptr,
    stride_q, stride_k, stride_v, stride_out, stride_inq,
    tile_rows, group, n_splits, n_rows, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_KEEP: tl.constexpr, HAS_INQ: tl.constexpr, HAS_SCORE: tl.constexpr, ONE_PASS: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
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
    if HAS_SCORE:  # the tile's score rows summed into one query: their logits summed, by linearity
        scored = tl.load(score_query_ptr + offs_m, mask=row_ok, other=0) != 0
        window_q = tl.sum(tl.where(scored[:, None], q.to(tl.float32), 0.0), axis=0)  # [BLOCK_D]
        has_window = tl.sum(scored.to(tl.int32), axis=0) > 0
    for n0 in range(lo, hi, BLOCK_N):
        key_rows, key_ok = _cache_keys(kv_start, hi, n0, kv_keep_ptr, HAS_KEEP, BLOCK_N)
        acc, m_i, l_i, k_t = _online_softmax_step(
            q, k_ptr, v_ptr, key_rows, key_ok, key_ok[None, :], stride_k, stride_v, kv_col, offs_d, d_ok,
            qk_scale_log2, acc, m_i, l_i, UPCAST, DOT_PRECISION)
        if HAS_SCORE:
            if has_window:
                # relaxed: nothing here orders other memory; the default acq_rel fences every add
                tl.atomic_add(score_out_ptr + key_rows, tl.sum(k_t.to(tl.float32) * window_q[:, None], axis=0),
                              mask=key_ok, sem="relaxed")
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
    else:
        # Workspace [parts, rows, heads] (+ [head_dim] for the output); only the plan's valid rows are written.
        # l_i is 0 (an empty part: acc is 0) or >= 1, as above.
        ws_row = (part.to(tl.int64) * n_rows + offs_m) * tl.num_programs(1) + head
        tl.store(m_ws_ptr + ws_row, m_i, mask=row_ok)
        tl.store(l_ws_ptr + ws_row, l_i, mask=row_ok)
        part_out = acc * (1.0 / tl.maximum(l_i, 1.0))[:, None]
        tl.store(acc_ws_ptr + ws_row[:, None] * HEAD_DIM + offs_d[None, :], part_out.to(acc_ws_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])


@triton.autotune(configs=_combine_configs(), key=["BLOCK_M", "HEAD_DIM", "N_PARTS"], **_KEEP_TUNING)
@triton.jit(do_not_specialize=["tile_rows", "n_rows"])
def _attention_combine_kernel(
    out_ptr, tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr, kv_start_ptr, kv_len_ptr,
    acc_ws_ptr, m_ws_ptr, l_ws_ptr, stride_out, tile_rows, n_rows,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, N_PARTS: tl.constexpr,
):
    """Program z merges output rows [16z, 16z + 16) of its tile."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    z = tl.program_id(2)
    _, q0, q_end, _, _ = _tile_bounds(tile, tile_seq_ptr, tile_q0_ptr, q_start_ptr, q_len_ptr, kv_start_ptr,
                                      kv_len_ptr)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    part_stride = (n_rows * tl.num_programs(1)).to(tl.int64)
    rows, row_ok = _tile_slice(q0, q_end, tile_rows, z * COMBINE_ROWS, COMBINE_ROWS)
    ws_row = rows.to(tl.int64) * tl.num_programs(1) + head
    m_f, l_f = _merged_row_stats(m_ws_ptr, l_ws_ptr, ws_row, row_ok, part_stride, N_PARTS, COMBINE_ROWS)
    m_ref = tl.where(m_f == float("-inf"), 0.0, m_f)
    acc = tl.zeros([COMBINE_ROWS, BLOCK_D], dtype=tl.float32)
    for p in tl.static_range(N_PARTS):  # each part's output, weighted by its share of the row sum
        m_p = tl.load(m_ws_ptr + p * part_stride + ws_row, mask=row_ok, other=float("-inf"))
        l_p = tl.load(l_ws_ptr + p * part_stride + ws_row, mask=row_ok, other=0.0)
        out_ptrs_p = acc_ws_ptr + (p * part_stride + ws_row)[:, None] * HEAD_DIM + offs_d[None, :]
        out_p = tl.load(out_ptrs_p, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        acc += out_p * (l_p * tl.exp2(m_p - m_ref))[:, None]
    out = acc * (1.0 / tl.maximum(l_f, 1.0))[:, None]  # l_f == 0: no visible key, acc is 0, output 0
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + (head * HEAD_DIM + offs_d)[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


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
def _online_softmax_step(q, k_ptr, v_ptr, key_rows, key_ok, visible, stride_k, stride_v, kv_col, offs_d, d_ok,
                         qk_scale_log2, acc, m_i, l_i, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold one block of keys into the running (acc, row max, row sum); all-masked rows stay at zero. Also
    returns the loaded key block (transposed), for the attention mass."""
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


# bench_kernels.py reads .best_config of the kernel that serves the one-split (many tiles) case.
_scheduled_attention_kernel = _attention_split_kernel
