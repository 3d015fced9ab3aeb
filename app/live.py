"""A generation as the UI drains it: the engine decodes on its worker, the UI takes events in frames.

`LiveRun` submits one request to the engine (`Engine.submit`, beside the API's requests) and waits for it on one
thread; the request's ``on_event`` puts each event on one queue.
`LiveRun.frames()` hands the UI everything that arrived since its last frame, at most one frame per
``frame_s``: when steps come slower than the frame rate each step is shown as soon as it happens; when they
come at hundreds per second, all of a frame's steps are folded (cheaply, see app/canvas.py) and one frame is
rendered. Nothing is computed ahead and replayed. `RunView` folds a run's events into its canvas and stats.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from flash_dllm.app.canvas import Canvas, empty_canvas_html
from flash_dllm.app.stats import stats_rows, stats_table
from flash_dllm.engine import (CanvasStart, EngineError, Failed, Finished, MemoryTracker, RunStats, SequenceDone,
                               StepEvent)

FRAME_S = 0.05  # at most 20 frames a second reach the browser
IDLE_S = 0.5  # an empty frame when nothing happened for this long (elapsed time and memory keep moving)
FIRST_STEP_NOTE_S = 3.0  # a GPU run with no step after this long gets a word in the status (see waiting_note)


PROMPT_TAIL_CHARS = 60


def prompt_tail_of(text: str) -> str:
    """The end of the user's message as the canvas shows it before the answer. The engine's prompt tail is
    the last tokens of the *templated* prompt, which end in the chat template's markup (LLaDA's
    ``<|eot_id|><|start_header_id|>assistant<|end_header_id|>``), not in what the user wrote."""
    words = " ".join(text.split())
    return words if len(words) <= PROMPT_TAIL_CHARS else words[-PROMPT_TAIL_CHARS:]


def is_terminal(event) -> bool:
    return isinstance(event, (Finished, Failed))


class LiveRun:
    """One engine request (`Engine.submit`) waited for on its own thread, its events put on one queue that the
    UI drains with a deadline (`frames`). The queue ends with Finished, or Failed when the request failed.
    ``on_submit`` receives the engine's Request (the page labels it in its list of requests in flight)."""

    def __init__(self, engine, prompt, settings, frame_s: float = FRAME_S, idle_s: float = IDLE_S,
                 cancel: threading.Event | None = None, on_submit: Callable | None = None):
        self.engine = engine
        self.prompt = prompt
        self.settings = settings
        self.frame_s = frame_s
        self.idle_s = idle_s
        self.cancel = cancel or threading.Event()
        self.on_submit = on_submit
        self.events: queue.Queue = queue.Queue()
        self.event_count = 0
        self.request = None
        self._request_lock = threading.Lock()
        self._thread = threading.Thread(target=self._decode, name="flash-dllm-decode", daemon=True)

    def start(self) -> "LiveRun":
        self._thread.start()
        return self

    def _decode(self) -> None:
        try:
            request = self.engine.submit(self.prompt, self.settings, on_event=self.events.put)
            with self._request_lock:  # `stop` reads it under the same lock: one of the two sees the other
                self.request = request
            if self.cancel.is_set():
                request.cancel()
            if self.on_submit is not None:
                self.on_submit(request)
            results = [request.result()]
        except (EngineError, ValueError) as err:  # settings, prompt, memory: the message says what to change
            self.events.put(Failed(str(err)))
        except BaseException as err:  # a bug: the UI must still receive a terminal event, and shows its name
            self.events.put(Failed(f"{type(err).__name__}: {err}"))
        else:
            self.events.put(Finished(results))

    def frames(self) -> Iterator[list]:
        """Lists of events, one list per frame; the last list ends with Finished or Failed."""
        last = float("-inf")
        while True:
            try:
                batch = [self.events.get(timeout=self.idle_s)]
            except queue.Empty:
                yield []
                continue
            while not is_terminal(batch[-1]):
                wait = last + self.frame_s - time.monotonic()
                try:
                    batch.append(self.events.get(timeout=wait) if wait > 0 else self.events.get_nowait())
                except queue.Empty:
                    break
            self.event_count += len(batch)
            last = time.monotonic()
            yield batch
            if is_terminal(batch[-1]):
                return

    def stop(self) -> None:
        """Ask the engine to stop between steps (the run then finishes with reason "cancelled")."""
        self.cancel.set()
        with self._request_lock:
            request = self.request
        if request is not None:
            request.cancel()

    def close(self, timeout: float = 30.0) -> None:
        self.stop()
        self._thread.join(timeout)


class RunView:
    """Canvas, speed and memory of one run (sequence 0 of its prompts), folded frame by frame."""

    def __init__(self, label: str, engine_info: dict, device=None, prompt_text: str | None = None):
        self.label = label
        self.prompt_text = prompt_text  # the user's words: the canvas's prompt tail (see `prompt_tail_of`)
        self.engine_info = engine_info
        self.canvas: Canvas | None = None
        self.stats = RunStats()
        self.memory = MemoryTracker(device)
        self.result = None
        self.error: str | None = None
        self.started = time.monotonic()
        self.on_gpu = str(device).startswith("cuda")
        self.memory.start()

    def fold(self, batch: list) -> None:
        for event in batch:
            if getattr(event, "seq", 0) != 0:
                continue
            if isinstance(event, StepEvent):
                self.canvas.apply(event)
                self.stats.update(event)
            elif isinstance(event, CanvasStart):
                self.canvas = Canvas.from_start(event, label=self.label)
                if self.prompt_text is not None:
                    self.canvas.prompt_tail = [prompt_tail_of(self.prompt_text)]
                self.stats.gen_length = event.gen_length
            elif isinstance(event, SequenceDone):
                if self.canvas is not None:
                    self.canvas.finish(event.finish_reason)
            elif isinstance(event, Finished):
                self.result = event.results[0] if event.results else None
                if self.result is not None:
                    self.stats.finish(self.result)
            elif isinstance(event, Failed):
                self.error = event.message
        self.memory.sample()

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def waiting_note(self, now: float | None = None) -> str:
        """What the status adds while a GPU run has no step yet after FIRST_STEP_NOTE_S: the first steps of a
        decode shape new to this machine compile the Triton kernels and tune them (both kept on disk afterwards;
        about a minute on an H100 for a first chat), and a later start still loads them and captures its steps;
        a page should not look hung meanwhile."""
        waited = (time.monotonic() if now is None else now) - self.started
        if not self.on_gpu or self.stats.steps or self.done or waited < FIRST_STEP_NOTE_S:
            return ""
        return ("waiting for the first step: answers of a new shape first compile and tune the GPU kernels (once; "
                "kept on disk)")

    def canvas_html(self) -> str:
        if self.canvas is None:
            return empty_canvas_html(self.error or f"{self.label}: waiting for the engine…")
        return self.canvas.render()

    def stats_html(self) -> str:
        return stats_table(stats_rows(self.stats, self.memory.last, self.engine_info,
                                      self.memory.device_peak, self.memory.ram_peak), f"Live stats · {self.label}")
