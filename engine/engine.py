"""The engine facade: load a model, validate settings, run a decoding method, report results and events.

`Engine.load` decides the device, dtype and kernel backend once, before any download. One generation runs
at a time per engine (a lock); callers queue. Events reach `on_event` as each step happens, on the caller's
thread; a UI that wants them on another thread runs `generate` there (app/live.py).
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

import torch

from flash_dllm.engine.canvas import SequenceState
from flash_dllm.engine.decode_common import DecodeContext
from flash_dllm.engine.events import CanvasStart, SequenceDone
from flash_dllm.engine.metrics import tokens_per_forward, tokens_per_second
from flash_dllm.engine.model import DiffusionLM
from flash_dllm.engine.settings import METHODS, GenerationResult, GenerationSettings, SettingsError, validate
from flash_dllm.engine.tokenizer import ChatTokenizer, load_tokenizer
from flash_dllm.engine.weights import default_dtype, load_model
from flash_dllm.kernels import BACKENDS, interpreting, resolve_backend, triton_available

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


class EngineError(RuntimeError):
    """A failure the engine recovered from (out of memory, ...): the message says what to change."""


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA raises OutOfMemoryError; the CPU allocator raises a plain RuntimeError that says so."""
    text = str(err).lower()
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


def pick_device(device: str | torch.device | None) -> torch.device:
    """"auto" (or None) is the first CUDA GPU when there is one, else the CPU; a named device must exist."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, ValueError):
        raise SettingsError(f"unknown device {device!r}; use cuda, cuda:N, cpu or auto") from None
    if chosen.type == "cuda":
        if not torch.cuda.is_available():
            raise SettingsError(f"device {str(device)!r}: no CUDA GPU is available (use cpu)")
        if chosen.index is not None and chosen.index >= torch.cuda.device_count():
            raise SettingsError(f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    return chosen


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """"auto" (or None) is bf16 on CUDA and fp32 on CPU."""
    if dtype in (None, "", "auto"):
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise SettingsError(f"unknown dtype {dtype!r}; choose bf16, fp16 or fp32")
    return DTYPES[dtype]


def pick_backend(kernels: str | None, device: torch.device) -> str:
    """The kernel backend: "auto" (or None) is "triton" on CUDA and "torch" (the PyTorch references) on CPU.
    An explicit "triton" off CUDA is refused rather than silently replaced, except under the Triton CPU
    interpreter (TRITON_INTERPRET=1, the tests)."""
    if kernels not in (None, "", "auto", *BACKENDS):
        raise SettingsError(f"unknown kernel backend {kernels!r}; choose one of: {', '.join(BACKENDS)}")
    if kernels == "triton" and not triton_available():
        raise SettingsError("kernel backend 'triton': the triton package is not installed (use torch)")
    if kernels == "triton" and device.type != "cuda" and not interpreting():
        raise SettingsError(f"kernel backend 'triton' needs a CUDA device, not {device.type} (use torch)")
    return resolve_backend(kernels, device)


class Engine:
    def __init__(self, model: DiffusionLM, tokenizer: ChatTokenizer, name: str, folder: Path, kernels: str, *,
                 graphs: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.folder = folder
        self.kernels = kernels
        self.graphs = graphs  # replay each decode step as a CUDA graph (CUDA only; False runs every step eagerly)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model: str | Path, device: str | None = None, dtype=None, kernels: str | None = None,
             progress: Callable | None = None, graphs: bool = True) -> "Engine":
        """`model` is a local folder or a Hugging Face repo id (downloaded into the HF cache if needed).
        ``device``, ``dtype`` and ``kernels`` ("auto" or None for the defaults) are checked first, so a bad one
        raises SettingsError before anything is downloaded; running out of memory raises EngineError."""
        from flash_dllm.engine.hub import resolve_model

        dev = pick_device(device)
        weights_dtype = pick_dtype(dtype, dev)
        backend = pick_backend(kernels, dev)
        folder = resolve_model(str(model), progress=progress)
        try:
            weights = load_model(folder, dev, weights_dtype)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
            if not is_out_of_memory(err):
                raise
            raise EngineError(f"out of memory loading {model} on {dev.type} in "
                              f"{str(weights_dtype).replace('torch.', '')}; use a smaller model or another "
                              "device or dtype") from None
        return cls(weights, load_tokenizer(folder, weights.config), str(model), Path(folder), backend, graphs=graphs)

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
                "graphs": self.graphs, "params": cfg.n_params, "max_context": cfg.max_seq_len}

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
            tokens_per_s=round(tokens_per_second(len(ids), elapsed), 3),
            method=settings.method,
            model=self.name,
            finish_reason=state.finish_reason,
            verify_passes=state.verify_passes,
            draft_passes=state.forward_passes - state.verify_passes,
            accepted_drafts=state.accepted_drafts,
            rejected_drafts=state.rejected_drafts,
            tokens_per_forward=round(tokens_per_forward(len(ids), state.forward_passes), 3),
            kernels=self.kernels,
            prompt_tokens=state.prompt_len,
            settings=settings.to_dict(),
        )
