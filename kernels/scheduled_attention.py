"""Scheduled (block-table) bidirectional flash attention over a packed, ragged batch of query chunks.

Each sequence b owns:
  * queries: packed rows q_start[b] .. q_start[b] + q_len[b] of ``q`` (no padding between sequences);
  * cache keys: rows kv_start[b] .. kv_start[b] + kv_len[b] of k_cache / v_cache (its slot: prompt + canvas),
    minus any row with kv_keep[row] == 0 when ``kv_keep`` is given (rows that the query replaces);
  * optionally in-query keys: rows inq_start[b] .. inq_start[b] + q_len[b] of the cache (scratch rows that
    hold the K/V of the query tokens themselves, in query order), visible to query i only where
    inq_mask[i, j] is True (Flash-Verify's chain mask between draft and mask views).
No causal mask. Softmax in fp32 with scale 1/sqrt(Dh). GQA: query head h reads KV head h // (Hq // Hkv).

A tile table built once per step maps each BLOCK_M-row query tile to its sequence, so one launch serves a
sequence doing a full prefill beside one doing a 128-token refresh.

Attention mass (Flash-Cache's tracked-token policy): when ``score_out`` [R] fp32 is given, for every query
row with score_query[row] True (the masked-window rows) and every head, the *softmax probability* that the
query assigns to each cache key row (first key range only, after normalisation over all of its keys,
in-query keys included) is added into score_out[row]. So score_out[r] = sum over window queries and heads of
p(query -> key r). Callers sum it over layers and reset it each step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class AttentionPlan:
    """Per-step schedule. All tensors int32 on the device of q; host lists kept for the torch path."""

    q_start: torch.Tensor  # [B]
    q_len: torch.Tensor  # [B]
    kv_start: torch.Tensor  # [B]
    kv_len: torch.Tensor  # [B]
    tile_seq: torch.Tensor  # [T] sequence of each query tile
    tile_q0: torch.Tensor  # [T] first packed query row of each tile
    block_m: int
    max_kv_len: int
    host_q_len: list[int]
    host_kv_len: list[int]
    host_q_start: list[int]
    host_kv_start: list[int]
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
    out = torch.empty_like(q)
    for b, n in enumerate(plan.host_q_len):
        if n == 0:
            continue
        q0, k0, kl = plan.host_q_start[b], plan.host_kv_start[b], plan.host_kv_len[b]
        qb = q[q0 : q0 + n].float().view(n, n_heads, head_dim).transpose(0, 1)  # [H, n, Dh]
        rows = torch.arange(k0, k0 + kl, device=q.device)
        keep = torch.ones(kl, dtype=torch.bool, device=q.device)
        if plan.kv_keep is not None:
            keep = plan.kv_keep[rows].bool()
        key_rows = [rows]
        allowed = [keep[None, :].expand(n, kl)]
        if plan.host_inq_start is not None and plan.inq_mask is not None:
            i0 = plan.host_inq_start[b]
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
                mass = probs[:, sel, :kl].sum(dim=(0, 1))  # over heads and window queries
                score_out.index_add_(0, rows, mass.to(score_out.dtype))
    return out


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
    """Dispatcher: "torch" runs the reference loop, "triton" the one-launch kernel."""
    if backend == "torch":
        return scheduled_attention_reference(q, k_cache, v_cache, plan, n_heads, n_kv_heads, score_out)
    if backend == "triton":
        from ._scheduled_attention_triton import scheduled_attention_triton  # triton imported on first use

        return scheduled_attention_triton(q, k_cache, v_cache, plan, n_heads, n_kv_heads, score_out)
    raise ValueError(f"unknown kernel backend {backend!r}")
