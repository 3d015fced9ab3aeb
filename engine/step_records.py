"""What a device step leaves for the host, and the StepEvents the host makes of it, a step or two later.

At the end of every step the device writes a fixed-size record (the canvas after the step, the step's
candidate cells, Flash-Verify's candidates and how many were accepted, the counters) into a device buffer that
is part of the step (so a replayed graph writes it too); the loop then copies it into one of a few pinned host
buffers without waiting. The host reads record k once the step after it is already running, and turns the
difference between records k-1 and k into exactly the StepEvents the host reference emits for that step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from flash_dllm.engine.device_canvas import DeviceCanvas
from flash_dllm.engine.events import StepEvent

RING = 4  # pinned host copies in flight; the loop reads a record at most two steps after it was written
# [S] fields of the record in buffer order: the canvas's counters (record name: canvas attribute), then flags
COUNTERS = {"end": "end", "gen_len": "gen_len", "accepted_total": "accepted", "rejected_total": "rejected",
            "steps": "steps", "forward_passes": "forward_passes", "verify_passes": "verify_passes"}
FLAGS = ("was_active", "active", "full_next", "official_end")


@dataclass
class HostRecord:
    """One step's record on the host (CPU tensors, copied out of the pinned ring)."""

    answer: torch.Tensor  # [S, G]
    confidence: torch.Tensor  # [S, G]
    cells: torch.Tensor  # [S, R] the step's candidate cells (-1 none)
    verify_cells: torch.Tensor  # [S, C] Flash-Verify candidates in confidence order (-1 none)
    verify_drafts: torch.Tensor  # [S, C]
    accepted: torch.Tensor  # [S] accepted prefix length
    accepted_total: torch.Tensor  # [S] drafts accepted so far
    rejected_total: torch.Tensor  # [S]
    end: torch.Tensor  # [S]
    gen_len: torch.Tensor  # [S]
    steps: torch.Tensor  # [S] after the step
    forward_passes: torch.Tensor  # [S]
    verify_passes: torch.Tensor  # [S]
    was_active: torch.Tensor  # [S] took part in the step
    active: torch.Tensor  # [S] still decoding after it
    full_next: torch.Tensor  # [S] the next step recomputes every position
    official_end: torch.Tensor  # [S] the official end rule: no padding after the end (engine/sequence.py)
    gpu_ms: float | None = None  # GPU time from the previous record's end to this one's (CUDA only)

    @classmethod
    def initial(cls, canvas: DeviceCanvas, readout: int, cap: int) -> "HostRecord":
        S = canvas.n_slots
        none = torch.full((S, max(cap, 1)), -1, dtype=torch.int64)
        zero = torch.zeros(S, dtype=torch.int64)
        return cls(answer=canvas.answer.cpu().clone(), confidence=canvas.confidence.cpu().clone(),
                   cells=torch.full((S, readout), -1, dtype=torch.int64), verify_cells=none, verify_drafts=none,
                   accepted=zero, accepted_total=zero, rejected_total=zero, end=canvas.end.cpu().clone(),
                   gen_len=canvas.gen_len.cpu().clone(), steps=zero,
                   forward_passes=zero, verify_passes=zero, was_active=torch.zeros(S, dtype=torch.bool),
                   active=canvas.active.cpu().clone(), full_next=torch.ones(S, dtype=torch.bool),
                   official_end=canvas.official_end.cpu().clone())


