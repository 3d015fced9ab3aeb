"""The decode loop: one device-resident step per iteration, replayed as a CUDA graph, read by the host later.

A DecodeSession holds everything a shape of decode call needs on the device (canvas, KV cache, the method's
state, record buffers, the captured step), allocated once and refilled in place by `load`, so the graph
captured for one call serves the next call of the same shape (a chat's next turn).

Each step is pure device work (engine/device_plan.py, device_verify.py): plan, forward, predict, commit,
verify, record. Steady steps all have the same shapes (every slot gets the method's query budget), so on
CUDA the third one is captured and every later one is a graph replay. Steps that recompute whole sequences
(the first step; fast-dllm's block starts) run eagerly, cut into forwards of bounded size. The host launches
step k + 1 before it reads step k's record (lag 1), except where the next step's layout depends on the
data (fast-dllm: does a block start?), where it waits for record k first; either way it never waits inside a
step. A sequence that finished decodes nothing in the extra step that was already on its way.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from flash_dllm.engine.block_diffusion import check_model_and_method
from flash_dllm.engine.device_canvas import DeviceCanvas
from flash_dllm.engine.device_plan import DeviceMethod
from flash_dllm.engine.device_verify import Verifier, VerifyLayout
from flash_dllm.engine.model import DiffusionLM, KernelOps, forward_cached, lm_logits
from flash_dllm.engine.packing import KVCache, Layout, Packer, QueryPlan, groups_for
from flash_dllm.engine.sampling import DRAFT_PASS, Predictions, noise_keys
from flash_dllm.engine.step_records import HostRecord, StepRecords, step_events

MAX_ROWS = 4096  # query rows per forward of an eager whole-sequence step (bounds its activation memory)
EAGER_BEFORE_CAPTURE = 2  # steady steps run eagerly first: Triton compiles and tunes its kernels there


class DecodeStalled(RuntimeError):
    """A sequence took more steps than any method needs for its answer: its steps stopped committing."""


def check_progress(record: HostRecord) -> None:
    """Raise DecodeStalled when an active sequence has taken more than 2 * gen_len + 8 steps. Every method
    commits at least one cell per step while cells remain (threshold rules fall back to the best real token,
    quotas are at least one, schedules are at most gen_len steps), so only a broken step gets there; without
    this check it would decode forever."""
    stalled = record.active & (record.steps > 2 * record.gen_len + 8)
    if bool(stalled.any()):
        slot = int(torch.nonzero(stalled)[0])
        raise DecodeStalled(f"decoding stalled: sequence {slot} took {int(record.steps[slot])} steps for "
                            f"{int(record.gen_len[slot])} answer cells without finishing (a step committed nothing)")


@dataclass(frozen=True)
class VerifySpec:
    cap: int  # candidates per step
    rule: str  # "paper" | "cumulative"


@dataclass
class RunOutcome:
    steps: int
    graph_replays: int
    capture_s: float  # time spent capturing the steady step (0 when reused or eager)


class DecodeSession:
    def __init__(self, model: DiffusionLM, ops: KernelOps, method: DeviceMethod, canvas: DeviceCanvas,
                 verify: VerifySpec | None, sampling: bool, cfg_scale: float = 0.0, graphs: bool = True,
                 pool_rows: int | None = None):
        self.model, self.ops, self.method, self.canvas = model, ops, method, canvas
        check_model_and_method(model.config, method)  # a block-diffusion model decodes only with its method
        backend = ops.backend
        canvas.use_kernels(backend)
        method.use_kernels(backend)
        self.sampling, self.cfg_scale = sampling, cfg_scale
        shift = model.config.shift_logits
        # the candidates are cells the step read out, so a cap above that many allows nothing more: the same passes
        cap = min(verify.cap, method.readout) if verify else 0
        verify_rows = method.readout + (3 if shift else 2) * cap if verify else 0
        self.cache = KVCache(model, canvas.n_slots, canvas.slot_len, scratch_per_slot=verify_rows, pool_rows=pool_rows)
        self.packer = Packer(self.cache, canvas, shift)
        self.packer.use_kernels(backend)
        self.verifier = Verifier(VerifyLayout(self.packer, method.readout, cap, shift), verify.rule) \
            if verify else None
        self.records = StepRecords(canvas, method.readout, cap)
        self.steady = Layout.uniform(canvas.n_slots, method.steady_rows)
        cuda = canvas.answer.device.type == "cuda"
        self.graphs = graphs and cuda and backend == "triton"
        self.stream = torch.cuda.Stream(canvas.answer.device) if cuda else None
        self.graphs_by_layout: dict[Layout, torch.cuda.CUDAGraph] = {}
        self.eager_runs: dict[Layout, int] = {}
        self.capture_s = 0.0
        self.status_driven = method.layout_follows_data
        # How many steps ahead of its reads the host runs: 1 on CUDA (the GPU runs step k + 1 while the host
        # turns record k into events); 0 on the CPU, where a step is done when its call returns. Tests raise it
        # on the CPU to run the pipelined path. A method whose layout follows the data always reads at once.
        self.lag = 1 if cuda else 0
        # A method that reads each record at once (lag 0) leaves the GPU idle while the host waits for the record;
        # on CUDA the events of a record read that way are built after the next step is launched, so that only the
        # read and the launch stand between two steps, not the events (which grow with the batch). Tests set it on
        # the CPU to run that order.
        self.defer_events = cuda
        bind = getattr(method, "bind_session", None)  # a method with its own packing (block-diffusion)
        if bind is not None:
            bind(self)
        if self.verifier is not None:  # after bind: a method may bring a verifier of its own
            self.verifier.use_kernels(backend)

    @property
    def read_lag(self) -> int:
        """Steps the host launches ahead of its reads: none for a method whose next layout follows the record."""
        return 0 if self.status_driven else self.lag

    @property
    def events_after_launch(self) -> bool:
        """Whether a record's events (and, in the scheduler, its answered requests) wait for the next launch."""
        return self.defer_events and self.read_lag == 0

    # ---- one step, device work only ----------------------------------------------------------------------
    def step(self, layouts: list[Layout]) -> None:
        canvas, method = self.canvas, self.method
        was_active = canvas.active.clone()
        plan = method.plan(canvas)
        if plan.scored is not None:
            self.cache.scores.zero_()
        preds = self._draft(plan, layouts)
        if plan.scored is not None:
            method.note_attention(canvas, self.cache)
        chosen = method.select(canvas, plan, preds)
        canvas.forward_passes += was_active.long() * method.forwards_per_step
        canvas.begin_step()
        committed = canvas.commit(plan.cells, preds.tokens, preds.confidences, chosen)
        verified = self.verifier.after_commit(self, plan.cells, preds, committed) if self.verifier else {}
        method.end_step(canvas)
        canvas.finish_step()
        self.records.write(canvas, plan.cells, was_active, method.full_next(canvas), **verified)

    def _keys_and_temperature(self, slots: torch.Tensor | None, cells: torch.Tensor, pass_id: int):
        if not self.sampling:
            return None, None
        canvas = self.canvas
        seed, steps, temp = canvas.seed, canvas.steps, canvas.temperature
        if slots is not None:
            seed, steps, temp = seed[slots], steps[slots], temp[slots]
        keys = noise_keys(seed[:, None], steps[:, None], pass_id, cells).reshape(-1)
        return keys, temp[:, None].expand_as(cells).reshape(-1)

    def _logits(self, plan: QueryPlan, layout: Layout, mask_prompt: bool = False) -> torch.Tensor:
        step = self.packer.pack(plan, layout, mask_prompt)
        score_out = self.cache.scores if plan.scored is not None else None
        hidden = forward_cached(self.model, self.cache.k, self.cache.v, step, self.ops, score_out)
        return lm_logits(self.model, hidden)

    def _draft(self, plan: QueryPlan, layouts: list[Layout]) -> Predictions:
        """Predictions [S, R] at the plan's candidate cells, from one forward per layout."""
        shape = plan.cells.shape
        if len(layouts) == 1 and self.packer.tensors(layouts[0]).all_slots:  # a steady step: one forward, no merge
            p = self._predict(plan, layouts[0], None, plan.cells)
            tokens, confidences = p.tokens.view(shape), p.confidences.view(shape)
            if p.fallback_tokens is None:  # only an unbound method (mask id -1) asks for none
                return Predictions(tokens=tokens, confidences=confidences, fallback_tokens=torch.zeros_like(tokens),
                                   fallback_confidences=torch.zeros_like(confidences))
            return Predictions(tokens=tokens, confidences=confidences, fallback_tokens=p.fallback_tokens.view(shape),
                               fallback_confidences=p.fallback_confidences.view(shape))
        tokens = torch.zeros(shape, dtype=torch.int64, device=plan.cells.device)
        confidences = torch.zeros(shape, dtype=torch.float64, device=plan.cells.device)
        fallback, fallback_conf = torch.zeros_like(tokens), torch.zeros_like(confidences)
        for layout in layouts:
            lt = self.packer.tensors(layout)
            slots = None if lt.all_slots else lt.index
            p = self._predict(plan, layout, slots, plan.cells if slots is None else plan.cells[slots])
            fields = [(tokens, p.tokens), (confidences, p.confidences), (fallback, p.fallback_tokens),
                      (fallback_conf, p.fallback_confidences)]
            for out, value in fields:  # every slot's row is written by exactly one layout
                if value is None:
                    continue
                if slots is None:
                    out.copy_(value.view(shape))
                else:
                    out.index_copy_(0, slots, value.view(len(layout.slots), -1).to(out.dtype))
        return Predictions(tokens=tokens, confidences=confidences, fallback_tokens=fallback,
                           fallback_confidences=fallback_conf)

    def _predict(self, plan: QueryPlan, layout: Layout, slots: torch.Tensor | None, cells: torch.Tensor
                 ) -> Predictions:
        """Predictions at `cells` (the layout's slots' candidates) from the layout's forward."""
        logits = self._logits(plan, layout)
        if self.cfg_scale > 0:  # LLaDA's classifier-free guidance: un + (scale + 1) * (cond - un)
            uncond = self._logits(plan, layout, mask_prompt=True)
            logits = uncond + (self.cfg_scale + 1.0) * (logits - uncond)
        keys, temperature = self._keys_and_temperature(slots, cells, DRAFT_PASS)
        return self.method.predict(logits, temperature, keys, cells.reshape(-1))

    def verify_logits(self, step) -> torch.Tensor:
        """Logits at a verify pass's read-out rows (the pass writes scratch rows only)."""
        return lm_logits(self.model, forward_cached(self.model, self.cache.k, self.cache.v, step, self.ops, None))

    # ---- the loop ------------------------------------------------------------------------------------------
    def _layouts(self, full: torch.Tensor) -> list[Layout]:
        if not bool(full.any()):
            return [self.steady]
        total = (self.canvas.prompt_len + self.canvas.gen_len).tolist()
        budgets = [max(t, 1) if f else self.method.steady_rows for t, f in zip(total, full.tolist())]
        return groups_for(budgets, MAX_ROWS)

    def launch(self, layouts: list[Layout]) -> bool:
        """Run one step; True when it was a graph replay. A single steady forward (every slot, or a dynamic
        layout, at the method's budget) is replayed from its graph once it has run eagerly a few times."""
        layout = layouts[0]
        steady = len(layouts) == 1 and set(layout.budgets) == {self.method.steady_rows} and (
            layout == self.steady or layout.dynamic)
        if not (self.graphs and steady):
            self.step(layouts)
            return False
        if layout not in self.graphs_by_layout and self.eager_runs.get(layout, 0) < EAGER_BEFORE_CAPTURE:
            self.eager_runs[layout] = self.eager_runs.get(layout, 0) + 1
            self.step(layouts)
            return False
        if layout not in self.graphs_by_layout:
            started = time.perf_counter()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self.stream):
                self.step(layouts)
            self.graphs_by_layout[layout] = graph
            self.capture_s += time.perf_counter() - started
        self.graphs_by_layout[layout].replay()
        return True

    def forget_graphs(self) -> None:
        """Drop the captured steps (after the KV pool moved to new tensors)."""
        self.graphs_by_layout.clear()
        self.eager_runs.clear()

    def run(self, emit, piece, cancel: threading.Event | None, started: float) -> RunOutcome:
        """Decode the loaded sequences to the end (or until cancelled), emitting StepEvents."""
        self.capture_s = 0.0  # of this call (a reused session's graphs are already captured)
        context = torch.cuda.stream(self.stream) if self.stream is not None else _nullcontext()
        with context:
            return self._run(emit, piece, cancel, started)

    def _run(self, emit, piece, cancel, started) -> RunOutcome:
        canvas, records = self.canvas, self.records
        previous = HostRecord.initial(canvas, self.method.readout, self.verifier.cap if self.verifier else 0)
        full = canvas.active.cpu()  # every sequence's first step reads its whole prompt
        pending: list[int] = []
        unemitted: list[tuple[HostRecord, HostRecord]] = []  # (previous, record) read, their events not yet built

        def emit_read() -> None:
            for before, record in unemitted:
                for event in step_events(before, record, piece, started):
                    emit(event)
            unemitted.clear()

        k, replays, stopping = 0, 0, False
        last_event = None
        keep, late = self.read_lag, self.events_after_launch
        while True:
            if cancel is not None and cancel.is_set() and not stopping:
                canvas.active.zero_()  # queued behind the steps in flight: they finish, later ones do nothing
                stopping = True
            host_started = time.perf_counter()
            replays += self.launch(self._layouts(full))
            records.copy_out(k)
            pending.append(k)
            emit_read()  # records read before this launch: the step in flight covers this host work
            while len(pending) > keep:
                j = pending.pop(0)
                record = records.read(j, last_event)
                if record.gpu_ms is None:
                    record.gpu_ms = (time.perf_counter() - host_started) * 1000.0
                last_event = records.event(j) if records.cuda else None
                unemitted.append((previous, record))
                previous = record
                if not late:
                    emit_read()
                try:
                    check_progress(record)
                except DecodeStalled:
                    emit_read()  # what the steps before the stall committed still reaches the caller
                    raise
            if not bool(previous.active.any()):
                break
            full = previous.full_next & previous.active if self.status_driven else torch.zeros_like(full)
            k += 1
        emit_read()
        for j in pending:  # steps already launched after the last sequence finished: they commit nothing
            records.read(j)
        if self.stream is not None:
            self.stream.synchronize()
        return RunOutcome(steps=k + 1, graph_replays=replays, capture_s=self.capture_s)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
