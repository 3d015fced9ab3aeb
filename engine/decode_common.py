"""Pieces every decode loop shares: turning logits into per-cell predictions, committing, and events."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.events import StepEvent
from flash_dllm.engine.model import DiffusionLM
from flash_dllm.engine.settings import GenerationSettings


@dataclass
class DecodeContext:
    model: DiffusionLM
    settings: GenerationSettings
    backend: str = "torch"
    emit: Callable[[object], None] = lambda event: None
    piece: Callable[[int], str] = str
    cancel: threading.Event | None = None
    generator: torch.Generator | None = None
    started: float = field(default_factory=time.perf_counter)

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def still_decoding(self, states: list[SequenceState]) -> list[SequenceState]:
        """The sequences left to decode; none once the user cancelled (they are marked cancelled)."""
        active = [s for s in states if not s.done]
        if active and self.cancelled():
            for state in active:
                state.cancelled = True
            return []
        return active

    def synchronize(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)


@dataclass
class Predictions:
    """Per-row argmax (or Gumbel sample), its softmax probability, and optionally the probability of a
    given token (Flash-Verify: the mask view's probability of the drafted token). Host lists."""

    tokens: list[int]
    confidences: list[float]
    probs_of_given: list[float] | None = None


def predict(
    logits: torch.Tensor,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    given_tokens: torch.Tensor | None = None,
) -> Predictions:
    """logits [M, V] -> one host transfer of tokens/confidences. Softmax in fp64 on these few rows so
    thresholds such as 0.9 are compared exactly as the reference implementations do."""
    if logits.shape[0] == 0:
        return Predictions([], [], [] if given_tokens is not None else None)
    probs = torch.softmax(logits.double(), dim=-1)
    if temperature > 0:
        uniform = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float64)
        gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-300)))
        tokens = torch.argmax(logits.double() / temperature + gumbel, dim=-1)
    else:
        tokens = torch.argmax(logits, dim=-1)
    conf = probs.gather(-1, tokens[:, None])[:, 0]
    stacked = [tokens.double(), conf]
    if given_tokens is not None:
        stacked.append(probs.gather(-1, given_tokens.long()[:, None])[:, 0])
    host = torch.stack(stacked).cpu()
    return Predictions(
        tokens=[int(t) for t in host[0].tolist()],
        confidences=host[1].tolist(),
        probs_of_given=host[2].tolist() if given_tokens is not None else None,
    )


def emit_step(
    ctx: DecodeContext,
    state: SequenceState,
    cells: list[int],
    window: list[int],
    end_before: int | None,
    step_started: float,
    **extra,
) -> StepEvent:
    """Count the step and send one StepEvent for cells already committed into `state` this step
    (extra: Flash-Verify fields). Tokens dropped because an end token precedes them are not reported."""
    kept = [c for c in cells if state.answer[c] >= 0 and not state.is_padding(c)]
    event = StepEvent(
        seq=state.index,
        step=state.steps,
        committed=kept,
        tokens=[state.answer[c] for c in kept],
        pieces=[ctx.piece(state.answer[c]) for c in kept],
        confidences=[round(state.confidence[c], 4) for c in kept],
        window=list(window),
        padding_from=None if state.end == end_before or state.end is None else state.end + 1,
        forward_passes=state.forward_passes,
        verify_passes=state.verify_passes,
        generated_tokens=len(state.answer_ids()),
        elapsed_s=time.perf_counter() - ctx.started,
        step_ms=(time.perf_counter() - step_started) * 1000.0,
        **extra,
    )
    state.steps += 1
    ctx.emit(event)
    return event


def logit_position(state: SequenceState, cell: int, shift: bool) -> int:
    """Sequence position whose hidden state predicts `cell` (Dream: the previous position)."""
    position = state.prompt_len + cell
    return position - 1 if shift else position
