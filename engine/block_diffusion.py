"""Block diffusion decoding (LLaDA2) on the device: committed blocks are cached once, the current block is denoised.

A block-diffusion model (``ModelConfig.block_size`` = B) attends causally across blocks of B absolute positions
and bidirectionally inside one (engine/model.py:attention_mask). So the K/V of a block never change once its
tokens are final, and a step only has to run the block being denoised against the cached earlier blocks.
The host reference (engine/block_diffusion_reference.py) states the rules plainly; this is the same, as tensor
operations with static shapes (one captured CUDA graph for every steady step).

The sampler's rules (LLaDA2's published `generate`, re-derived):
  * blocks are aligned to absolute positions from the prompt's first token, so the first block to denoise is
    block P // B, which holds the prompt's tail (P = prompt length) and the first answer cells;
  * each step commits, among the block's masked cells, every prediction whose probability is above the
    threshold (strictly), or, when fewer than the step's quota are, the quota's most confident ones; the quotas
    split B evenly over the block's steps (remainder first), the step counter restarting with every block;
  * the answer ends at its first end token (the canvas's rule, engine/device_canvas.py).
Differences, on purpose: the canvas stops at prompt + answer length (LLaDA2 rounds its canvas up to a whole
block and drops the extra cells afterwards), and cells after a committed end token are EOS padding at once.

What a step runs, per slot (rows of its packed query, cut into *entries* of B rows, one per block, each an
attention "sequence" whose keys end at its own block's end, which is the block-causal mask):
  * its first step: the whole prompt and the first block, positions [0, block end): one forward prefills the
    cache exactly, block by block, and predicts the first block;
  * a steady step: rows [0, B) for the previous block, rows [B, 2B) for the current block. The previous block
    is in the query only on the step after it completed: its cached K/V were written before its last commit,
    so they are rewritten once from its final tokens, and never again. Otherwise those rows are padding.
Keys never reach past the current block's end, so the cache rows of later blocks are never read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flash_dllm.engine.device_canvas import DeviceCanvas
from flash_dllm.engine.device_plan import DeviceMethod, ensure_progress, first_cells, top_k_select
from flash_dllm.engine.device_verify import Verifier, VerifyLayout
from flash_dllm.engine.model import CachedStep
from flash_dllm.engine.packing import ATTENTION_BLOCK_M, KVCache, Layout, Packer, QueryPlan
from flash_dllm.engine.sampling import Predictions
from flash_dllm.engine.settings import SettingsError, model_refusal
from flash_dllm.engine.strategies import split_evenly
from flash_dllm.kernels.scheduled_attention import AttentionPlan


def llada2_quota(confidences: torch.Tensor, cells: torch.Tensor, threshold: torch.Tensor,
                 scheduled: torch.Tensor) -> torch.Tensor:
    """[S] how many of the candidates to commit: those strictly above the threshold, or the step's scheduled
    quota when fewer are (the most confident ones are taken, so the count says it all)."""
    above = ((confidences > threshold[:, None]) & (cells >= 0)).sum(1)
    return torch.maximum(above, scheduled)


class BlockDiffusion(DeviceMethod):
    """The device side of `block-diffusion` (see the module docstring)."""

    def __init__(self, canvas: DeviceCanvas, block_size: int, steps_per_block: int, shift: bool):
        if shift:
            raise SettingsError("block-diffusion needs a model that predicts each cell in place (LLaDA2), "
                                "not one whose logits are shifted by one position (Dream)")
        self.block_size, self.steps_per_block = block_size, steps_per_block
        self.readout = block_size
        self.steady_rows = 2 * block_size
        n, device = canvas.n_slots, canvas.tokens.device
        self.schedule = torch.tensor(split_evenly(block_size, steps_per_block), dtype=torch.int64, device=device)
        self.block = torch.zeros(n, dtype=torch.int64, device=device)  # absolute index of the current block
        self.step_in_block = torch.zeros(n, dtype=torch.int64, device=device)
        self.stale = torch.zeros(n, dtype=torch.bool, device=device)  # the previous block's cache needs its final K/V
        self.reset(canvas)

    # ---- per-sequence schedule -----------------------------------------------------------------------
    def _first_masked_block(self, canvas: DeviceCanvas) -> tuple[torch.Tensor, torch.Tensor]:
        """[S] the block of each slot's first masked cell, and whether it has one."""
        masked = canvas.masked()
        any_masked = masked.any(1)
        first = torch.where(masked, canvas.cells(), canvas.width).amin(1)
        return torch.div(canvas.prompt_len + first, self.block_size, rounding_mode="floor"), any_masked

    def reset(self, canvas: DeviceCanvas) -> None:
        self.block.copy_(torch.div(canvas.prompt_len, self.block_size, rounding_mode="floor"))
        self.step_in_block.zero_()
        self.stale.zero_()

    def reset_slot(self, canvas: DeviceCanvas, slot: int) -> None:
        self.block[slot].copy_(torch.div(canvas.prompt_len[slot], self.block_size, rounding_mode="floor"))
        self.step_in_block[slot] = 0
        self.stale[slot] = False

    def block_end(self, canvas: DeviceCanvas) -> torch.Tensor:
        """[S] one past the current block's last position (the canvas stops at prompt + answer)."""
        return torch.minimum((self.block + 1) * self.block_size, canvas.total_len())

    def end_step(self, canvas: DeviceCanvas) -> None:
        block, has_mask = self._first_masked_block(canvas)
        moved = has_mask & (block != self.block) & canvas.active
        self.step_in_block.add_(canvas.active.long()).masked_fill_(moved, 0)
        self.stale.copy_(moved)
        self.block.copy_(torch.where(moved, block, self.block))

    # ---- the step ------------------------------------------------------------------------------------
    def query_range(self, canvas: DeviceCanvas) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per slot: the position of its first query row (row_base), the first position it recomputes and
        one past the last. A first step recomputes the whole prefix; a steady step the current block, and
        the previous one right after it completed."""
        B = self.block_size
        start = self.block * B
        first_step = canvas.steps == 0
        row_base = torch.where(first_step, 0, (self.block - 1).clamp(min=0) * B)
        q_from = torch.where(first_step, 0, torch.where(self.stale, start - B, start).clamp(min=0))
        return row_base, q_from, self.block_end(canvas)

    def plan(self, canvas: DeviceCanvas) -> QueryPlan:
        position = canvas.positions
        _, q_from, q_end = self.query_range(canvas)
        in_query = (position >= q_from[:, None]) & (position < q_end[:, None]) & canvas.active[:, None]
        start = self.block[:, None] * self.block_size - canvas.prompt_len[:, None]
        in_block = (canvas.cells() >= start) & (canvas.cells() < start + self.block_size)
        return QueryPlan(in_query=in_query, cells=first_cells(canvas.masked() & in_block, self.block_size))

    def select(self, canvas: DeviceCanvas, plan: QueryPlan, preds: Predictions) -> torch.Tensor:
        confidences = preds.confidences.view(plan.cells.shape)
        scheduled = self.schedule[self.step_in_block.clamp(max=self.steps_per_block - 1)]
        quota = llada2_quota(confidences, plan.cells, canvas.threshold, scheduled)
        # a step whose chosen cells all predict [MASK] would repeat forever (greedy): commit the best real token
        return ensure_progress(plan.cells, preds, top_k_select(plan.cells, confidences, quota), canvas.mask_id)

    def bind_session(self, session) -> None:
        """Called by DecodeSession: its packer lays out this method's block entries; a verifier hides the keys
        past the current block (they are not part of the prefix the block sees)."""
        session.packer = BlockPacker(session.cache, session.canvas, self)
        if session.verifier is not None:
            old = session.verifier
            session.verifier = BlockVerifier(VerifyLayout(session.packer, self.readout, old.cap, False), old.rule,
                                             self)


@dataclass
class EntryTables:
    """A layout's constant entry tables: entry e covers B packed rows of one place (slot) of the layout."""

    place: torch.Tensor  # [E] place in the layout of each entry's slot
    first_row: torch.Tensor  # [E] the entry's first row counted from its slot's first row (e * B)
    q_start: torch.Tensor  # [E] int32 packed row of the entry's first row
    tile_seq: torch.Tensor  # [T] int32
    tile_q0: torch.Tensor  # [T] int32
    row_place: torch.Tensor  # [N] place of each packed row
    row_local: torch.Tensor  # [N] row counted from its slot's first row
    readout_offset: torch.Tensor  # [n, 1] first packed row of each place


