"""Refresh policies of the cached methods: which positions each sequence recomputes at a step.

* Fast-dLLM: a full forward at the first step of each block (fills the whole cache), then only the block
  (dual cache) or the block and everything after it (prefix cache).
* Flash-Cache: the masked window, the look-ahead masks and a budget of tracked decoded tokens: the tokens
  committed by the previous step first, then the decoded tokens (prompt included) that received the most
  attention mass from the window in the previous step. Everything else is read from the cache. The first
  step of a sequence fills the whole cache. track = -1 refreshes everything (= full recomputation).
Dream predicts cell c from position c-1, so the position before every candidate joins the query.
"""
from __future__ import annotations

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.config import ModelConfig
from flash_dllm.engine.decode_common import logit_position
from flash_dllm.engine.settings import GenerationSettings
from flash_dllm.engine.strategies import BlockThreshold, WindowThreshold


class FastDllmPlanner:
    verify = False
    tracks_attention = False

    def __init__(self, settings: GenerationSettings, shift: bool):
        self.strategy = BlockThreshold(settings.block_length, settings.threshold)
        self.mode = settings.cache_mode
        self.shift = shift

    def queries(self, state: SequenceState, cells: list[int]) -> list[int]:
        if self.strategy.at_block_start(state):
            return list(range(state.total_len))
        start, stop = self.strategy.block_range(state)
        first = state.prompt_len + start - (1 if self.shift else 0)
        last = state.prompt_len + stop if self.mode == "dual" else state.total_len
        return list(range(first, last))


class FlashCachePlanner:
    tracks_attention = True

    def __init__(self, settings: GenerationSettings, shift: bool, verify: bool = False):
        self.strategy = WindowThreshold(settings.window, settings.threshold)
        self.lookahead = settings.lookahead
        self.track = settings.track
        self.shift = shift
        self.verify = verify
        self.most_attended: dict[int, list[int]] = {}  # per sequence, from the previous step

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

    def note_attention(self, cache_scores: torch.Tensor, states: list[SequenceState], slot_len: int) -> None:
        """Keep, per sequence, the decoded positions ranked by the attention mass the window gave them."""
        if self.track <= 0 or not states:
            return
        # Slots are host integers: index with them directly (no device max, no synchronisation), and build the
        # eligibility mask with one vector op per sequence (a per-cell loop cost ~0.6 ms per sequence per step).
        slots = [s.index for s in states]
        scores = cache_scores[: (max(slots) + 1) * slot_len].view(-1, slot_len)[slots]
        eligible = torch.zeros(scores.shape, dtype=torch.bool)
        for row, state in enumerate(states):
            eligible[row, : state.prompt_len] = True
            answer_end = state.prompt_len + len(state.answer)
            eligible[row, state.prompt_len: answer_end] = torch.tensor(state.answer, dtype=torch.long) >= 0
        scores = scores.masked_fill(~eligible.to(scores.device), float("-inf"))
        k = min(self.track, slot_len)
        values, index = torch.topk(scores, k, dim=1)
        host_values, host_index = values.cpu().tolist(), index.cpu().tolist()
        for state, vals, idx in zip(states, host_values, host_index):
            self.most_attended[state.index] = [p for v, p in zip(vals, idx) if v != float("-inf")]


def planner_for(settings: GenerationSettings, config: ModelConfig):
    if settings.method == "fast-dllm":
        return FastDllmPlanner(settings, config.shift_logits)
    if settings.method in ("flash-cache", "flash-verify"):
        return FlashCachePlanner(settings, config.shift_logits, verify=settings.method == "flash-verify")
    raise ValueError(f"method {settings.method!r} does not use the KV cache")
