"""What the engine tells its consumers (CLI, UI, tests) while it decodes: plain dataclasses, JSON-ready.

`Engine.generate` sends CanvasStart, StepEvent and SequenceDone to its ``on_event`` callback. Finished and
Failed end a run for a consumer that decodes on another thread and queues the events (app/live.py): they
carry the results, or the message of the error that ended the run.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flash_dllm.engine.settings import GenerationResult

# Cell states of the answer canvas, as the UI colours them.
MASKED, COMMITTED, PADDING = "masked", "committed", "padding"


@dataclass
class CanvasStart:
    """Sent once per sequence before its first step: the canvas geometry and the prompt tail."""

    seq: int
    gen_length: int
    block_length: int
    prompt_tail: list[str]  # last few prompt tokens as display pieces
    method: str
    # Token ids that end the answer (EOS, end of turn): the answer is the text before the first one committed.
    # Under the official end rule the cells after it still decode (as the published samplers do), as tokens.
    end_tokens: list[int] = field(default_factory=list)
    kind: str = "start"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepEvent:
    """One decoding step of one sequence: which canvas cells changed and why.

    Positions are answer-relative (0 = first generated position). ``committed`` lists cells that received
    their final token this step (with confidence); ``padding_from`` is set when an end token was committed,
    so every later cell is EOS padding (shown as such, never as text).
    """

    seq: int
    step: int
    committed: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)
    window: list[int] = field(default_factory=list)  # cells the strategy looked at (block or sliding window)
    drafted: list[int] = field(default_factory=list)  # Flash-Verify candidates of this step
    draft_tokens: list[int] = field(default_factory=list)
    draft_pieces: list[str] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # drafted cells accepted by the verify pass
    rejected: list[int] = field(default_factory=list)
    padding_from: int | None = None
    forward_passes: int = 0  # cumulative for this sequence (draft + verify)
    verify_passes: int = 0  # cumulative verify passes (a subset of forward_passes)
    generated_tokens: int = 0  # cumulative committed answer tokens before the end token
    elapsed_s: float = 0.0
    step_ms: float = 0.0
    kind: str = "step"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SequenceDone:
    seq: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "eos" | "length" | "cancelled"
    kind: str = "done"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Finished:
    """The run ended normally (also when cancelled): one result per prompt, in order."""

    results: list[GenerationResult]
    kind: str = "finished"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "results": [result.to_dict() for result in self.results]}


@dataclass
class Failed:
    """The run ended with an error; ``message`` is one line for the user."""

    message: str
    kind: str = "error"

    def to_dict(self) -> dict:
        return asdict(self)
