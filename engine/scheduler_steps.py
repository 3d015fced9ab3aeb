"""The scheduler's step loop for one batch (engine/scheduler.py): admit, lay out, launch, read late, route.

Each iteration: retire cancelled slots, admit waiting requests (within the step's prefill budget), lay out the
step (the newcomers' whole prompts and fast-dllm's block starts run eagerly beside the others' steady steps; a step with only steady
slots replays the graph of its slot-count bucket), launch it, and turn the records that are ready into each
request's events. A record also says when a slot's sequence ended: its request is answered and its slot and KV
rows are free for the next request at once.
"""
from __future__ import annotations

import contextlib
import time

import torch

from flash_dllm.engine.events import SequenceDone
from flash_dllm.engine.metrics import tokens_per_forward, tokens_per_second
from flash_dllm.engine.packing import Layout, groups_for
from flash_dllm.engine.scheduler import Occupant, initial_row
from flash_dllm.engine.settings import GenerationResult
from flash_dllm.engine.decode_loop import DecodeStalled, check_progress
from flash_dllm.engine.step_records import HostRecord, step_events

MAX_ROWS = 4096  # query rows per eager forward


def bucket(n: int, limit: int) -> int:
    """The smallest power of two >= n (at most limit): graphs are captured per bucket of slot counts."""
    size = 1
    while size < n:
        size *= 2
    return min(size, limit)


