"""The engine facade: load a model, validate settings, run a decoding method, report results and events.

One generation runs at a time per engine (a lock); callers queue. Events reach `on_event` as each step
happens; `stream()` runs the decode on a worker thread and yields its events live.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.chat import ChatTokenizer, load_tokenizer
from flash_dllm.engine.decode_common import DecodeContext
from flash_dllm.engine.events import CanvasStart, SequenceDone
from flash_dllm.engine.model import DiffusionLM
from flash_dllm.engine.settings import METHODS, GenerationResult, GenerationSettings, SettingsError, validate
from flash_dllm.engine.weights import load_model
from flash_dllm.kernels import resolve_backend

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


class EngineError(RuntimeError):
    """A failure the engine recovered from (out of memory, ...): the message says what to change."""


@dataclass
class Finished:
    results: list[GenerationResult]
    kind: str = "finished"


@dataclass
class Failed:
    message: str
    kind: str = "error"


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA raises OutOfMemoryError; the CPU allocator raises a plain RuntimeError that says so."""
    text = str(err).lower()
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


def pick_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise SettingsError("--device cuda: no CUDA GPU is available (use --device cpu)")
    return torch.device(device)


def pick_dtype(dtype, device: torch.device) -> torch.dtype | None:
    if dtype in (None, "", "auto"):
        return None
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise SettingsError(f"unknown dtype {dtype!r}; choose bf16, fp16 or fp32")
    return DTYPES[dtype]


