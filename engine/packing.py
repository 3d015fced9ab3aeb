"""The KV cache of a decode call, and the packing of a step's queries into one ragged forward.

Cache layout (per layer, token-major, K stored after RoPE): each slot's scratch rows (Flash-Verify's verify pass
writes its own K/V there, never into the cache proper), one trash row that padding query rows write to, then the
pool of the slots' positions (KVCache.row_base).

A forward covers some slots; slot i of it owns packed query rows [offset_i, offset_i + budget_i) (its *layout*,
known on the host). What the rows hold is decided on the device: a QueryPlan marks the positions each slot
recomputes, and `pack` writes them in ascending order into the slot's rows; rows past a slot's count are
padding (they read position 0 and write the trash row, and no valid row ever sees them). Every tensor `pack`
builds has a shape fixed by the layout, so the same step can be replayed as a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flash_dllm.engine.device_canvas import DeviceCanvas
from flash_dllm.engine.model import CachedStep, DiffusionLM
from flash_dllm.kernels.pack_queries import PackConstants, PackQueries
from flash_dllm.kernels.scheduled_attention import AttentionPlan

ATTENTION_BLOCK_M = 64  # query rows per attention tile, unless attention_tile_rows picks taller ones
WIDE_TILE_ROWS, WIDE_TILE_MIN_SLOTS = 128, 8


class KVCache:
    """Per layer [rows, Hkv*Dh] K and V. Rows: each slot's scratch rows, one trash row, then the pool that holds
    the slots' positions: slot s's position p lives in row row_base[s] + p. A fixed batch gives slot s the range
    s * slot_len; the scheduler hands out ranges as sequences come and go (and grows the pool)."""

    def __init__(self, model: DiffusionLM, n_slots: int, slot_len: int, scratch_per_slot: int = 0,
                 pool_rows: int | None = None):
        cfg = model.config
        self.n_slots, self.slot_len = n_slots, slot_len
        self.scratch_base, self.scratch_per_slot = 0, scratch_per_slot
        self.trash_row = n_slots * scratch_per_slot
        self.pool_start = self.trash_row + 1
        self.width, self.n_layers = cfg.n_kv_heads * cfg.head_dim, cfg.n_layers
        self.dtype, self.device = model.dtype, model.device
        self.row_base = self.pool_start + torch.arange(n_slots, device=model.device) * slot_len
        self._allocate(self.pool_start + (n_slots * slot_len if pool_rows is None else pool_rows))

    def _allocate(self, rows: int) -> None:
        shape = (self.n_layers, rows, self.width)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.scores = torch.zeros(rows, dtype=torch.float32, device=self.device)
        self.keep = torch.ones(rows, dtype=torch.int8, device=self.device)

    @property
    def pool_rows(self) -> int:
        return self.k.shape[1] - self.pool_start

    def grow(self, pool_rows: int) -> None:
        """A larger pool with the old rows copied over (new tensors: captured graphs must be captured again)."""
        old_k, old_v, rows = self.k, self.v, self.k.shape[1]
        self._allocate(self.pool_start + pool_rows)
        self.k[:, :rows].copy_(old_k)
        self.v[:, :rows].copy_(old_v)

    def slot_scores(self) -> torch.Tensor:
        """[S, L] attention mass of each slot's positions."""
        rows = self.row_base[:, None] + torch.arange(self.slot_len, device=self.scores.device)[None, :]
        return self.scores[rows.clamp(max=self.scores.shape[0] - 1)]


@dataclass
class QueryPlan:
    """What one forward of a step computes, per slot (device tensors)."""

    in_query: torch.Tensor  # [S, L] bool: positions recomputed (their K/V rewritten in the cache)
    cells: torch.Tensor  # [S, R] int64 candidate cells in the method's order, -1 for none: logits are read there
    scored: torch.Tensor | None = None  # [S, L] bool: rows whose attention mass is accumulated (Flash-Cache)


@dataclass(frozen=True)
class Layout:
    """Host-side geometry of one forward: which slots, and each one's packed query rows. A dynamic layout
    has placeholder slots: which slots fill its places is rewritten in place before each use
    (Packer.assign), so one captured graph serves any set of that many slots."""

    slots: tuple[int, ...]
    budgets: tuple[int, ...]
    dynamic: bool = False

    @property
    def offsets(self) -> list[int]:
        out, acc = [], 0
        for budget in self.budgets:
            out.append(acc)
            acc += budget
        return out

    @property
    def rows(self) -> int:
        return sum(self.budgets)

    @classmethod
    def uniform(cls, n_slots: int, budget: int, dynamic: bool = False) -> "Layout":
        return cls(tuple(range(n_slots)), (budget,) * n_slots, dynamic)


def groups_for(budgets: list[int], max_rows: int, slots: list[int] | None = None) -> list[Layout]:
    """Cut slots (default 0..n-1) into forwards of at most max_rows packed rows (a larger slot gets its own)."""
    slots = list(range(len(budgets))) if slots is None else slots
    groups, members, sizes = [], [], []
    for slot, budget in zip(slots, budgets):
        if members and sum(sizes) + budget > max_rows:
            groups.append(Layout(tuple(members), tuple(sizes)))
            members, sizes = [], []
        members.append(slot)
        sizes.append(budget)
    if members:
        groups.append(Layout(tuple(members), tuple(sizes)))
    return groups