class BatchRun:
    def __init__(self, scheduler):
        self.scheduler, self.session = scheduler, scheduler.session
        canvas, method = self.session.canvas, self.session.method
        verifier = self.session.verifier
        self.previous = HostRecord.initial(canvas, method.readout, verifier.cap if verifier else 0)
        self.spare = canvas.n_slots - 1
        self.step_index = 0
        self.in_flight: list[int] = []
        self.unrouted: list[tuple[HostRecord, HostRecord, int]] = []  # (previous, record, step) read, not yet routed
        self.last_event = None

    def loop(self) -> None:
        session = self.session
        stream = torch.cuda.stream(session.stream) if session.stream is not None else contextlib.nullcontext()
        with stream:
            while True:
                self._retire_cancelled()
                admitted = self.scheduler.admit(self.step_index)  # their canvases were announced when queued
                if not self.scheduler.occupants:
                    self._refuse_what_cannot_fit()
                    break
                full = set(admitted)
                if session.status_driven:  # fast-dllm: whose block starts follows the last record
                    full |= {s for s in self.scheduler.occupants if bool(self.previous.full_next[s])}
                started = time.perf_counter()
                session.launch(self._layouts(full))
                session.records.copy_out(self.step_index)
                self.in_flight.append(self.step_index)
                self._route_read()  # records read before this launch: the step in flight covers this host work
                while len(self.in_flight) > session.read_lag:
                    self._read(self.in_flight.pop(0), started)
                # routed after the next launch (DecodeSession.events_after_launch), unless no slot goes on: then
                # the finished requests must leave before the loop asks whether any remain
                if not session.events_after_launch or not bool(self.previous.active.any()):
                    self._route_read()
                self.step_index += 1
            if session.stream is not None:
                session.stream.synchronize()

    # ---- layout ------------------------------------------------------------------------------------------
    def _layouts(self, full: set[int]) -> list[Layout]:
        session, occupants = self.session, self.scheduler.occupants
        slots = sorted(occupants)
        steady = session.method.steady_rows
        totals = {s: occupants[s].rows for s in slots}
        if not full and all(totals[s] >= steady for s in slots):
            size = bucket(len(slots), self.scheduler.max_slots)
            layout = Layout.uniform(size, steady, dynamic=True)
            session.packer.assign(layout, slots + [self.spare] * (size - len(slots)))
            return [layout]
        budgets = [totals[s] if s in full else min(steady, totals[s]) for s in slots]
        return groups_for(budgets, MAX_ROWS, slots)

    # ---- requests ----------------------------------------------------------------------------------------
    def _retire_cancelled(self) -> None:
        for slot, occupant in self.scheduler.occupants.items():
            if occupant.request.cancelled and not occupant.retired:
                self.session.canvas.retire(slot)
                occupant.retired = True

    def _refuse_what_cannot_fit(self) -> None:
        """With every slot free, a head request that still does not fit never will: answer it with an error."""
        from flash_dllm.engine.engine import EngineError

        head = self.scheduler._head()
        if head is not None and head.waiting_for and head.waiting_for.startswith("memory"):
            with self.scheduler.wake:
                self.scheduler.pending.popleft()
            head.finish(error=EngineError(f"the request ({head.prompt_tokens} + {head.settings.gen_length} tokens) "
                                          "does not fit in the device's memory; ask for a shorter answer"))

    def _read(self, index: int, started: float) -> None:
        records = self.session.records
        record = records.read(index, self.last_event)
        if record.gpu_ms is None:
            record.gpu_ms = (time.perf_counter() - started) * 1000.0
        self.last_event = records.event(index) if records.cuda else None
        occupants = self.scheduler.occupants
        for slot, occupant in occupants.items():
            if occupant.admitted_step == index:  # the slot's previous occupant is not this one's history
                gen = occupant.request.settings.gen_length
                self.previous.answer[slot] = initial_row(self.previous.answer[slot], gen, self.session.canvas.eos_id)
                self.previous.end[slot] = occupant.request.settings.gen_length
        self.unrouted.append((self.previous, record, index))
        self.previous = record
        try:
            check_progress(record)  # raises: the scheduler ends the requests in flight with the error
        except DecodeStalled:
            self._route_read()
            raise

    def _route_read(self) -> None:
        """Each read record's events to its requests, in step order; a request whose sequence ended is answered."""
        occupants = self.scheduler.occupants
        for previous, record, index in self.unrouted:
            now = time.perf_counter()
            for event in step_events(previous, record, self.scheduler.engine.tokenizer.piece, 0.0):
                occupant = occupants.get(event.seq)
                if occupant is None or index < occupant.admitted_step:
                    continue
                event.seq, event.elapsed_s = 0, now - occupant.started
                occupant.request.emit(event)
            for slot in [s for s, o in occupants.items() if index >= o.admitted_step and not bool(record.active[s])]:
                self._finish(slot, record, now)
        self.unrouted.clear()

    def _finish(self, slot: int, record: HostRecord, now: float) -> None:
        occupant = self.scheduler.occupants[slot]
        result = result_from_record(self.scheduler.engine, occupant, record, slot, now - occupant.started)
        self.scheduler.release(slot)
        occupant.request.emit(SequenceDone(0, result.text, result.token_ids, result.finish_reason))
        occupant.request.finish(result)


def result_from_record(engine, occupant: Occupant, record: HostRecord, slot: int, elapsed: float) -> GenerationResult:
    s = occupant.request.settings
    end, gen = int(record.end[slot]), int(record.gen_len[slot])
    answer = record.answer[slot, :gen]
    stop = end if end < gen else gen
    ids = [t for t in answer[:stop].tolist() if t >= 0]
    if end < gen:
        reason = "eos"
    else:
        reason = "cancelled" if bool((answer < 0).any()) else "length"
    forwards, verifies = int(record.forward_passes[slot]), int(record.verify_passes[slot])
    return GenerationResult(
        text=engine.tokenizer.decode(ids), token_ids=ids, forward_passes=forwards, steps=int(record.steps[slot]),
        elapsed_s=round(elapsed, 4), tokens_per_s=round(tokens_per_second(len(ids), elapsed), 3), method=s.method,
        model=engine.name, finish_reason=reason, verify_passes=verifies, draft_passes=forwards - verifies,
        accepted_drafts=int(record.accepted_total[slot]), rejected_drafts=int(record.rejected_total[slot]),
        tokens_per_forward=round(tokens_per_forward(len(ids), forwards), 3), kernels=engine.kernels,
        prompt_tokens=len(occupant.ids), settings=s.to_dict())