class Engine:
    def __init__(self, model: DiffusionLM, tokenizer: ChatTokenizer, name: str, folder: Path, kernels: str):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.folder = folder
        self.kernels = kernels
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model: str | Path, device: str | None = None, dtype=None, kernels: str | None = None,
             progress: Callable | None = None) -> "Engine":
        """`model` is a local folder or a Hugging Face repo id (downloaded into the HF cache if needed)."""
        from flash_dllm.engine.hub import resolve_model

        dev = pick_device(device)  # before any download: a missing GPU must not cost a 16 GB download
        backend = resolve_backend(kernels, dev)
        folder = resolve_model(str(model), progress=progress)
        weights = load_model(folder, dev, pick_dtype(dtype, dev))
        return cls(weights, load_tokenizer(folder, weights.config), str(model), Path(folder), backend)

    @staticmethod
    def methods() -> dict[str, str]:
        return dict(METHODS)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def describe(self) -> dict:
        cfg = self.model.config
        return {"model": self.name, "family": cfg.family, "device": str(self.device),
                "dtype": str(self.model.dtype).replace("torch.", ""), "kernels": self.kernels,
                "params": cfg.n_params, "max_context": cfg.max_seq_len}

    def fit_conversation(self, conversation: list[dict], settings: GenerationSettings) -> tuple[list[dict], int]:
        """Leave out the oldest messages until the prompt plus ``gen_length`` fit the model's context. The
        system prompt and the last user message always stay, and what remains starts at a user turn.
        Returns the conversation and how many messages were left out."""
        limit = self.model.config.max_seq_len
        head = conversation[:1] if conversation and conversation[0]["role"] == "system" else []
        turns, dropped = conversation[len(head):], 0
        while limit and len(turns) > 1:
            try:
                length = len(self.tokenizer.encode(head + turns, settings.use_chat_template))
            except ValueError:  # an empty prompt: generate() reports it
                break
            if length + settings.gen_length <= limit:
                break
            turns, dropped = turns[1:], dropped + 1
            while len(turns) > 1 and turns[0]["role"] != "user":
                turns, dropped = turns[1:], dropped + 1
        return head + turns, dropped

    def new_states(self, prompts: list, settings: GenerationSettings) -> list[SequenceState]:
        cfg = self.model.config
        states = []
        for index, prompt in enumerate(prompts):
            ids = self.tokenizer.encode(prompt, settings.use_chat_template)
            validate(settings, cfg.max_seq_len, len(ids))
            states.append(SequenceState(index, ids, settings.gen_length, cfg.mask_id, cfg.eos_id,
                                        self.tokenizer.end_ids))
        return states

    def generate(self, prompts: list, settings: GenerationSettings, on_event: Callable | None = None,
                 cancel: threading.Event | None = None) -> list[GenerationResult]:
        """Decode a batch of prompts (strings or message lists). Raises SettingsError / PromptError on bad
        input and EngineError on recoverable device failures; the engine stays usable after any of them."""
        validate(settings)
        if not prompts:
            raise SettingsError("no prompt given")
        states = self.new_states(prompts, settings)
        emit = on_event or (lambda event: None)
        with self._lock:
            generator = None
            if settings.temperature > 0:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(settings.seed if settings.seed is not None else int(time.time()))
            ctx = DecodeContext(self.model, settings, self.kernels, emit, self.tokenizer.piece, cancel, generator)
            for state in states:
                tail = [self.tokenizer.piece(t) for t in state.prompt_ids[-24:]]
                emit(CanvasStart(state.index, settings.gen_length, settings.block_length, tail, settings.method))
            try:
                self._run(ctx, states)
                ctx.synchronize()
            except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
                if not is_out_of_memory(err):
                    raise
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                raise EngineError(
                    f"out of memory on {self.device.type} for {len(states)} sequence(s) of {max(s.total_len for s in states)} tokens; "
                    "use a shorter answer length, fewer prompts or a smaller model"
                ) from None
            elapsed = time.perf_counter() - ctx.started
        results = [self._result(state, settings, elapsed) for state in states]
        for state, result in zip(states, results):
            emit(SequenceDone(state.index, result.text, result.token_ids, result.finish_reason))
        return results

    def _run(self, ctx: DecodeContext, states: list[SequenceState]) -> None:
        from flash_dllm.engine.decode_cached import run_cached
        from flash_dllm.engine.decode_full import run_full
        from flash_dllm.engine.planners import planner_for
        from flash_dllm.engine.strategies import LowConfidenceTopK

        s = ctx.settings
        if s.method == "llada":
            run_full(ctx, states, LowConfidenceTopK(s.block_length, s.total_steps // s.n_blocks))
        else:
            run_cached(ctx, states, planner_for(s, self.model.config))

    def _result(self, state: SequenceState, settings: GenerationSettings, elapsed: float) -> GenerationResult:
        ids = state.answer_ids()
        return GenerationResult(
            text=self.tokenizer.decode(ids),
            token_ids=ids,
            forward_passes=state.forward_passes,
            steps=state.steps,
            elapsed_s=round(elapsed, 4),
            tokens_per_s=round(len(ids) / elapsed, 3) if elapsed > 0 else 0.0,
            method=settings.method,
            model=self.name,
            finish_reason=state.finish_reason,
            verify_passes=state.verify_passes,
            draft_passes=state.forward_passes - state.verify_passes,
            accepted_drafts=state.accepted_drafts,
            rejected_drafts=state.rejected_drafts,
            tokens_per_forward=round(len(ids) / state.forward_passes, 3) if state.forward_passes else 0.0,
            kernels=self.kernels,
            prompt_tokens=state.prompt_len,
            settings=settings.to_dict(),
        )

    def stream(self, prompts: list, settings: GenerationSettings,
               cancel: threading.Event | None = None) -> Iterator[object]:
        """Yield events live from a worker thread; ends with Finished (or Failed). Closing the iterator
        early cancels the generation between steps (`cancel` is left untouched after a normal finish)."""
        cancel = cancel or threading.Event()
        events: queue.Queue = queue.Queue()

        def work() -> None:
            try:
                events.put(Finished(self.generate(prompts, settings, events.put, cancel)))
            except (SettingsError, EngineError, ValueError) as err:
                events.put(Failed(str(err)))
            except Exception as err:  # keep the worker from dying silently; the UI shows the message
                events.put(Failed(f"{type(err).__name__}: {err}"))

        worker = threading.Thread(target=work, name="flash-dllm-decode", daemon=True)
        worker.start()
        finished = False
        try:
            while True:
                event = events.get()
                if isinstance(event, (Finished, Failed)):
                    finished = True
                yield event
                if finished:
                    return
        finally:
            if not finished:  # the consumer stopped early: stop the decode between steps
                cancel.set()
            worker.join(timeout=30)