class StepRecords:
    """The device record buffer, its pinned host ring and the events that order the copies."""

    def __init__(self, canvas: DeviceCanvas, readout: int, cap: int):
        S, G, C = canvas.n_slots, canvas.width, max(cap, 1)
        # Fields written together are neighbours, so one stacking kernel writes each group (see `write`).
        self.shapes = {"answer": (S, G), "cells": (S, readout), "verify_cells": (S, C), "verify_drafts": (S, C),
                       "accepted": (S,), **{name: (S,) for name in (*COUNTERS, *FLAGS)}}
        sizes = {name: int(torch.Size(shape).numel()) for name, shape in self.shapes.items()}
        self.offsets, total = {}, 0
        for name, size in sizes.items():
            self.offsets[name] = (total, size)
            total += size
        device = canvas.answer.device
        self.cuda = device.type == "cuda"
        self.ints = torch.zeros(total, dtype=torch.int64, device=device)
        self.floats = torch.zeros((S, G), dtype=torch.float64, device=device)
        self._view(self.ints, "verify_cells").fill_(-1)  # methods without a verifier never write these
        self._counters, self._flags = self._group(tuple(COUNTERS)), self._group(FLAGS)
        self._verify = self._group(("verify_cells", "verify_drafts"))
        pin = dict(pin_memory=True) if self.cuda else {}
        self.host_ints = [torch.zeros(total, dtype=torch.int64, **pin) for _ in range(RING)]
        self.host_floats = [torch.zeros((S, G), dtype=torch.float64, **pin) for _ in range(RING)]
        self.done = [torch.cuda.Event(enable_timing=True) if self.cuda else None for _ in range(RING)]
        self.cap = cap

    def _view(self, flat: torch.Tensor, name: str) -> torch.Tensor:
        start, size = self.offsets[name]
        return flat[start: start + size].view(self.shapes[name])

    def write(self, canvas: DeviceCanvas, cells: torch.Tensor, was_active: torch.Tensor, full_next: torch.Tensor,
              verify_cells: torch.Tensor | None = None, verify_drafts: torch.Tensor | None = None,
              accepted: torch.Tensor | None = None) -> None:
        """Device side, at the end of a step (inside a captured graph too)."""
        self._view(self.ints, "answer").copy_(canvas.answer)
        self._view(self.ints, "cells").copy_(cells)
        torch.stack([getattr(canvas, attribute) for attribute in COUNTERS.values()], out=self._counters)
        self._flags.copy_(torch.stack([was_active, canvas.active, full_next, canvas.official_end]))
        if verify_cells is not None:
            torch.stack([verify_cells, verify_drafts], out=self._verify)
            self._view(self.ints, "accepted").copy_(accepted)
        self.floats.copy_(canvas.confidence)

    def _group(self, names) -> torch.Tensor:
        """[len(names), *shape] view over neighbouring fields of one shape."""
        start, size = self.offsets[names[0]]
        if any(self.offsets[n] != (start + i * size, size) for i, n in enumerate(names)):
            raise AssertionError(f"record fields {names} are not neighbours")
        return self.ints[start: start + len(names) * size].view(len(names), *self.shapes[names[0]])

    def copy_out(self, k: int) -> None:
        """Queue the copy of the device record into ring slot k % RING (no waiting)."""
        slot = k % RING
        self.host_ints[slot].copy_(self.ints, non_blocking=self.cuda)
        self.host_floats[slot].copy_(self.floats, non_blocking=self.cuda)
        if self.cuda:
            self.done[slot].record()

    def ready(self, k: int) -> bool:
        return not self.cuda or self.done[k % RING].query()

    def read(self, k: int, previous_event=None) -> HostRecord:
        """Wait for record k's copy and take it out of the ring."""
        slot = k % RING
        gpu_ms = None
        if self.cuda:
            self.done[slot].synchronize()
            if previous_event is not None:
                gpu_ms = previous_event.elapsed_time(self.done[slot])
        ints = self.host_ints[slot].clone()
        fields = {name: self._view(ints, name) for name in self.shapes}
        for name in ("was_active", "active", "full_next", "official_end"):
            fields[name] = fields[name].bool()
        return HostRecord(confidence=self.host_floats[slot].clone(), gpu_ms=gpu_ms, **fields)

    def event(self, k: int):
        return self.done[k % RING]


def step_events(previous: HostRecord, record: HostRecord, piece, started: float) -> list[StepEvent]:
    """The StepEvents of one step: per sequence that took part, the cells it committed (the draft commit's in
    cell order, then accepted drafts in candidate order; never cells that became padding), its window, its
    drafts, padding_from when its end token arrived, and its counters."""
    events = []
    cells_g = torch.arange(record.answer.shape[1])
    now = time.perf_counter()
    for s in torch.nonzero(record.was_active).flatten().tolist():
        end, gen = int(record.end[s]), int(record.gen_len[s])
        stop = end if end < gen else gen
        limit = gen if bool(record.official_end[s]) else min(end + 1, gen)
        new = (previous.answer[s] < 0) & (record.answer[s] >= 0) & (cells_g < limit)
        candidates = [c for c in record.verify_cells[s].tolist() if c >= 0]
        n_acc = int(record.accepted[s])
        accepted, rejected = candidates[:n_acc], candidates[n_acc:]
        new_cells = torch.nonzero(new).flatten().tolist()
        accepted_set = set(accepted)
        committed = [c for c in new_cells if c not in accepted_set] + [c for c in accepted if bool(new[c])]
        answer = record.answer[s]
        tokens = [int(answer[c]) for c in committed]
        extra = {}
        if candidates:
            drafts = record.verify_drafts[s, : len(candidates)].tolist()
            extra = dict(drafted=candidates, draft_tokens=drafts, draft_pieces=[piece(t) for t in drafts],
                         accepted=accepted, rejected=rejected)
        ended = end < gen and end != int(previous.end[s]) and not bool(record.official_end[s])
        events.append(StepEvent(
            seq=s, step=int(record.steps[s]) - 1, committed=committed, tokens=tokens,
            pieces=[piece(t) for t in tokens],
            confidences=[round(float(record.confidence[s, c]), 4) for c in committed],
            window=[c for c in record.cells[s].tolist() if c >= 0],
            padding_from=end + 1 if ended else None,
            forward_passes=int(record.forward_passes[s]), verify_passes=int(record.verify_passes[s]),
            generated_tokens=int((answer[:stop] >= 0).sum()), elapsed_s=now - started,
            step_ms=record.gpu_ms if record.gpu_ms is not None else 0.0, **extra))
    return events