def entry_tables(layout: Layout, block: int, device) -> EntryTables:
    place, first_row, q_start, tile_seq, tile_q0, row_place, row_local = [], [], [], [], [], [], []
    for i, (offset, budget) in enumerate(zip(layout.offsets, layout.budgets)):
        row_place += [i] * budget
        row_local += list(range(budget))
        for e0 in range(0, budget, block):
            tile_rows = min(block, budget - e0)
            for t0 in range(0, tile_rows, ATTENTION_BLOCK_M):
                tile_seq.append(len(place))
                tile_q0.append(offset + e0 + t0)
            place.append(i)
            first_row.append(e0)
            q_start.append(offset + e0)

    def ints(values, dtype=torch.int64):
        return torch.tensor(values, dtype=dtype, device=device)

    return EntryTables(place=ints(place), first_row=ints(first_row), q_start=ints(q_start, torch.int32),
                       tile_seq=ints(tile_seq, torch.int32), tile_q0=ints(tile_q0, torch.int32),
                       row_place=ints(row_place), row_local=ints(row_local),
                       readout_offset=ints(layout.offsets)[:, None])


class BlockPacker(Packer):
    """Packs a block-diffusion step: each slot's rows hold consecutive positions from its row base, cut into
    entries of B rows whose keys end at their own block's end (capped at the current block's end)."""

    def __init__(self, cache: KVCache, canvas: DeviceCanvas, method: BlockDiffusion):
        super().__init__(cache, canvas, shift=False)
        self.method = method
        self._entries: dict[Layout, EntryTables] = {}

    def entries(self, layout: Layout) -> EntryTables:
        if layout not in self._entries:
            self._entries[layout] = entry_tables(layout, self.method.block_size, self.canvas.answer.device)
        return self._entries[layout]

    def pack(self, plan: QueryPlan, layout: Layout, mask_prompt: bool = False) -> CachedStep:
        if mask_prompt:
            raise SettingsError("block-diffusion has no classifier-free guidance")
        canvas, cache, method = self.canvas, self.cache, self.method
        B, L, trash = method.block_size, cache.slot_len, cache.trash_row
        slots = self.tensors(layout).index  # rewritten in place for a dynamic layout (Packer.assign)
        et = self.entries(layout)
        row_base, q_from, q_end = (t.index_select(0, slots) for t in method.query_range(canvas))
        active = canvas.active.index_select(0, slots)
        # rows: position = the slot's row base + the row's place in the slot
        place = et.row_place
        position = row_base[place] + et.row_local
        valid = active[place] & (position >= q_from[place]) & (position < q_end[place])
        slot_of_row = slots[place]
        safe = position.clamp(0, L - 1)
        token_ids = torch.where(valid, canvas.tokens[slot_of_row, safe], canvas.mask_id)
        write_rows = torch.where(valid, cache.row_base[slot_of_row] + safe, trash)
        # entries: a block's rows see the keys of every position before its own block's end
        e_place = et.place
        e_first = row_base[e_place] + et.first_row
        e_end = torch.minimum(e_first + B, q_end[e_place])
        q_len = (e_end - torch.maximum(e_first, q_from[e_place])).clamp(0, B) * active[e_place]
        attention = AttentionPlan(
            q_start=et.q_start, q_len=q_len.to(torch.int32), kv_start=cache.row_base[slots[e_place]].to(torch.int32),
            kv_len=e_end.clamp(min=0).to(torch.int32), tile_seq=et.tile_seq, tile_q0=et.tile_q0,
            block_m=ATTENTION_BLOCK_M, max_kv_len=L)
        # read-out rows, [place][candidate j]: cell c of slot s is position P_s + c
        cells = plan.cells.index_select(0, slots)
        cell_pos = canvas.prompt_len.index_select(0, slots)[:, None] + cells
        readable = (cells >= 0) & active[:, None] & (cell_pos >= q_from[:, None]) & (cell_pos < q_end[:, None])
        hidden_rows = torch.where(readable, et.readout_offset + cell_pos - row_base[:, None], et.readout_offset)
        return CachedStep(token_ids=token_ids, positions=torch.where(valid, position, 0), write_rows=write_rows,
                          plan=attention, hidden_rows=hidden_rows.reshape(-1))


