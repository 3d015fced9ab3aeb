"""Refresh policies of the host reference decoder: which positions each sequence recomputes at a step.

* Fast-dLLM: a full forward at the first step of each block (fills the whole cache), then only the block
  (dual cache) or the block and everything after it (prefix cache).
* Flash-Cache: the masked window, the look-ahead masks and a budget of tracked decoded tokens: the tokens
  committed by the previous step first, then the decoded tokens (prompt included) that received the most
  attention mass from the window in the previous step. Everything else is read from the cache. The first
  step of a sequence fills the whole cache. track = -1 refreshes everything (= full recomputation).
* LLaDA: every position, every step (no cache is read).
Dream predicts cell c from position c-1, so the position before every candidate joins the query.

The device decoder (engine/device_plan.py) implements the same policies as tensor operations. Per step, in
this order: the strategy's candidates, then queries(state, cells); after the forward, note_attention when
tracks_attention is set.
"""
from __future__ import annotations

from typing import Protocol

import torch

from flash_dllm.engine.sequence import SequenceState
from flash_dllm.engine.strategies import BlockStrategy


def logit_position(state: SequenceState, cell: int, shift: bool) -> int:
    """Sequence position whose hidden state predicts `cell` (Dream: the previous position)."""
    position = state.prompt_len + cell
    return position - 1 if shift else position


class RefreshPolicy(Protocol):
    tracks_attention: bool

    def queries(self, state: SequenceState, cells: list[int]) -> list[int]: ...

    def recomputes_everything(self, state: SequenceState) -> bool: ...

    def note_attention(self, scores: torch.Tensor, states: list[SequenceState]) -> None: ...


class Everything:
    """LLaDA's reference: every position is recomputed at every step."""

    tracks_attention = False

    def queries(self, state: SequenceState, cells: list[int]) -> list[int]:
        return list(range(state.total_len))

    def recomputes_everything(self, state: SequenceState) -> bool:
        return False  # its steady step already covers every position

    def note_attention(self, scores, states) -> None:
        pass


class FastDllmPolicy:
    tracks_attention = False

    def __init__(self, strategy: BlockStrategy, mode: str, shift: bool):
        self.strategy, self.mode, self.shift = strategy, mode, shift

    def recomputes_everything(self, state: SequenceState) -> bool:
        return self.strategy.at_block_start(state)

    def queries(self, state: SequenceState, cells: list[int]) -> list[int]:
        if self.strategy.at_block_start(state):
            return list(range(state.total_len))
        start, stop = self.strategy.block_range(state)
        first = state.prompt_len + start - (1 if self.shift else 0)
        last = state.prompt_len + stop if self.mode == "dual" else state.total_len
        return list(range(first, last))

    def note_attention(self, scores, states) -> None:
        pass


class FlashCachePolicy:
    def __init__(self, lookahead: int, track: int, shift: bool):
        self.lookahead, self.track, self.shift = lookahead, track, shift
        self.tracks_attention = track > 0
        self.most_attended: dict[int, list[int]] = {}  # per sequence, from the previous step

    def recomputes_everything(self, state: SequenceState) -> bool:
        return state.steps == 0

    def queries(self, state: SequenceState, cells: list[int]) -> list[int]:
        if state.steps == 0 or self.track < 0:
            return list(range(state.total_len))
        masked = state.masked_cells()
        ahead = masked[len(cells): len(cells) + self.lookahead]
        chosen = {state.prompt_len + c for c in cells + ahead}
        chosen |= {logit_position(state, c, self.shift) for c in cells}
        tracked: list[int] = []
        for position in [state.prompt_len + c for c in state.newly_committed] + self.most_attended.get(state.index, []):
            if len(tracked) >= self.track:
                break
            if position not in chosen and position not in tracked:
                tracked.append(position)
        return sorted(chosen | set(tracked))

    def note_attention(self, scores: torch.Tensor, states: list[SequenceState]) -> None:
        """Keep, per sequence, the decoded positions ranked by the attention mass the window gave them.
        scores: [S, L] attention mass per slot position, summed over layers, heads and window queries."""
        if self.track <= 0 or not states:
            return
        eligible = torch.zeros(scores.shape, dtype=torch.bool)
        for state in states:
            eligible[state.index, : state.prompt_len] = True
            answer = torch.tensor(state.answer, dtype=torch.long) >= 0
            eligible[state.index, state.prompt_len: state.total_len] = answer
        # a stable sort: ties go to the lower position on every device (torch.topk leaves them unspecified)
        values, index = torch.sort(scores.masked_fill(~eligible.to(scores.device), float("-inf")), dim=1,
                                   descending=True, stable=True)
        values, index = values[:, : self.track], index[:, : self.track]
        for state in states:
            vals, idx = values[state.index].tolist(), index[state.index].tolist()
            self.most_attended[state.index] = [p for v, p in zip(vals, idx) if v != float("-inf")]
