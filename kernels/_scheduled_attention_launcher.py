"""Host side of the Triton scheduled attention: the key-split choice, the per-bucket schedule and workspace.

A bucket is everything about a call that is fixed for a CUDA graph: device, dtype, packed query rows, tiles,
tile height, the plan's static `max_kv_len` and which optional inputs are present. Its first call (eager)
picks the split count, the grids and the workspace; later calls only launch, so a call can be captured in a
CUDA graph and replayed with new plan tensor contents. Nothing here reads plan tensor values. The split count
fills the programs the SMs hold at once, which depends on the config the tuner picks: the first split launch of
each feature set reads its compiled kernel's occupancy and, where it is lower than assumed, makes that
schedule again (see `_first_split_call`).

The workspace (the splits' partials) is two grow-only buffers per device shared by all buckets: the parts'
outputs in the partial dtype and their row statistics in fp32 (stream-ordered launches reuse them; do not run
one op on two streams at once). A buffer that is outgrown stays alive, because a graph captured earlier may
still point into it. The partial dtype is the inputs' for fp16/bf16 (half the bytes of fp32: at batch 1 the
partials of 128 query rows per split weigh about as much as the split's keys) and fp32 for fp32 inputs, or
fp32 always with ``fp32_partials`` (tests, benchmarks).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton

from . import interpreting
from ._occupancy import compiled_programs_per_sm
from ._scheduled_attention_triton import COMBINE_ROWS, LOG2E, _attention_combine_kernel, _attention_split_kernel

# Programs per SM the split count fills at most: two where the tuned config fits twice (Hopper, measured there),
# fewer where the compiled kernel's occupancy says so (an RTX 3090's SM holds one of all but one candidate)
WAVES = 2
MIN_KEYS_PER_SPLIT = 256  # below this a split's fixed cost (q load, partial store, combine) outweighs its keys
INTERPRETER_SMS = 16  # a made-up machine, so the interpreter's default schedule splits small test problems too
MAX_BUCKETS = 256  # ragged eager plans make a new bucket almost every step; old schedules are cheap to rebuild


def choose_splits(n_tiles: int, n_heads: int, max_kv_len: int, n_sms: int, waves: int = WAVES) -> int:
    """Key splits per (tile, head): as many as fit the programs the SMs hold at once (waves per SM), each split
    keeping at least MIN_KEYS_PER_SPLIT of the longest sequence's keys; 1 when the tiles alone fill the machine.
    Rounded down from two splits up: a batch-1 program is mostly a fixed chain of latencies (plan, query tile,
    first keys, partial store), so a few programs past what the SMs hold cost a second round of that chain. But
    between one split and two, rounded to the nearest: one split makes every program walk all the keys, which
    costs more than a partial second round of half-length programs."""
    programs = n_tiles * n_heads
    if programs == 0:
        return 1
    slots = waves * n_sms
    wanted = slots // programs if slots >= 2 * programs else round(slots / programs)
    return max(1, min(wanted, max_kv_len // MIN_KEYS_PER_SPLIT))


class BucketKey(NamedTuple):
    device: torch.device
    dtype: torch.dtype
    n_rows: int
    n_tiles: int
    block_m: int
    max_kv_len: int
    has_keep: bool
    has_inq: bool
    has_score: bool


@dataclass
class Bucket:
    """The fixed schedule of one bucket."""

    n_splits: int
    n_parts: int  # workspace parts: the key splits, plus one for the in-query keys
    split_grid: tuple[int, int, int]
    combine_grid: tuple[int, int, int] | None  # None: one split, the split kernel writes the output
    acc_ws: torch.Tensor | None  # [parts, rows, heads, head_dim] each part's normalised output (partial dtype)
    m_ws: torch.Tensor | None  # [parts, rows, heads] fp32 partial row max (log2 domain)
    l_ws: torch.Tensor | None  # [parts, rows, heads] fp32 partial row sum
    split_meta: dict
    combine_meta: dict
    provisional: bool = False  # split count chosen for WAVES before the tuned config's occupancy was read


class TritonScheduledAttention:
    """Split-KV scheduled attention for one head geometry; call as f(q, k_cache, v_cache, plan, score_out)."""

    def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int, n_splits: int | None = None,
                 n_sms: int | None = None, fp32_partials: bool = False):
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.group = n_heads // n_kv_heads
        self.qk_scale_log2 = LOG2E / math.sqrt(head_dim)
        self.forced_splits = n_splits  # tests and benchmarks pin the split count
        self.n_sms = n_sms
        self.fp32_partials = fp32_partials  # read when a bucket is made
        self._buckets: OrderedDict[BucketKey, Bucket] = OrderedDict()
        self._waves: dict[tuple, int] = {}  # _waves_key -> programs per SM the split count fills (<= WAVES)
        self._workspaces: dict[tuple[torch.device, str, torch.dtype], torch.Tensor] = {}
        self._outgrown: list[torch.Tensor] = []  # kept alive for graphs that captured them

    def bucket(self, q: torch.Tensor, plan, score_out: torch.Tensor | None = None) -> Bucket:
        """The schedule a call with these arguments uses (made on the first call of its bucket)."""
        key = self._bucket_key(q, plan, score_out)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = self._new_bucket(key)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def _bucket_key(self, q, plan, score_out) -> BucketKey:
        return BucketKey(q.device, q.dtype, q.shape[0], plan.tile_seq.shape[0], plan.block_m, plan.max_kv_len,
                         plan.kv_keep is not None, plan.inq_start is not None and plan.inq_mask is not None,
                         score_out is not None and plan.score_query is not None)

    def __call__(self, q, k_cache, v_cache, plan, score_out=None) -> torch.Tensor:
        out = torch.empty_like(q)
        if plan.tile_seq.shape[0] == 0 or q.shape[0] == 0:
            return out
        bucket = self.bucket(q, plan, score_out)
        if bucket.provisional:
            return self._first_split_call(bucket, q, k_cache, v_cache, out, plan, score_out)
        self._launch(bucket, q, k_cache, v_cache, out, plan, score_out)
        return out

    def _launch(self, bucket: Bucket, q, k_cache, v_cache, out, plan, score_out) -> None:
        args, meta = self._split_args(bucket, q, k_cache, v_cache, out, plan, score_out)
        _attention_split_kernel[bucket.split_grid](*args, **meta)
        if bucket.combine_grid:
            _attention_combine_kernel[bucket.combine_grid](
                out, plan.tile_seq, plan.tile_q0, plan.q_start, plan.q_len, plan.kv_start, plan.kv_len,
                bucket.acc_ws, bucket.m_ws, bucket.l_ws, out.stride(0), plan.block_m, q.shape[0],
                **bucket.combine_meta,
            )

    def _split_args(self, bucket: Bucket, q, k_cache, v_cache, out, plan, score_out) -> tuple[tuple, dict]:
        meta = bucket.split_meta
        has_inq, has_score = meta["HAS_INQ"], meta["HAS_SCORE"]
        keep = _as_flags(plan.kv_keep) if meta["HAS_KEEP"] else q
        inq_mask = _as_flags(plan.inq_mask) if has_inq else q
        if has_inq and inq_mask.stride(1) != 1:
            inq_mask = inq_mask.contiguous()
        score_query = _as_flags(plan.score_query) if has_score else q
        scores = score_out if has_score else q
        workspace = (bucket.acc_ws, bucket.m_ws, bucket.l_ws) if bucket.combine_grid else (q, q, q)
        args = (q, k_cache, v_cache, out,
                plan.tile_seq, plan.tile_q0, plan.q_start, plan.q_len, plan.kv_start, plan.kv_len,
                keep, plan.inq_start if has_inq else q, inq_mask, score_query, scores, *workspace,
                q.stride(0), k_cache.stride(0), v_cache.stride(0), out.stride(0), inq_mask.stride(0),
                plan.block_m, self.group, bucket.n_splits, q.shape[0], self.qk_scale_log2)
        return args, meta

    def _first_split_call(self, bucket: Bucket, q, k_cache, v_cache, out, plan, score_out) -> torch.Tensor:
        """The first call of a split schedule whose kernel config's occupancy is not known yet: launch it (which
        tunes the config), read how many of its programs an SM holds, and if fewer than WAVES, make the schedule
        again for that many and launch that instead (the attention mass is put back first: the kernel adds to
        it). Later buckets of the same features are made with the known number at once."""
        scores_before = score_out.clone() if bucket.split_meta["HAS_SCORE"] else None
        self._launch(bucket, q, k_cache, v_cache, out, plan, score_out)
        args, meta = self._split_args(bucket, q, k_cache, v_cache, out, plan, score_out)
        held = split_programs_per_sm(args, bucket.split_grid, meta, q.device)
        key = self._bucket_key(q, plan, score_out)
        self._waves[_waves_key(key)] = min(WAVES, held or WAVES)
        settled = self._buckets[key] = self._new_bucket(key)
        if settled.n_splits != bucket.n_splits:
            if scores_before is not None:
                score_out.copy_(scores_before)
            self._launch(settled, q, k_cache, v_cache, out, plan, score_out)
        return out

    def _new_bucket(self, key: BucketKey) -> Bucket:
        if key.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("scheduled attention: the first call of a plan shape must run eagerly, before CUDA "
                               f"graph capture (it sizes the workspace); new shape {key}")
        provisional = False
        if self.forced_splits is not None:
            n_splits = self.forced_splits
        else:
            n_sms = self.n_sms or _sm_count(key.device)
            waves = self._waves.get(_waves_key(key))
            n_splits = choose_splits(key.n_tiles, self.n_heads, key.max_kv_len, n_sms, waves or WAVES)
            # the split kernel's occupancy is read on its first launch; a one-split schedule would stay one
            provisional = waves is None and n_splits > 1
        one_pass = n_splits == 1
        block_d, block_m = max(16, triton.next_power_of_2(self.head_dim)), max(16, triton.next_power_of_2(key.block_m))
        split_meta = {
            "HEAD_DIM": self.head_dim, "BLOCK_D": block_d,
            "BLOCK_M": block_m,  # covers the plan's tile; tl.dot needs >= 16 rows
            "HAS_KEEP": key.has_keep, "HAS_INQ": key.has_inq, "HAS_SCORE": key.has_score, "ONE_PASS": one_pass,
            "UPCAST": interpreting(), "DOT_PRECISION": "ieee" if key.dtype == torch.float32 else "tf32",
        }
        if one_pass:
            return Bucket(1, 1, (key.n_tiles, self.n_heads, 1), None, None, None, None, split_meta, {}, provisional)
        n_parts = n_splits + key.has_inq
        combine_meta = {"HEAD_DIM": self.head_dim, "BLOCK_D": block_d, "BLOCK_M": block_m, "N_PARTS": n_parts}
        n_row_heads = n_parts * key.n_rows * self.n_heads
        half = key.dtype in (torch.float16, torch.bfloat16) and not self.fp32_partials
        partial = key.dtype if half else torch.float32
        acc_ws = self._workspace(key.device, "outputs", partial, n_row_heads * self.head_dim)
        stats = self._workspace(key.device, "stats", torch.float32, 2 * n_row_heads)
        m_ws, l_ws = stats[:n_row_heads], stats[n_row_heads:]
        combine_grid = (key.n_tiles, self.n_heads, block_m // COMBINE_ROWS.value)
        return Bucket(n_splits, n_parts, (key.n_tiles, self.n_heads, n_parts), combine_grid, acc_ws, m_ws, l_ws,
                      split_meta, combine_meta, provisional)

    def _workspace(self, device: torch.device, role: str, dtype: torch.dtype, need: int) -> torch.Tensor:
        """The first ``need`` elements of the device's shared buffer for ``role`` ("outputs" or "stats") in this
        dtype, grown (never shrunk) to fit."""
        key = (device, role, dtype)
        buffer = self._workspaces.get(key)
        if buffer is None or buffer.numel() < need:
            if buffer is not None:
                self._outgrown.append(buffer)
            buffer = self._workspaces[key] = torch.empty(need, dtype=dtype, device=device)
        return buffer[:need]


def _waves_key(key: BucketKey) -> tuple:
    """What the split kernel's tuned config depends on (its autotune key and the arguments' dtype), per device."""
    return key.device, key.dtype, key.block_m, key.has_keep, key.has_inq, key.has_score


def split_programs_per_sm(args: tuple, grid: tuple, meta: dict, device: torch.device) -> int | None:
    """Programs of the split kernel's tuned config (the one its last launch used) that one SM holds at once;
    None in the interpreter or when Triton cannot say."""
    if interpreting() or device.type != "cuda":
        return None
    try:
        config = _attention_split_kernel.best_config
        compiled = _attention_split_kernel.fn.warmup(*args, grid=grid, **meta, **config.all_kwargs())
        return compiled_programs_per_sm(compiled, device)
    except Exception:  # an internal Triton API changed: keep WAVES, as before occupancy was read
        return None


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def _as_flags(t: torch.Tensor) -> torch.Tensor:
    """bool/int8 masks as a byte view (Triton loads bytes; nonzero = True)."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t
