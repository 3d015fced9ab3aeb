"""The engine facade: load a model, validate settings, run a decoding method, report results and events.

`Engine.load` decides the device, dtype and kernel backend once, before any download. One generation runs
at a time per engine (a lock); callers queue. Events reach `on_event` as each step happens, on the caller's
thread; a UI that wants them on another thread runs `generate` there (app/live.py).
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from flash_dllm.engine.decode_loop import DecodeStalled
from flash_dllm.engine.events import CanvasStart, SequenceDone
from flash_dllm.engine.metrics import tokens_per_forward, tokens_per_second
from flash_dllm.engine.model import DiffusionLM, bind_kernels, store_transposed, transposed_storage_pays
from flash_dllm.engine.requests import Request, RequestInfo
from flash_dllm.engine.scheduler import Scheduler
from flash_dllm.engine.sequence import SequenceState
from flash_dllm.engine.settings import (GenerationResult, GenerationSettings, SettingsError, check_fits,
                                       validate)
from flash_dllm.engine.tokenizer import ChatTokenizer, PromptError, load_tokenizer
from flash_dllm.engine.weights import default_dtype, load_model
from flash_dllm.kernels import BACKENDS, interpreting, resolve_backend, triton_available

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}


def keep_last_exchanges(conversation: list[dict], max_exchanges: int | None) -> tuple[list[dict], int]:
    """The conversation with at most ``max_exchanges`` earlier exchanges (user turns) before its last user
    message (None: all of them); the system prompt stays, and what remains of the turns starts at a user turn.
    Returns the conversation and how many messages were left out. For a model trained on short chats only."""
    if max_exchanges is None:
        return conversation, 0
    if max_exchanges < 0:
        raise SettingsError(f"max_exchanges must be at least 0, not {max_exchanges}")
    head = conversation[:1] if conversation and conversation[0]["role"] == "system" else []
    turns = conversation[len(head):]
    users = [index for index, message in enumerate(turns) if message["role"] == "user"]
    if len(users) <= max_exchanges + 1:
        return conversation, 0
    dropped = users[-(max_exchanges + 1)]
    return head + turns[dropped:], dropped


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
    except (RuntimeError, ValueError, TypeError):
        raise SettingsError(f"unknown device {device!r}; use cuda, cuda:N, cpu or auto") from None
    if chosen.type not in ("cuda", "cpu"):  # torch knows mps, xpu, meta...; the engine runs on neither
        raise SettingsError(f"device {str(device)!r} is not supported; use cuda, cuda:N, cpu or auto")
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
        if transposed_storage_pays(model):  # a layout decided once, at load
            store_transposed(model)
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.folder = folder
        self.kernels = kernels
        self.ops = bind_kernels(model.config, kernels)  # the kernels every cached forward runs, bound once
        self.graphs = graphs  # replay each steady decode step as a CUDA graph (CUDA + Triton kernels only)
        self.last_run = None  # the last generate call's loop outcome (steps, graph replays, capture time)
        self._decode = None  # (shape key, DecodeSession) of the last call, reused by the next of that shape
        self._lock = threading.Lock()
        self._requests = Scheduler(self)  # continuous batching of submit()ted requests

    @classmethod
    def load(cls, model: str | Path, device: str | None = None, dtype=None, kernels: str | None = None,
             progress: Callable | None = None, graphs: bool = True, name: str | None = None) -> "Engine":
        """`model` is a local folder or a Hugging Face repo id (downloaded into the HF cache if needed).
        ``device``, ``dtype`` and ``kernels`` ("auto" or None for the defaults) are checked first, so a bad one
        raises SettingsError before anything is downloaded; running out of memory raises EngineError.
        ``name`` is what the engine reports as its model (default: ``model``), for a caller that resolved a
        repo id to its cached folder itself, off the lock its users wait on."""
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
        return cls(weights, load_tokenizer(folder, weights.config), name or str(model), Path(folder), backend,
                   graphs=graphs)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def default_method(self) -> str:
        """The method a request that names none should use: the model's block method for a block-diffusion
        model (the only ones exact for it), else the engine's default."""
        return "block-diffusion" if self.model.config.block_size else GenerationSettings().method

    def describe(self) -> dict:
        cfg = self.model.config
        return {"model": self.name, "family": cfg.family, "device": str(self.device),
                "dtype": str(self.model.dtype).replace("torch.", ""), "kernels": self.kernels,
                "graphs": self.graphs, "params": cfg.n_params, "max_context": cfg.max_seq_len,
                "default_method": self.default_method}

    def fit_conversation(self, conversation: list[dict], settings: GenerationSettings,
                         max_exchanges: int | None = None) -> tuple[list[dict], int]:
        """Leave out the oldest messages until the prompt plus ``gen_length`` fit the model's context, and, with
        ``max_exchanges``, until at most that many earlier exchanges (user turns) stand before the last user
        message. The system prompt and the last user message always stay, and what remains starts at a user
        turn. Returns the conversation and how many messages were left out."""
        limit = self.model.config.max_seq_len
        conversation, dropped = keep_last_exchanges(conversation, max_exchanges)
        head = conversation[:1] if conversation and conversation[0]["role"] == "system" else []
        turns = conversation[len(head):]
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

    def encode(self, prompts: list, settings: GenerationSettings) -> list[list[int]]:
        """Token ids of each prompt (a string, a list of {"role", "content"} messages, or token ids), checked
        against the model's context: the first place a too-long prompt is seen, so the one place it is reported."""
        limit, vocab = self.model.config.max_seq_len, self.model.config.vocab_size
        encoded = []
        for prompt in prompts:
            if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
                if not all(0 <= t < vocab for t in prompt):  # token ids given directly (benchmarks, tests)
                    raise PromptError(f"a prompt's token ids must lie in [0, {vocab})")
                encoded.append(list(prompt))
            else:
                encoded.append(self.tokenizer.encode(prompt, settings.use_chat_template))
        for ids in encoded:
            check_fits(settings, limit, len(ids))
        return encoded

    def new_states(self, prompts: list, settings: GenerationSettings) -> list[SequenceState]:
        """Host reference states of the prompts (tests and the reference decoder)."""
        cfg = self.model.config
        return [SequenceState(index, ids, settings.gen_length, cfg.mask_id, cfg.eos_id, self.tokenizer.end_ids)
                for index, ids in enumerate(self.encode(prompts, settings))]

    def submit(self, prompt, settings: GenerationSettings, on_event: Callable | None = None) -> Request:
        """Queue one request and return at once (see engine/requests.py). Bad settings or an empty or too long
        prompt raise here, before anything is queued."""
        validate(settings, model_config=self.model.config)
        request = Request(prompt, settings, on_event)
        request.ids = self.encode([prompt], settings)[0]
        request.prompt_tokens = len(request.ids)
        self._requests.put(request)
        return request

    def requests_in_flight(self) -> list[RequestInfo]:
        return self._requests.infos()

    def generate(self, prompts: list, settings: GenerationSettings, on_event: Callable | None = None,
                 cancel: threading.Event | None = None) -> list[GenerationResult]:
        """Decode a batch of prompts (strings or message lists). Raises SettingsError / PromptError on bad
        input and EngineError on recoverable device failures; the engine stays usable after any of them."""
        validate(settings, model_config=self.model.config)
        if not prompts:
            raise SettingsError("no prompt given")
        if settings.seed is None:  # one seed per call, so the decoder and its records agree on it
            settings = settings.with_overrides(seed=int(time.time_ns() & 0xFFFFFFFF))
        encoded = self.encode(prompts, settings)
        emit = on_event or (lambda event: None)
        with self._lock:
            started = time.perf_counter()
            try:
                session = self._session(settings, encoded)
                session.canvas.load(encoded, [settings.gen_length] * len(encoded),
                                    [settings.seed_for(i) for i in range(len(encoded))], settings.threshold,
                                    settings.gamma, settings.temperature)
                session.method.reset(session.canvas)
                for index, ids in enumerate(encoded):
                    tail = [self.tokenizer.piece(t) for t in ids[-24:]]
                    emit(CanvasStart(index, settings.gen_length, settings.block_length, tail, settings.method,
                                     sorted(self.tokenizer.end_ids)))
                with torch.no_grad():
                    outcome = session.run(emit, self.tokenizer.piece, cancel, started)
                results = self._results(session, settings, len(encoded), time.perf_counter() - started)
            except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
                if isinstance(err, DecodeStalled):
                    self._drop_session()
                    raise EngineError(str(err)) from None
                if not is_out_of_memory(err):
                    raise
                self._drop_session()
                raise EngineError(
                    f"out of memory on {self.device.type} for {len(encoded)} sequence(s) of "
                    f"{max(map(len, encoded)) + settings.gen_length} tokens; "
                    "use a shorter answer length, fewer prompts or a smaller model"
                ) from None
            self.last_run = outcome
        for index, result in enumerate(results):
            emit(SequenceDone(index, result.text, result.token_ids, result.finish_reason))
        return results

    def _session(self, settings: GenerationSettings, encoded: list[list[int]]):
        """The decode session for this call's shape: reused (with its captured CUDA graph) when the previous
        call had the same one, else built anew (the old one's memory freed first)."""
        from flash_dllm.engine.decode_loop import DecodeSession, VerifySpec
        from flash_dllm.engine.device_canvas import DeviceCanvas
        from flash_dllm.engine.host_reference import slot_length
        from flash_dllm.engine.methods import METHODS

        slot_len = slot_length([len(ids) + settings.gen_length for ids in encoded])
        shape = replace(settings, threshold=0.0, gamma=0.0, temperature=float(settings.temperature > 0), seed=None,
                        use_chat_template=True)
        key = (len(encoded), slot_len, shape)
        if self._decode is not None and self._decode[0] == key:
            return self._decode[1]
        self._drop_session()
        self._requests.drop()  # the scheduler is idle while generate() holds the lock: free its KV pool
        cfg = self.model.config
        method = METHODS[settings.method]
        canvas = DeviceCanvas.allocate(len(encoded), slot_len, settings.gen_length, cfg.mask_id, cfg.eos_id,
                                       self.tokenizer.end_ids, self.device)
        verify = VerifySpec(settings.candidates_cap, settings.acceptance) if method.verify else None
        session = DecodeSession(self.model, self.ops, method.build_device(settings, canvas, cfg.shift_logits),
                                canvas, verify, settings.temperature > 0, settings.cfg_scale, graphs=self.graphs)
        self._decode = (key, session)
        return session

    def release_decode_memory(self) -> None:
        """Free the last call's decode state (KV cache, captured graph); the next call builds it again."""
        with self._lock:
            self._drop_session()

    def _cancelled_result(self, request: Request) -> GenerationResult:
        """The answer of a request cancelled before it started."""
        return GenerationResult(text="", token_ids=[], forward_passes=0, steps=0, elapsed_s=0.0, tokens_per_s=0.0,
                                method=request.settings.method, model=self.name, finish_reason="cancelled",
                                kernels=self.kernels, prompt_tokens=request.prompt_tokens,
                                settings=request.settings.to_dict())

    def _drop_session(self) -> None:
        self._decode = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _results(self, session, settings: GenerationSettings, n: int, elapsed: float) -> list[GenerationResult]:
        canvas = session.canvas
        answer, end, gen = canvas.answer.cpu(), canvas.end.tolist(), canvas.gen_len.tolist()
        masked = canvas.masked().cpu()
        counters = {name: getattr(canvas, name).tolist() for name in
                    ("prompt_len", "steps", "forward_passes", "verify_passes", "accepted", "rejected")}
        results = []
        for i in range(n):
            stop = end[i] if end[i] < gen[i] else gen[i]
            ids = [t for t in answer[i, :stop].tolist() if t >= 0]
            reason = "eos" if end[i] < gen[i] else ("cancelled" if bool(masked[i].any()) else "length")
            forwards = counters["forward_passes"][i]
            results.append(GenerationResult(
                text=self.tokenizer.decode(ids), token_ids=ids, forward_passes=forwards, steps=counters["steps"][i],
                elapsed_s=round(elapsed, 4), tokens_per_s=round(tokens_per_second(len(ids), elapsed), 3),
                method=settings.method, model=self.name, finish_reason=reason,
                verify_passes=counters["verify_passes"][i], draft_passes=forwards - counters["verify_passes"][i],
                accepted_drafts=counters["accepted"][i], rejected_drafts=counters["rejected"][i],
                tokens_per_forward=round(tokens_per_forward(len(ids), forwards), 3), kernels=self.kernels,
                prompt_tokens=counters["prompt_len"][i], settings=settings.to_dict()))
        return results

