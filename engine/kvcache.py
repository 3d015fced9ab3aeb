"""The preallocated KV cache of a decode call and the packing of one step's ragged queries into it.

Layout (per layer, token-major): row = slot * slot_len + position, K stored after RoPE. Behind the slots sit
scratch rows: Flash-Verify's verify pass writes its own K/V there so it never disturbs the cache proper.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.model import CachedStep, DiffusionLM
from flash_dllm.kernels.scheduled_attention import build_plan


class KVCache:
    def __init__(self, model: DiffusionLM, n_slots: int, slot_len: int, scratch_per_slot: int = 0):
        cfg = model.config
        self.n_slots, self.slot_len = n_slots, slot_len
        self.scratch_base = n_slots * slot_len
        self.scratch_per_slot = scratch_per_slot
        rows = self.scratch_base + n_slots * scratch_per_slot
        width = cfg.n_kv_heads * cfg.head_dim
        shape = (cfg.n_layers, rows, width)
        self.k = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.v = torch.zeros(shape, dtype=model.dtype, device=model.device)
        self.scores = torch.zeros(rows, dtype=torch.float32, device=model.device)
        self.keep = torch.ones(rows, dtype=torch.int8, device=model.device)

    def row(self, slot: int, position: int) -> int:
        return slot * self.slot_len + position

    def scratch_row(self, slot: int, index: int) -> int:
        return self.scratch_base + slot * self.scratch_per_slot + index


@dataclass
class SeqQuery:
    """One sequence's part of a packed step."""

    state: SequenceState
    positions: list[int]  # sequence positions whose tokens are run (sorted for cache steps)
    tokens: list[int]
    readout: list[int]  # indices into `positions` whose hidden state is needed (logits)
    score_rows: list[int]  # indices into `positions` whose attention mass is accumulated
    scratch: bool = False  # write K/V to the slot's scratch rows (verify pass) instead of the cache
    inq_visible: list[list[bool]] | None = None  # [n, n] visibility among in-query keys (verify pass)
    exclude: list[int] | None = None  # sequence positions whose cache rows the step must not read


def pack(cache: KVCache, queries: list[SeqQuery], block_m: int = 64) -> CachedStep:
    """Pack the sequences' queries into one step (readouts in query order become step.hidden_rows)."""
    device = cache.k.device
    tokens, positions, write_rows, readout_rows, score_rows = [], [], [], [], []
    q_lens, kv_starts, kv_lens, inq_starts = [], [], [], []
    excluded_rows: list[int] = []
    any_inq = any(q.inq_visible is not None for q in queries)
    width = max((len(q.positions) for q in queries if q.inq_visible is not None), default=0)
    inq_mask = torch.zeros((sum(len(q.positions) for q in queries), max(width, 1)), dtype=torch.bool) if any_inq else None
    offset = 0
    for q in queries:
        slot = q.state.index
        tokens += q.tokens
        positions += q.positions
        if q.scratch:
            write_rows += [cache.scratch_row(slot, i) for i in range(len(q.positions))]
        else:
            write_rows += [cache.row(slot, p) for p in q.positions]
        readout_rows += [offset + i for i in q.readout]
        score_rows += [offset + i for i in q.score_rows]
        q_lens.append(len(q.positions))
        kv_starts.append(cache.row(slot, 0))
        kv_lens.append(q.state.total_len)
        inq_starts.append(cache.scratch_row(slot, 0) if q.scratch else 0)
        if q.inq_visible is not None:
            inq_mask[offset: offset + len(q.positions), : len(q.positions)] = torch.tensor(q.inq_visible)
        if q.exclude:
            excluded_rows += [cache.row(slot, p) for p in q.exclude]
        offset += len(q.positions)

    def dev(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)

    keep = None
    if excluded_rows:
        keep = cache.keep.clone()
        keep[dev(excluded_rows)] = 0
    score_query = None
    if score_rows:
        score_query = torch.zeros(offset, dtype=torch.bool)
        score_query[score_rows] = True
        score_query = score_query.to(device, non_blocking=True)
    plan = build_plan(
        q_lens, kv_starts, kv_lens, device, block_m=block_m, kv_keep=keep,
        inq_starts=inq_starts if any_inq else None,
        inq_mask=inq_mask.to(device, non_blocking=True) if inq_mask is not None else None,
        score_query=score_query,
    )
    return CachedStep(
        token_ids=dev(tokens), positions=dev(positions), write_rows=dev(write_rows), plan=plan,
        hidden_rows=dev(readout_rows),
    )
