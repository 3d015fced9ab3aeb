"""One sequence's answer canvas as plain Python lists: the state of the host reference decoder.

A cell is masked, committed (final token) or padding (after the answer's end token). The production decoder
keeps the same state as device tensors (engine/device_canvas.py) with the same commit semantics; this one is
the readable reference it is tested against.

Two end rules (GenerationSettings.end_rule):
  * stop: the first committed end token ends the answer; every later cell becomes padding (EOS) and is never
    decoded (Flash-dLLM's early stop; fewer steps).
  * official: nothing becomes padding; the cells after an end token stay masked and are decoded like any other
    (LLaDA's generate.py, Fast-dLLM, Dream's diffusion_generate). The answer is still the text before the first
    end token; the tokens before it can differ from the stop rule's, since later cells keep changing the context.
A committed [MASK] id is no token: the cell stays masked and is predicted again (as in the published code).
A method with a fixed number of steps (llada, dream) sets max_steps: when they are spent, cells still masked
(predicted [MASK] to the end) are left out of the answer, as the published code's decoding skips them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MASK = -1


@dataclass
class SequenceState:
    index: int
    prompt_ids: list[int]
    gen_length: int
    mask_id: int
    eos_id: int
    end_ids: frozenset[int]  # EOS and end-of-turn: the answer ends at the first committed one
    answer: list[int] = field(default_factory=list)  # token per cell, MASK while masked
    confidence: list[float] = field(default_factory=list)
    end: int | None = None  # cell of the first committed end token
    steps: int = 0
    forward_passes: int = 0
    verify_passes: int = 0
    accepted_drafts: int = 0
    rejected_drafts: int = 0
    newly_committed: list[int] = field(default_factory=list)  # cells committed since begin_step (not padding)
    cancelled: bool = False
    official_end: bool = False  # the end rule: False = stop (padding after the end), True = official
    max_steps: int | None = None  # fixed-schedule methods: no cell is decoded after this many steps

    def __post_init__(self) -> None:
        if not self.answer:
            self.answer = [MASK] * self.gen_length
            self.confidence = [0.0] * self.gen_length

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.gen_length

    @property
    def limit(self) -> int:
        """Cells at or beyond this index are padding (or beyond the canvas)."""
        return self.gen_length if self.end is None or self.official_end else self.end + 1

    @property
    def schedule_spent(self) -> bool:
        return self.max_steps is not None and self.steps >= self.max_steps

    def masked_cells(self, start: int = 0, stop: int | None = None) -> list[int]:
        """Cells still to decode (masked, before the limit, while the schedule has steps left)."""
        if self.schedule_spent:
            return []
        stop = self.limit if stop is None else min(stop, self.limit)
        return [c for c in range(start, stop) if self.answer[c] == MASK]

    @property
    def done(self) -> bool:
        return self.cancelled or self.schedule_spent or MASK not in self.answer[: self.limit]

    def is_padding(self, cell: int) -> bool:
        return self.end is not None and cell > self.end and not self.official_end

    def token_at(self, position: int) -> int:
        """Model input token at a sequence position (prompt, committed, padding EOS or the mask token)."""
        if position < self.prompt_len:
            return self.prompt_ids[position]
        cell = position - self.prompt_len
        if self.is_padding(cell):
            return self.eos_id
        token = self.answer[cell]
        return self.mask_id if token == MASK else token

    def tokens(self) -> list[int]:
        """token_at of every position, built with list operations (the decode loops call it every step)."""
        limit = self.limit
        cells = [self.mask_id if token == MASK else token for token in self.answer[:limit]]
        return self.prompt_ids + cells + [self.eos_id] * (self.gen_length - limit)

    def commit(self, cells: list[int], tokens: list[int], confidences: list[float]) -> int | None:
        """Fix tokens into cells (a [MASK] token leaves its cell masked). Returns the new end cell when this
        commit moved the answer's end (the first committed end token), else None."""
        new_end, fixed = None, []
        for cell, token, conf in zip(cells, tokens, confidences):
            if self.answer[cell] != MASK or self.is_padding(cell) or token == self.mask_id:
                continue
            fixed.append(cell)
            self.answer[cell] = int(token)
            self.confidence[cell] = float(conf)
            if token in self.end_ids and (self.end is None or cell < self.end):
                self.end = new_end = cell
        if new_end is not None and not self.official_end:  # tokens committed after the end become padding
            for cell in range(new_end + 1, self.gen_length):
                self.answer[cell] = self.eos_id
        self.newly_committed = [c for c in self.newly_committed + fixed if not self.is_padding(c)]
        return new_end

    def begin_step(self) -> None:
        self.newly_committed = []

    def answer_ids(self) -> list[int]:
        """Generated ids up to and excluding the first end token (cells still masked are dropped)."""
        stop = self.end if self.end is not None else self.gen_length
        return [t for t in self.answer[:stop] if t != MASK]

    @property
    def finish_reason(self) -> str:
        if self.cancelled:
            return "cancelled"
        return "eos" if self.end is not None else "length"
