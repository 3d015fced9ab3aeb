"""Decoding strategies: small plug-ins that look at the canvas and at per-cell predictions and decide what to
commit. The engine owns the loop, the cache and batching; a strategy never touches tensors.

A strategy answers two questions per sequence and step:
  * ``candidates(state)``: which masked cells compete this step (the current block, or the sliding window);
  * ``select(state, cells, tokens, confidences)``: which of them to commit (indices into ``cells``).
Flash-Verify adds the acceptance rules at the bottom of this file.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from flash_dllm.engine.canvas import SequenceState


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
    order = sorted(range(len(confidences)), key=lambda i: (-confidences[i], i))
    return sorted(order[: max(0, k)])


@dataclass
class BlockCursor:
    """Per-sequence position in the semi-autoregressive block schedule."""

    block: int = 0
    step_in_block: int = 0
    quotas: list[int] = field(default_factory=list)


class BlockStrategy:
    """Cells of the current block compete; the block advances once it has no mask left."""

    def __init__(self, block_length: int, steps_per_block: int):
        self.block_length = block_length
        self.steps_per_block = steps_per_block
        self.cursors: dict[int, BlockCursor] = {}

    def cursor(self, state: SequenceState) -> BlockCursor:
        cur = self.cursors.setdefault(state.index, BlockCursor())
        while True:
            start = cur.block * self.block_length
            masked = state.masked_cells(start, start + self.block_length)
            if masked or start >= state.limit:
                break
            cur.block, cur.step_in_block, cur.quotas = cur.block + 1, 0, []
        if not cur.quotas:
            cur.quotas = split_evenly(len(masked), self.steps_per_block)
        return cur

    def block_range(self, state: SequenceState) -> tuple[int, int]:
        start = self.cursor(state).block * self.block_length
        return start, min(start + self.block_length, state.gen_length)

    def at_block_start(self, state: SequenceState) -> bool:
        return self.cursor(state).step_in_block == 0

    def candidates(self, state: SequenceState) -> list[int]:
        start, stop = self.block_range(state)
        return state.masked_cells(start, stop)

    def advance(self, state: SequenceState) -> None:
        self.cursor(state).step_in_block += 1


class LowConfidenceTopK(BlockStrategy):
    """LLaDA's published rule: commit the k most confident masks of the block, k from the even schedule."""

    def select(self, state, cells, tokens, confidences) -> list[int]:
        cur = self.cursor(state)
        step = min(cur.step_in_block, len(cur.quotas) - 1)
        quota = cur.quotas[step] if cur.quotas else 1
        if cur.step_in_block >= len(cur.quotas) - 1:  # last scheduled step: finish the block
            quota = len(cells)
        chosen = top_k(confidences, max(quota, 1 if cells else 0))
        self.advance(state)
        return chosen


class BlockThreshold(BlockStrategy):
    """Fast-dLLM's confidence-aware parallel decoding inside the current block."""

    def __init__(self, block_length: int, threshold: float):
        super().__init__(block_length, steps_per_block=1)
        self.threshold = threshold

    def select(self, state, cells, tokens, confidences) -> list[int]:
        chosen = threshold_select(confidences, self.threshold)
        self.advance(state)
        return chosen


class WindowThreshold:
    """Flash-Cache's rule: the first `window` masked cells compete; commit all >= threshold, at least one."""

    def __init__(self, window: int, threshold: float):
        self.window = window
        self.threshold = threshold

    def candidates(self, state: SequenceState) -> list[int]:
        return state.masked_cells()[: self.window]

    def select(self, state, cells, tokens, confidences) -> list[int]:
        return threshold_select(confidences, self.threshold)


def accept_paper(draft_tokens: list[int], mask_argmax: list[int], mask_conf: list[float], gamma: float) -> int:
    """The paper's rule: accept candidate i when the mask view's argmax equals its draft with confidence
    >= gamma; stop at the first failure. Returns the number of accepted candidates (a prefix)."""
    accepted = 0
    for draft, top, conf in zip(draft_tokens, mask_argmax, mask_conf):
        if top != draft or conf < gamma:
            break
        accepted += 1
    return accepted


def accept_cumulative(draft_probs: list[float], gamma: float) -> int:
    """The official code's rule: the longest prefix whose running product of mask-view probabilities of
    the drafted tokens stays >= gamma."""
    accepted, product = 0, 1.0
    for prob in draft_probs:
        product *= prob
        if product < gamma:
            break
        accepted += 1
    return accepted
