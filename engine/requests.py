"""One generation request as callers see it: submit, stream its events, cancel, wait for its result.

`Engine.submit(prompt, settings, on_event)` returns a Request at once; the engine decodes it when it can,
beside the other requests in flight, and calls `on_event` with the request's own events (its sequence is
always seq 0): CanvasStart, StepEvents, SequenceDone. `result()` waits for the GenerationResult (or raises
the request's error: SettingsError, PromptError, EngineError). `cancel()` stops it between steps; its result
then has finish_reason "cancelled".
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

_ids = itertools.count(1)


@dataclass
class RequestInfo:
    """What the page shows about a request in flight."""

    id: int
    status: str  # "waiting" | "running" | "done"
    waiting_for: str | None  # why a waiting request waits ("the running batch", "memory", ...)
    prompt_tokens: int
    gen_length: int
    generated_tokens: int
    submitted_s: float  # time.monotonic() at submit


@dataclass
class Request:
    prompt: object
    settings: object
    on_event: Callable | None = None
    id: int = field(default_factory=lambda: next(_ids))
    status: str = "waiting"
    waiting_for: str | None = "the running batch"
    ids: list[int] = field(default_factory=list)  # the prompt's token ids (set by Engine.submit)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    submitted_s: float = field(default_factory=time.monotonic)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)
    _result: object = None
    _error: BaseException | None = None

    def cancel(self) -> None:
        """Stop between steps (a waiting request never starts)."""
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None):
        """The GenerationResult; raises the request's error, or TimeoutError when it is not done in time."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} is not done after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def emit(self, event) -> None:
        if getattr(event, "kind", "") == "step":
            self.generated_tokens = event.generated_tokens
        if self.on_event is not None:
            self.on_event(event)

    def finish(self, result=None, error: BaseException | None = None) -> None:
        self._result, self._error, self.status, self.waiting_for = result, error, "done", None
        self._done.set()

    def info(self) -> RequestInfo:
        return RequestInfo(self.id, self.status, self.waiting_for, self.prompt_tokens,
                           getattr(self.settings, "gen_length", 0), self.generated_tokens, self.submitted_s)

