"""Continuous batching: one loop owns the device and steps every request in flight together.

Requests from Engine.submit (the page, the share link, the API) wait in arrival order. Each loop iteration
admits waiting requests into free slots of the running DecodeSession while their prompts and answers fit one
step's prefill budget (PREFILL_ROWS; always at least one request), so a burst of arrivals starts together and
nobody waits behind more than one step of another's prefill; then it runs one step over every occupied slot
(the newcomers' first step reads their whole prompts, the others run their steady steps;
engine/decode_loop.py). A sequence that ends or is
cancelled leaves its slot at once; the others never notice. Events go to each request's own callback with
seq 0, a step or two after the device made them (the loop reads step records late, as decode_loop does).

What requests can mix in one batch: everything per sequence -- answer length, threshold, gamma, temperature
and seed. What they cannot: the method and the settings that fix a step's shapes (window, look-ahead, track,
block length, cache mode, Flash-Verify's candidates and rule, whether the batch samples, classifier-free
guidance; for `llada` and the block methods also their schedule). A request whose shape differs from the
running batch's waits until that batch drains (the queue stays first come, first served), and says so. A
method that cannot decode the model (block-diffusion on a bidirectional model, or the reverse) is refused
at submit.

Memory follows the tokens in flight: a sequence holds a contiguous range of rows of the KV pool for its
prompt + answer, freed when it ends. The pool grows (doubling) only when a request does not fit and the device
has room for it; otherwise the request waits "for memory" until others finish. Admission never runs the
engine out of memory.
"""
from __future__ import annotations

import atexit
import collections
import threading
import weakref
import time
from dataclasses import dataclass

import torch

from flash_dllm.engine.events import CanvasStart
from flash_dllm.engine.requests import Request, RequestInfo
from flash_dllm.engine.sequence import MASK
from flash_dllm.engine.settings import BLOCK_METHODS, SettingsError, model_refusal

MAX_SLOTS = 16  # sequences decoded together
PREFILL_ROWS = 4096  # query rows of newcomers' first steps admitted into one step (one request always may)
POOL_STEP = 2048  # the KV pool grows by at least this many rows
FREE_MARGIN = 0.85  # share of free device memory a pool may take