@dataclass
class LayoutTensors:
    """A layout's constant device tensors, built once (never inside a CUDA-graph capture)."""

    index: torch.Tensor  # [n] slots
    offsets: torch.Tensor  # [n, 1]
    budgets: torch.Tensor  # [n, 1]
    q_start: torch.Tensor  # [n] int32
    tile_seq: torch.Tensor  # [T] int32
    tile_q0: torch.Tensor  # [T] int32
    all_slots: bool
    block_m: int  # query rows per attention tile


def attention_tile_rows(layout: Layout) -> int:
    """Query rows per attention tile in a forward of this layout, decided once per layout.

    Few sequences give few tiles, so the kernel splits each sequence's keys across programs to fill the GPU, and
    short tiles keep that split cheap. Once many sequences each fill a wide tile, there are programs enough without
    splitting, and a taller tile (8 warps) reads each key block once for twice the queries. Budgets under a wide
    tile (Flash-Verify's verify pass, block steps) would only pad it."""
    wide = len(layout.budgets) >= WIDE_TILE_MIN_SLOTS and min(layout.budgets) >= WIDE_TILE_ROWS
    return WIDE_TILE_ROWS if wide else ATTENTION_BLOCK_M


def layout_tensors(layout: Layout, n_slots: int, device) -> LayoutTensors:
    block_m = attention_tile_rows(layout)
    tile_seq, tile_q0 = [], []
    for i, (offset, budget) in enumerate(zip(layout.offsets, layout.budgets)):
        for t0 in range(0, budget, block_m):
            tile_seq.append(i)
            tile_q0.append(offset + t0)
    i32 = dict(dtype=torch.int32, device=device)
    return LayoutTensors(
        index=torch.tensor(layout.slots, device=device),
        offsets=torch.tensor(layout.offsets, device=device)[:, None],
        budgets=torch.tensor(layout.budgets, device=device)[:, None],
        q_start=torch.tensor(layout.offsets, **i32), tile_seq=torch.tensor(tile_seq, **i32),
        tile_q0=torch.tensor(tile_q0, **i32), all_slots=not layout.dynamic and layout.slots == tuple(range(n_slots)),
        block_m=block_m)


def attention_plan(lt: LayoutTensors, q_len: torch.Tensor, kv_start: torch.Tensor, kv_len: torch.Tensor,
                   max_kv_len: int, kv_keep=None, inq_start=None, inq_mask=None, score_query=None) -> AttentionPlan:
    """The scheduled-attention plan of a layout: its fixed tile table, per-slot lengths as device tensors."""
    return AttentionPlan(
        q_start=lt.q_start, q_len=q_len.to(torch.int32), kv_start=kv_start.to(torch.int32),
        kv_len=kv_len.to(torch.int32), tile_seq=lt.tile_seq, tile_q0=lt.tile_q0, block_m=lt.block_m,
        max_kv_len=max_kv_len, host_q_len=None, host_kv_len=None, host_q_start=None, host_kv_start=None,
        kv_keep=kv_keep, inq_start=inq_start.to(torch.int32) if inq_start is not None else None, inq_mask=inq_mask,
        host_inq_start=None, score_query=score_query)


class Packer:
    """Packs QueryPlans of one decode call into forwards; keeps each layout's constant tensors."""

    def __init__(self, cache: KVCache, canvas: DeviceCanvas, shift: bool):
        self.cache, self.canvas, self.shift = cache, canvas, shift
        # what a packed row holds where no position lands: [MASK], position 0, K/V written to the trash row
        self.constants = PackConstants(mask_id=canvas.mask_id, trash_row=cache.trash_row, shift=shift)
        self.pack_queries = PackQueries("torch")
        self._layouts: dict[Layout, LayoutTensors] = {}
        self._assigned: dict[Layout, list[int]] = {}

    def use_kernels(self, backend: str) -> None:
        """Pack with the Triton kernel ("triton") or its tensor-operation reference ("torch")."""
        if backend != self.pack_queries.backend:
            self.pack_queries = PackQueries(backend)

    def assign(self, layout: Layout, slots: list[int]) -> None:
        """Fill a dynamic layout's places with these slots (in place, ordered on the stream before the step).
        The copy waits for the steps in flight, so it is made only when the set of slots changed."""
        if self._assigned.get(layout) != slots:
            self.tensors(layout).index.copy_(torch.tensor(slots, dtype=torch.int64))
            self._assigned[layout] = list(slots)

    def tensors(self, layout: Layout) -> LayoutTensors:
        if layout not in self._layouts:
            self._layouts[layout] = layout_tensors(layout, self.canvas.n_slots, self.canvas.answer.device)
        return self._layouts[layout]

    def pack(self, plan: QueryPlan, layout: Layout, mask_prompt: bool = False) -> CachedStep:
        """The packed forward of `layout`'s slots (see the module docstring; kernels/pack_queries.py does it, in
        one launch on a GPU). Readout rows come in the order [slot of the layout][candidate j], one per
        plan.cells entry (rows of absent cells are junk)."""
        canvas, cache, lt = self.canvas, self.cache, self.tensors(layout)
        packed = self.pack_queries(plan.in_query, canvas.tokens, canvas.prompt_len, cache.row_base,
                                   canvas.total_len(), plan.cells, plan.scored, None if lt.all_slots else lt.index,
                                   lt.offsets.view(-1), lt.budgets.view(-1), layout.rows, self.constants, mask_prompt)
        attention = attention_plan(lt, packed.q_len, packed.kv_start, packed.kv_len, cache.slot_len,
                                   score_query=packed.score_query)
        return CachedStep(token_ids=packed.token_ids, positions=packed.positions, write_rows=packed.write_rows,
                          plan=attention, hidden_rows=packed.hidden_rows)