class BlockVerifier(Verifier):
    """Flash-Verify inside the block: the verify pass sees the prefix up to the current block's end only.
    The rows past it (later blocks: never written, or stale from an earlier call) are hidden for the pass."""

    def __init__(self, layout: VerifyLayout, rule: str, method: BlockDiffusion):
        super().__init__(layout, rule)
        self.method = method

    def after_commit(self, session, cells, preds, committed) -> dict:
        canvas, cache = session.canvas, session.cache
        position = torch.arange(canvas.slot_len, device=cells.device)[None, :]
        past = (position >= self.method.block_end(canvas)[:, None]) & (position < canvas.total_len()[:, None])
        past &= canvas.active[:, None]  # a finished slot's old rows may belong to another sequence now
        rows = torch.where(past, cache.row_base[:, None] + position, cache.trash_row).reshape(-1)
        cache.keep.index_fill_(0, rows, 0)
        try:
            return super().after_commit(session, cells, preds, committed)
        finally:
            cache.keep.index_fill_(0, rows, 1)


def check_model_and_method(config, method: DeviceMethod) -> None:
    """Refuse a decode session whose method does not match the model's attention (see settings.model_refusal)."""
    block = method.block_size if isinstance(method, BlockDiffusion) else None
    message = model_refusal(block is not None, block, config.block_size)
    if message:
        raise SettingsError(message)


def benchmark_config(config, method: str, block: int):
    """The config one benchmark cell times. A block method on a model without a block size times the same
    weights under a block-causal mask of `block` positions (random or foreign weights: only time is measured,
    and a step costs the same whatever mask the weights were trained with); any other cell, the model as is."""
    from dataclasses import replace

    from flash_dllm.engine.settings import BLOCK_METHODS

    if method in BLOCK_METHODS and not config.block_size:
        return replace(config, block_size=block)
    return config
