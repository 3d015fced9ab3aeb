"""The semi-autoregressive block schedule on the device (engine/strategies.py:BlockStrategy) and Fast-dLLM's plan
of a step over it (engine/refresh.py:FastDllmPolicy).

Contract (shared by the references and the Triton kernels; S sequences, G answer cells, L positions per slot):
    answer       [S, G] int64, -1 where masked
    prompt_len, gen_len, end, steps, max_steps [S] int64 ; official_end, active [S] bool
    cursors      BlockCursors, [S] int64 each: the current block, the steps taken in it, and the masked cells it
                 had when it began
    shape        BlockShape: block_length B (n_blocks = G // B), and for the plan shift (Dream reads cell c's
                 logits at position c - 1), mode ("dual" or "prefix") and slot_len L
A cell is still to decode when it is masked, before the answer's limit (gen_len under the official end rule,
else min(end + 1, gen_len)) and the sequence has steps left (steps < max_steps): DeviceCanvas.masked().

block_advance (in place on the cursors): first, without `restart` (the end of a step), each active sequence's
    step_in_block grows by one; with `restart` ([S] bool), each flagged sequence's block goes back to 0. Then each
    sequence moves to the first block at or after its current one that has a cell still to decode (none: it
    stays). A sequence that moves, or is flagged in `restart`, begins its block: step_in_block = 0 and
    block_masks = that block's cells still to decode. Inactive sequences move too.
fast_dllm_plan -> BlockPlan:
    cells [S, B]: the block's cells still to decode, ascending, -1 where there are fewer
    in_query [S, L] bool: at a block's first step (step_in_block == 0) every position of the prompt and answer;
                 else the block's positions [prompt_len + block * B - shift, min(prompt_len + (block + 1) * B,
                 prompt_len + gen_len)) under "dual", or from that first position to the answer's end under
                 "prefix"; nothing for an inactive sequence
Exact: integer bookkeeping, the kernels equal the references bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import bind_backend
from .flash_cache_plan import first_cells, still_to_decode

MODES = ("dual", "prefix")


@dataclass(frozen=True)
class BlockShape:
    """A block-schedule session's constants."""

    block_length: int
    slot_len: int
    shift: bool = False
    mode: str = "dual"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"cache mode must be one of {', '.join(MODES)} (got {self.mode!r})")


@dataclass
class BlockCursors:
    """Each sequence's place in the block schedule, [S] int64 each (updated in place)."""

    block: torch.Tensor
    step_in_block: torch.Tensor
    block_masks: torch.Tensor  # cells still to decode in the block when it began

    @classmethod
    def zeros(cls, n_slots: int, device) -> "BlockCursors":
        return cls(*(torch.zeros(n_slots, dtype=torch.int64, device=device) for _ in range(3)))


@dataclass
class BlockPlan:
    cells: torch.Tensor  # [S, B] int64
    in_query: torch.Tensor  # [S, L] bool


def block_advance_reference(answer, gen_len, end, official_end, steps, max_steps, active, cursors: BlockCursors,
                            shape: BlockShape, restart: torch.Tensor | None = None) -> None:
    """Tensor operations: the cells still to decode as [S, n_blocks, B], one any() and one sum() per block."""
    B = shape.block_length
    n_blocks = answer.shape[1] // B
    block, step_in_block, block_masks = cursors.block, cursors.step_in_block, cursors.block_masks
    if restart is None:
        step_in_block += active.long()
    else:
        block.masked_fill_(restart, 0)
    masked = still_to_decode(answer, gen_len, end, official_end, steps, max_steps)
    per_block = masked[:, : n_blocks * B].reshape(answer.shape[0], n_blocks, B)
    has_mask = per_block.any(-1)
    blocks = torch.arange(n_blocks, device=has_mask.device)[None, :]
    nxt = torch.where(has_mask & (blocks >= block[:, None]), blocks, n_blocks).amin(1)
    moved = (nxt != block) & (nxt < n_blocks)
    if restart is not None:
        moved = moved | restart
    block.copy_(torch.where(moved & (nxt < n_blocks), nxt, block))
    step_in_block.masked_fill_(moved, 0)
    count = per_block.sum(-1).gather(1, block.clamp(max=n_blocks - 1)[:, None])[:, 0]
    block_masks.copy_(torch.where(moved, count, block_masks))


def fast_dllm_plan_reference(answer, prompt_len, gen_len, end, official_end, steps, max_steps, active,
                             cursors: BlockCursors, shape: BlockShape) -> BlockPlan:
    """Tensor operations: position sets as comparisons against [1, L] positions; the cells by first_cells."""
    B, L = shape.block_length, shape.slot_len
    device = answer.device
    position = torch.arange(L, device=device)[None, :]
    p0, total = prompt_len[:, None], (prompt_len + gen_len)[:, None]
    start = cursors.block[:, None] * B
    first = p0 + start - (1 if shape.shift else 0)
    block_end = torch.minimum(p0 + start + B, p0 + gen_len[:, None])
    last = block_end if shape.mode == "dual" else total
    block = (position >= first) & (position < last)
    everything = position < total
    in_query = torch.where((cursors.step_in_block == 0)[:, None], everything, block)
    cell = torch.arange(answer.shape[1], device=device)[None, :]
    in_block = (cell >= start) & (cell < start + B)
    masked = still_to_decode(answer, gen_len, end, official_end, steps, max_steps)
    return BlockPlan(cells=first_cells(masked & in_block, B), in_query=in_query & active[:, None])


class BlockScheduleOp:
    """block_advance and fast_dllm_plan bound to one backend at construction ("triton": one kernel launch each;
    "torch": the references). A call only launches, so a step built from it can be captured as a CUDA graph."""

    def __init__(self, backend: str):
        self.backend = backend
        self._advance = bind_backend(backend, block_advance_reference, "._block_schedule_triton",
                                     "block_advance_triton")
        self._plan = bind_backend(backend, fast_dllm_plan_reference, "._block_schedule_triton",
                                  "fast_dllm_plan_triton")

    def advance(self, answer, gen_len, end, official_end, steps, max_steps, active, cursors: BlockCursors,
                shape: BlockShape, restart: torch.Tensor | None = None) -> None:
        self._advance(answer, gen_len, end, official_end, steps, max_steps, active, cursors, shape, restart)

    def plan(self, answer, prompt_len, gen_len, end, official_end, steps, max_steps, active, cursors: BlockCursors,
             shape: BlockShape) -> BlockPlan:
        return self._plan(answer, prompt_len, gen_len, end, official_end, steps, max_steps, active, cursors, shape)