class RowPool:
    """First-fit ranges of the KV pool's rows (host side)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.free = [(0, capacity)]

    def take(self, n: int) -> int | None:
        for i, (start, size) in enumerate(self.free):
            if size >= n:
                self.free[i] = (start + n, size - n)
                return start
        return None

    def give(self, start: int, n: int) -> None:
        spans = sorted(self.free + [(start, n)])
        merged = [spans[0]]
        for s, size in spans[1:]:
            last_start, last_size = merged[-1]
            if last_start + last_size == s:
                merged[-1] = (last_start, last_size + size)
            else:
                merged.append((s, size))
        self.free = [(s, size) for s, size in merged if size > 0]

    def grow(self, capacity: int) -> None:
        self.give(self.capacity, capacity - self.capacity)
        self.capacity = capacity


def shape_key(settings) -> tuple:
    """What must be equal for two requests to share steps (see the module docstring)."""
    s = settings
    steps = (s.total_steps // s.n_blocks, s.gen_length) if s.method == "llada" else None
    if s.method in BLOCK_METHODS:  # the commit quotas split the block over this many steps
        steps = s.total_steps // s.n_blocks
    dream = (s.total_steps, s.gen_length, s.alg, s.alg_temp, s.top_p, s.top_k, s.eps) if s.method == "dream" else None
    return (s.method, s.block_length, s.window, s.lookahead, s.track, s.cache_mode, s.candidates_cap,
            s.acceptance, s.temperature > 0, s.cfg_scale, steps, s.resolved_end_rule, dream)


@dataclass
class Occupant:
    request: Request
    ids: list[int]
    start_row: int
    rows: int
    admitted_step: int
    started: float
    retired: bool = False  # cancelled: the slot was told to stop


class Scheduler:
    def __init__(self, engine, max_slots: int = MAX_SLOTS):
        self.engine, self.max_slots = engine, max_slots
        self.pending: collections.deque[Request] = collections.deque()
        self.wake = threading.Condition()
        self.thread: threading.Thread | None = None
        self.session = self.shape = self.pool = None
        self.occupants: dict[int, Occupant] = {}
        self.closing = False
        atexit.register(_close, weakref.ref(self))

    # ---- callers' side -----------------------------------------------------------------------------------
    def put(self, request: Request) -> None:
        refusal = model_refusal(request.settings.method in BLOCK_METHODS, request.settings.block_length,
                                self.engine.model.config.block_size)
        if refusal:  # before it is queued: a method that cannot decode this model never waits
            raise SettingsError(refusal)
        self.announce(request)
        with self.wake:
            self.pending.append(request)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._serve, name="flash-dllm-scheduler", daemon=True)
                self.thread.start()
            self.wake.notify()

    def announce(self, request: Request) -> None:
        """The request's canvas, all masked, as soon as it is queued: a request admitted a few (prefill-heavy)
        steps later, or one that waits for the running batch, shows its canvas at once."""
        s, piece = request.settings, self.engine.tokenizer.piece
        request.emit(CanvasStart(0, s.gen_length, s.block_length, [piece(t) for t in request.ids[-24:]], s.method,
                                 sorted(self.engine.tokenizer.end_ids)))

    def infos(self) -> list[RequestInfo]:
        with self.wake:
            live = [o.request for o in self.occupants.values()] + list(self.pending)
        return [r.info() for r in live if not r.done]

    def drop(self) -> None:
        """Free the session's memory (the engine lock is held and no request is in flight)."""
        self.session = self.shape = self.pool = None

    # ---- the loop ----------------------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self.wake:
                while not self.pending and not self.closing:
                    self.wake.wait()
                if self.closing:
                    return
            with self.engine._lock, torch.no_grad():
                try:
                    self._run_while_busy()
                except Exception as err:  # noqa: BLE001 - a device failure ends the requests, not the loop
                    self._fail_everything(err)

    def _fail_everything(self, err: BaseException) -> None:
        from flash_dllm.engine.engine import EngineError, is_out_of_memory

        error = EngineError(f"out of memory on {self.engine.device.type}; fewer or shorter requests") \
            if is_out_of_memory(err) else err
        for occupant in self.occupants.values():
            occupant.request.finish(error=error)
        self.occupants.clear()
        self.drop()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _run_while_busy(self) -> None:
        from flash_dllm.engine.scheduler_steps import BatchRun

        while True:
            head = self._head()
            if head is None and not self.occupants:
                return
            if not self.occupants and head is not None and shape_key(head.settings) != self.shape:
                self._start_session(head)
            run = BatchRun(self)
            run.loop()
            if not self.occupants and not self.pending:
                return

    def _head(self) -> Request | None:
        with self.wake:
            while self.pending and self.pending[0].cancelled:
                cancelled = self.pending.popleft()
                cancelled.finish(self.engine._cancelled_result(cancelled))
            return self.pending[0] if self.pending else None

    def _start_session(self, request: Request) -> None:
        """A session for the request's shape: up to max_slots sequences of up to the model's context."""
        from flash_dllm.engine.decode_loop import DecodeSession, VerifySpec
        from flash_dllm.engine.device_canvas import DeviceCanvas
        from flash_dllm.engine.methods import METHODS

        engine, s = self.engine, request.settings
        engine._drop_session()
        self.drop()
        cfg = engine.model.config
        block = s.block_length
        width = (min(cfg.max_seq_len, 8192) + block - 1) // block * block
        method = METHODS[s.method]
        if method.whole_answer_readout:  # its requests share one answer length (shape_key)
            width = s.gen_length
        slot_len = cfg.max_seq_len + 1
        canvas = DeviceCanvas.allocate(self.max_slots + 1, slot_len, width, cfg.mask_id, cfg.eos_id,
                                       engine.tokenizer.end_ids, engine.device)  # the last slot is a spare
        verify = VerifySpec(s.candidates_cap, s.acceptance) if method.verify else None
        self.session = DecodeSession(engine.model, engine.ops, method.build_device(s, canvas, cfg.shift_logits),
                                     canvas, verify, s.temperature > 0, s.cfg_scale, graphs=engine.graphs,
                                     pool_rows=POOL_STEP)
        self.pool = RowPool(self.session.cache.pool_rows)
        self.shape = shape_key(s)

    # ---- admission ---------------------------------------------------------------------------------------
    def admit(self, step: int) -> list[int]:
        """Admit waiting requests in arrival order while they fit this batch and the step's prefill budget; the
        slots they took."""
        slots, rows = [], 0
        while True:
            head = self._head()
            if head is None or (slots and rows + head.prompt_tokens + head.settings.gen_length > PREFILL_ROWS):
                return slots
            slot = self.admit_one(step)
            if slot is None:
                return slots
            slots.append(slot)
            rows += self.occupants[slot].rows

    def admit_one(self, step: int) -> int | None:
        """Load the head request into a free slot if it fits this batch; the slot, else None."""
        head = self._head()
        if head is None or len(self.occupants) >= self.max_slots:
            return None
        if shape_key(head.settings) != self.shape:
            head.waiting_for = "the running batch (a different method or shape) to finish"
            return None
        rows = head.prompt_tokens + head.settings.gen_length
        start = self.pool.take(rows)
        if start is None and self._grow_pool(rows):
            start = self.pool.take(rows)
        if start is None:
            head.waiting_for = "memory (other requests must finish first)"
            return None
        with self.wake:
            self.pending.popleft()
        slot = min(set(range(self.max_slots)) - set(self.occupants))
        s, canvas = head.settings, self.session.canvas
        canvas.load_slot(slot, head.ids, s.gen_length, s.seed_for(0), s.threshold, s.gamma, s.temperature)
        self.session.method.reset_slot(canvas, slot)
        self.session.cache.row_base[slot] = self.session.cache.pool_start + start
        self.occupants[slot] = Occupant(head, head.ids, start, rows, step, time.perf_counter())
        head.status, head.waiting_for = "running", None
        return slot

    def _grow_pool(self, rows: int) -> bool:
        cache = self.session.cache
        new_rows = max(cache.pool_rows * 2, cache.pool_rows + rows, POOL_STEP)
        per_row = 2 * cache.n_layers * cache.width * torch.finfo(cache.dtype).bits // 8
        if not _room_for((cache.pool_start + new_rows) * per_row, cache.device):
            return False
        cache.grow(new_rows)
        self.session.forget_graphs()
        self.pool.grow(new_rows)
        return True

    def release(self, slot: int) -> None:
        occupant = self.occupants.pop(slot)
        self.pool.give(occupant.start_row, occupant.rows)


def _close(ref) -> None:
    """At interpreter exit: let the loop thread return instead of dying inside a wait."""
    scheduler = ref()
    if scheduler is None or scheduler.thread is None:
        return
    with scheduler.wake:
        scheduler.closing = True
        scheduler.wake.notify_all()
    scheduler.thread.join(timeout=5)


def _room_for(nbytes: int, device: torch.device) -> bool:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return nbytes < FREE_MARGIN * free
    import psutil

    return nbytes < FREE_MARGIN * psutil.virtual_memory().available


def initial_row(answer_row: torch.Tensor, gen_length: int, eos_id: int) -> torch.Tensor:
    """A fresh slot's answer row as the host diffs it: masked cells, then EOS beyond the answer."""
    row = torch.full_like(answer_row, eos_id)
    row[:gen_length] = MASK
    return row

