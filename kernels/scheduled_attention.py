"""Scheduled (block-table) bidirectional flash attention over a packed, ragged batch of query chunks.

Each sequence b owns:
  * queries: packed rows q_start[b] .. q_start[b] + q_len[b] of ``q`` (rows no sequence owns are padding);
  * cache keys: rows kv_start[b] .. kv_start[b] + kv_len[b] of k_cache / v_cache (its slot: prompt + canvas),
    minus any row with kv_keep[row] == 0 when ``kv_keep`` is given (rows that the query replaces);
  * optionally in-query keys: rows inq_start[b] .. inq_start[b] + q_len[b] of the cache (scratch rows that
    hold the K/V of the query tokens themselves, in query order), visible to query i only where
    inq_mask[i, j] is True (Flash-Verify's chain mask between draft and mask views).
No causal mask. Softmax in fp32 with scale 1/sqrt(Dh). GQA: query head h reads KV head h // (Hq // Hkv).

A tile table maps each block_m-row query tile to its sequence, so one launch serves a sequence doing a full
prefill beside one doing a 128-token refresh.

Attention mass (Flash-Cache's tracked-token policy): when ``score_out`` [R] fp32 is given, for every query
row with score_query[row] True (the masked-window rows), every head and every cache key row that the row may
see (first key range only; kv_keep applies), the raw q.k logit (before the 1/sqrt(Dh) scale and the softmax)
is added into score_out[key row]. So score_out[r] = sum over window queries and heads of q . k_r: Flash-dLLM's
official code ranks tracked tokens by this sum (the mean of the stored window logits), and the sum is linear
in the queries, so the kernel adds it while it walks the keys, with no second pass. Callers sum it over layers
and reset it each step. On the GPU the Triton path adds with float atomics, so the low bits of score_out vary
from run to run (the order of additions is not fixed).

Two plan layouts:
  * `build_plan` (ragged, eager): sizes known on the host, sequences packed back to back, host lists kept.
  * `static_plan` (CUDA graphs): every sequence owns the same padded budget of rows_per_seq packed rows; rows
    past its q_len are padding (never read as queries, never written: their output is unspecified). The
    q_len / kv_start / kv_len tensors are the caller's and may be rewritten in place between graph replays.
The kernel reads only plan tensors (never host values), so one captured launch serves every step of a
bucket. `max_kv_len` is a static upper bound on every kv_len of the plan: it chooses how many ways to split
keys (the split ranges are cut from each runtime kv_len, so results never depend on it) and, with attention
mass, how many key chunks the combine scores (keys past it would get no mass: keep the bound true).

Bind once: `ScheduledAttention(backend, n_heads, n_kv_heads, head_dim)` resolves the backend at
construction; its Triton path splits each sequence's keys over several programs when the query tiles alone
would not fill the GPU (batch 1), and caches one schedule and workspace per plan shape (see
_scheduled_attention_launcher.py). The first call of a plan shape must be eager (not under graph capture).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch


@dataclass
class AttentionPlan:
    """Per-step schedule. All tensors int32 on the device of q (masks bool/int8).

    Host lists are optional copies for the torch reference (it reads the tensors when they are absent); the
    Triton path never reads them. A tile covers rows tile_q0 .. tile_q0 + block_m - 1 of one sequence, cut
    at that sequence's q_start + q_len.
    """

    q_start: torch.Tensor  # [B]
    q_len: torch.Tensor  # [B]
    kv_start: torch.Tensor  # [B]
    kv_len: torch.Tensor  # [B]
    tile_seq: torch.Tensor  # [T] sequence of each query tile
    tile_q0: torch.Tensor  # [T] first packed query row of each tile
    block_m: int
    max_kv_len: int  # static upper bound on every kv_len (sizes the key split and the mass chunks)
    host_q_len: list[int] | None = None
    host_kv_len: list[int] | None = None
    host_q_start: list[int] | None = None
    host_kv_start: list[int] | None = None
    kv_keep: torch.Tensor | None = None  # [R] int8/bool, 0 = key row excluded
    inq_start: torch.Tensor | None = None  # [B] cache row of the first in-query key
    inq_mask: torch.Tensor | None = None  # [N, M] bool, M >= max q_len of sequences with in-query keys
    host_inq_start: list[int] | None = None
    score_query: torch.Tensor | None = None  # [N] bool: rows whose attention mass is accumulated

    @property
    def n_tiles(self) -> int:
        return len(self.tile_seq)


def build_plan(
    q_lens: list[int],
    kv_starts: list[int],
    kv_lens: list[int],
    device: torch.device | str,
    block_m: int = 16,
    kv_keep: torch.Tensor | None = None,
    inq_starts: list[int] | None = None,
    inq_mask: torch.Tensor | None = None,
    score_query: torch.Tensor | None = None,
) -> AttentionPlan:
    """Build the block table from sizes the host already knows (no device synchronisation)."""
    q_starts, tile_seq, tile_q0, acc = [], [], [], 0
    for b, n in enumerate(q_lens):
        q_starts.append(acc)
        for t0 in range(0, n, block_m):
            tile_seq.append(b)
            tile_q0.append(acc + t0)
        acc += n

    def dev(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32).to(device, non_blocking=True)

    return AttentionPlan(
        q_start=dev(q_starts),
        q_len=dev(q_lens),
        kv_start=dev(kv_starts),
        kv_len=dev(kv_lens),
        tile_seq=dev(tile_seq),
        tile_q0=dev(tile_q0),
        block_m=block_m,
        max_kv_len=max(kv_lens) if kv_lens else 0,
        host_q_len=list(q_lens),
        host_kv_len=list(kv_lens),
        host_q_start=q_starts,
        host_kv_start=list(kv_starts),
        kv_keep=kv_keep,
        inq_start=dev(inq_starts) if inq_starts is not None else None,
        inq_mask=inq_mask,
        host_inq_start=list(inq_starts) if inq_starts is not None else None,
        score_query=score_query,
    )


def static_plan(
    n_seqs: int,
    rows_per_seq: int,
    block_m: int,
    max_kv_len: int,
    q_len: torch.Tensor,
    kv_start: torch.Tensor,
    kv_len: torch.Tensor,
    device: torch.device | str,
    kv_keep: torch.Tensor | None = None,
    inq_start: torch.Tensor | None = None,
    inq_mask: torch.Tensor | None = None,
    score_query: torch.Tensor | None = None,
) -> AttentionPlan:
    """The fixed layout of a graph-captured step: sequence b owns packed rows [b*rows_per_seq, +q_len[b]).

    q_len / kv_start / kv_len ([n_seqs] int32 on `device`) are used as given, not copied, so the caller can
    rewrite them in place between replays; q_len[b] <= rows_per_seq and kv_len[b] <= max_kv_len are the
    caller's to keep (not checked: that would need the values). The tile table is fixed: tile t belongs to
    sequence t // ceil(rows_per_seq / block_m). Optional tensors as in AttentionPlan, over the
    n_seqs * rows_per_seq packed rows (padding rows' entries are ignored).
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" names the current device, as tensors report it
        device = torch.device("cuda", torch.cuda.current_device())
    for name, t in (("q_len", q_len), ("kv_start", kv_start), ("kv_len", kv_len), ("inq_start", inq_start)):
        if t is not None and (t.shape != (n_seqs,) or t.dtype != torch.int32 or t.device != device):
            raise ValueError(f"static_plan: {name} must be an int32 tensor [{n_seqs}] on {device}, got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    tiles_per_seq = -(-rows_per_seq // block_m)
    tile = torch.arange(n_seqs * tiles_per_seq, dtype=torch.int32)
    tile_seq = tile // tiles_per_seq
    tile_q0 = tile_seq * rows_per_seq + (tile % tiles_per_seq) * block_m
    q_start = torch.arange(n_seqs, dtype=torch.int32) * rows_per_seq
    return AttentionPlan(
        q_start=q_start.to(device), q_len=q_len, kv_start=kv_start, kv_len=kv_len,
        tile_seq=tile_seq.to(device), tile_q0=tile_q0.to(device), block_m=block_m, max_kv_len=max_kv_len,
        kv_keep=kv_keep, inq_start=inq_start, inq_mask=inq_mask, score_query=score_query,
    )


def scheduled_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
    n_heads: int,
    n_kv_heads: int,
    score_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-sequence loop in plain torch, fp32 softmax. q: [N, Hq*Dh]; caches [R, Hkv*Dh]; returns [N, Hq*Dh]."""
    head_dim = q.shape[1] // n_heads
    group = n_heads // n_kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    out = torch.empty_like(q)  # rows no sequence owns (a static plan's padding) stay unwritten
    q_lens, q_starts = _host(plan.host_q_len, plan.q_len), _host(plan.host_q_start, plan.q_start)
    kv_lens, kv_starts = _host(plan.host_kv_len, plan.kv_len), _host(plan.host_kv_start, plan.kv_start)
    inq_starts = _host(plan.host_inq_start, plan.inq_start) if plan.inq_start is not None else plan.host_inq_start
    for b, n in enumerate(q_lens):
        if n == 0:
            continue
        q0, k0, kl = q_starts[b], kv_starts[b], kv_lens[b]
        qb = q[q0 : q0 + n].float().view(n, n_heads, head_dim).transpose(0, 1)  # [H, n, Dh]
        rows = torch.arange(k0, k0 + kl, device=q.device)
        keep = torch.ones(kl, dtype=torch.bool, device=q.device)
        if plan.kv_keep is not None:
            keep = plan.kv_keep[rows].bool()
        key_rows = [rows]
        allowed = [keep[None, :].expand(n, kl)]
        if inq_starts is not None and plan.inq_mask is not None:
            i0 = inq_starts[b]
            key_rows.append(torch.arange(i0, i0 + n, device=q.device))
            allowed.append(plan.inq_mask[q0 : q0 + n, :n].bool())
        rows_all = torch.cat(key_rows)
        mask = torch.cat(allowed, dim=1)  # [n, keys]
        kb = k_cache[rows_all].float().view(-1, n_kv_heads, head_dim).transpose(0, 1)
        vb = v_cache[rows_all].float().view(-1, n_kv_heads, head_dim).transpose(0, 1)
        kb = kb.repeat_interleave(group, dim=0)
        vb = vb.repeat_interleave(group, dim=0)
        logits = torch.matmul(qb, kb.transpose(1, 2)) * scale  # [H, n, keys]
        logits = logits.masked_fill(~mask[None], float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # a query with no visible key outputs zeros
        out[q0 : q0 + n] = torch.matmul(probs, vb).transpose(0, 1).reshape(n, -1).to(q.dtype)
        if score_out is not None and plan.score_query is not None:
            sel = plan.score_query[q0 : q0 + n].bool()
            if bool(sel.any()):
                raw = torch.matmul(qb[:, sel], kb[:, :kl].transpose(1, 2))  # [H, window rows, cache keys], unscaled
                mass = raw.masked_fill(~keep[None, None, :], 0.0).sum(dim=(0, 1))  # over heads and window queries
                score_out.index_add_(0, rows, mass.to(score_out.dtype))
    return out


def _host(values: list[int] | None, tensor: torch.Tensor) -> list[int]:
    return values if values is not None else tensor.tolist()


class ScheduledAttention:
    """Scheduled attention bound once to a backend and a head geometry: op(q, k_cache, v_cache, plan, score_out).

    backend "torch" runs the reference loop; "triton" the split-KV kernels (Triton is imported here, once).
    check_inputs=True validates shapes, dtypes and strides on every call (host metadata only, no device
    synchronisation); off, a call does a dict lookup and its launches. n_splits pins the key-split count and
    n_sms the SM count it is chosen for (tests, benchmarks); by default it is chosen per plan shape.
    """

    def __init__(self, backend: str, n_heads: int, n_kv_heads: int, head_dim: int, check_inputs: bool = False,
                 n_splits: int | None = None, n_sms: int | None = None):
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads {n_heads} must be a multiple of n_kv_heads {n_kv_heads}")
        self.backend, self.n_heads, self.n_kv_heads, self.head_dim = backend, n_heads, n_kv_heads, head_dim
        self.check_inputs = check_inputs
        if backend == "torch":
            self.triton = None
            self._run = self._reference
        elif backend == "triton":
            from ._scheduled_attention_launcher import TritonScheduledAttention  # imports triton

            self.triton = TritonScheduledAttention(n_heads, n_kv_heads, head_dim, n_splits=n_splits, n_sms=n_sms)
            self._run = self.triton
        else:
            raise ValueError(f"unknown kernel backend {backend!r}")

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: AttentionPlan,
                 score_out: torch.Tensor | None = None) -> torch.Tensor:
        if self.check_inputs:
            self._check(q, k_cache, v_cache, plan, score_out)
        return self._run(q, k_cache, v_cache, plan, score_out)

    def key_splits(self, q: torch.Tensor, plan: AttentionPlan, score_out: torch.Tensor | None = None) -> int:
        """How many programs share each (tile, head)'s cache keys for this call (1 on the torch path). Before the
        first call of a feature set on a GPU this assumes WAVES programs per SM; that call may lower it."""
        return self.triton.bucket(q, plan, score_out).n_splits if self.triton else 1

    def _reference(self, q, k_cache, v_cache, plan, score_out):
        return scheduled_attention_reference(q, k_cache, v_cache, plan, self.n_heads, self.n_kv_heads, score_out)

    def _check(self, q, k_cache, v_cache, plan, score_out) -> None:
        width = self.n_kv_heads * self.head_dim
        if q.dim() != 2 or q.shape[1] != self.n_heads * self.head_dim:
            raise ValueError(f"q must be [N, {self.n_heads}*{self.head_dim}], got {tuple(q.shape)}")
        if k_cache.shape[1:] != (width,) or v_cache.shape != k_cache.shape:
            raise ValueError(f"caches must be [R, {self.n_kv_heads}*{self.head_dim}], got "
                             f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
        if q.stride(1) != 1 or k_cache.stride(1) != 1 or v_cache.stride(1) != 1:
            raise ValueError("q and the caches must be contiguous in their last dimension")
        for name in ("q_start", "q_len", "kv_start", "kv_len", "tile_seq", "tile_q0"):
            t = getattr(plan, name)
            if t.dtype != torch.int32 or t.device != q.device:
                raise ValueError(f"plan.{name} must be int32 on {q.device}, got {t.dtype} on {t.device}")
        if score_out is not None and (score_out.dtype != torch.float32 or not score_out.is_contiguous()
                                      or score_out.shape != (k_cache.shape[0],)):
            raise ValueError("score_out must be a contiguous fp32 tensor [R]")


@functools.lru_cache(maxsize=None)
def _shared_op(backend: str, n_heads: int, n_kv_heads: int, head_dim: int) -> ScheduledAttention:
    return ScheduledAttention(backend, n_heads, n_kv_heads, head_dim, check_inputs=True)


def scheduled_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: AttentionPlan,
    n_heads: int,
    n_kv_heads: int,
    score_out: torch.Tensor | None = None,
    backend: str = "torch",
) -> torch.Tensor:
    """Functional form: one checked ScheduledAttention per (backend, geometry), built on first use."""
    return _shared_op(backend, n_heads, n_kv_heads, q.shape[1] // n_heads)(q, k_cache, v_cache, plan, score_out)
