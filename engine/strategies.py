"""Commit rules of the host reference decoder: which masked cells compete at a step and which to commit.

The device decoder (engine/device_plan.py) implements the same rules as tensor operations; these are the plain
versions it is tested against. A strategy never touches tensors. Per sequence and step, in this order:
    candidates(state)                           the masked cells that compete (current block or sliding window)
    select(state, cells, tokens, confidences)   pure: indices into `cells` to commit
    (threshold rules: ensure_progress)          when every chosen cell predicted [MASK], commit a real token
    end_step(state)                             after the commit: advance a block schedule
A chosen cell whose token is the [MASK] id stays masked (SequenceState.commit): it still takes its place in
the ranking and in a step's quota, as in the published code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from flash_dllm.engine.sequence import SequenceState


class Strategy(Protocol):
    def candidates(self, state: SequenceState) -> list[int]: ...

    def select(self, state: SequenceState, cells: list[int], tokens: list[int],
               confidences: list[float]) -> list[int]: ...

    def end_step(self, state: SequenceState) -> None: ...


def split_evenly(count: int, steps: int) -> list[int]:
    """LLaDA's schedule: `count` masks over `steps` steps, the remainder on the first steps."""
    base, extra = divmod(count, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def threshold_select(confidences: list[float], threshold: float) -> list[int]:
    """Every candidate at or above the threshold, and at least the most confident one."""
    if not confidences:
        return []
    chosen = [i for i, c in enumerate(confidences) if c >= threshold]
    if not chosen:
        chosen = [max(range(len(confidences)), key=lambda i: confidences[i])]
    return chosen


def top_k(confidences: list[float], k: int) -> list[int]:
    """The k most confident; among equal confidences the earlier candidate (the cells are ascending), which is
    the set torch.topk returns on CUDA (it gathers the values tied at the cut in index order)."""
    order = sorted(range(len(confidences)), key=lambda i: (-confidences[i], i))
    return sorted(order[: max(0, k)])


def ensure_progress(chosen: list[int], tokens: list[int], confidences: list[float], fallback_tokens: list[int],
                    fallback_confidences: list[float], mask_id: int) -> tuple[list[int], list[int], list[float]]:
    """When no chosen candidate predicted a real token (all [MASK]), also commit the candidate with the most
    probable real token, with that token. The threshold rules need it to end: the published Fast-dLLM code
    commits its most confident cell even when that is [MASK] (a no-op), so a greedy step that changes nothing
    repeats forever; everywhere else this changes nothing. Returns (chosen, tokens, confidences)."""
    if not tokens or any(tokens[i] != mask_id for i in chosen):
        return chosen, tokens, confidences
    best = max(range(len(tokens)), key=lambda i: (fallback_confidences[i], -i))
    tokens, confidences = list(tokens), list(confidences)
    tokens[best], confidences[best] = fallback_tokens[best], fallback_confidences[best]
    return sorted(set(chosen) | {best}), tokens, confidences


@dataclass
class BlockCursor:
    """Per-sequence position in the semi-autoregressive block schedule."""

    block: int = 0
    step_in_block: int = 0
    masks_at_start: int = 0  # masked cells of the block when it became current


class BlockStrategy:
    """Cells of the current block compete: the first block that still has a masked cell."""

    def __init__(self, block_length: int, steps_per_block: int):
        self.block_length = block_length
        self.steps_per_block = steps_per_block
        self.cursors: dict[int, BlockCursor] = {}

    def cursor(self, state: SequenceState) -> BlockCursor:
        if state.index not in self.cursors:
            self.cursors[state.index] = self._moved(state, BlockCursor(block=-1))
        return self.cursors[state.index]

    def _moved(self, state: SequenceState, cur: BlockCursor) -> BlockCursor:
        """The cursor at the first block from cur.block on with a masked cell (unchanged when none has)."""
        n_blocks = state.gen_length // self.block_length
        for block in range(max(cur.block, 0), n_blocks):
            start = block * self.block_length
            masked = state.masked_cells(start, start + self.block_length)
            if masked:
                if block != cur.block:
                    return BlockCursor(block, 0, len(masked))
                return cur
        return cur if cur.block >= 0 else BlockCursor(0, 0, 0)

    def block_range(self, state: SequenceState) -> tuple[int, int]:
        start = self.cursor(state).block * self.block_length
        return start, min(start + self.block_length, state.gen_length)

    def at_block_start(self, state: SequenceState) -> bool:
        return self.cursor(state).step_in_block == 0

    def candidates(self, state: SequenceState) -> list[int]:
        start, stop = self.block_range(state)
        return state.masked_cells(start, stop)

    def end_step(self, state: SequenceState) -> None:
        cur = self.cursor(state)
        cur.step_in_block += 1
        self.cursors[state.index] = self._moved(state, cur)


class LowConfidenceTopK:
    """LLaDA's generate.py: block b gets exactly steps_per_block steps (b * spb ... (b + 1) * spb - 1); each
    commits the k most confident masked cells, k from the even split of the block's masks at its first step.
    The masked cells before the block compete too (cells that predicted [MASK] in an earlier block: the
    published code only excludes cells after the current block), at most block_length of them, the earliest
    first (the device readout is static). Under the stop rule a block cut short by the end has fewer masks
    than steps; every step then commits at least one cell."""

    guards_progress = False  # a fixed number of steps: no step can repeat forever

    def __init__(self, block_length: int, steps_per_block: int):
        self.block_length = block_length
        self.steps_per_block = steps_per_block
        self.block_masks: dict[int, int] = {}  # per sequence: masked cells of its block at the block's first step

    def block_of(self, state: SequenceState) -> tuple[int, int]:
        """(block, step within it) of the sequence's next step."""
        return divmod(state.steps, self.steps_per_block)

    def candidates(self, state: SequenceState) -> list[int]:
        """The block's masked cells after at most block_length earlier ones; at a block's first step it also
        notes the block's mask count, which fixes the block's quotas."""
        block, step = self.block_of(state)
        start = block * self.block_length
        own = state.masked_cells(start, start + self.block_length)
        if step == 0:
            self.block_masks[state.index] = len(own)
        return state.masked_cells(0, start)[: self.block_length] + own

    def select(self, state, cells, tokens, confidences) -> list[int]:
        _, step = self.block_of(state)
        quota = split_evenly(self.block_masks.get(state.index, 0), self.steps_per_block)[step]
        return top_k(confidences, max(quota, 1 if cells else 0))

    def end_step(self, state: SequenceState) -> None:
        pass


class BlockThreshold(BlockStrategy):
    """Fast-dLLM's confidence-aware parallel decoding inside the current block."""

    guards_progress = True

    def __init__(self, block_length: int, threshold: float):
        super().__init__(block_length, steps_per_block=1)
        self.threshold = threshold

    def select(self, state, cells, tokens, confidences) -> list[int]:
        return threshold_select(confidences, self.threshold)


class WindowThreshold:
    """Flash-Cache's rule: the first `window` masked cells compete; commit all >= threshold, at least one."""

    guards_progress = True

    def __init__(self, window: int, threshold: float):
        self.window = window
        self.threshold = threshold

    def candidates(self, state: SequenceState) -> list[int]:
        return state.masked_cells()[: self.window]

    def select(self, state, cells, tokens, confidences) -> list[int]:
        return threshold_select(confidences, self.threshold)

    def end_step(self, state: SequenceState) -> None:
        pass
