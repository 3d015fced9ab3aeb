"""The run's numbers, defined once: speed from engine events and results, memory from the device.

GenerationResult, the CLI and the UI's stats panel (app/stats.py) take their rates from the functions
here. Definitions (the README uses exactly these):
* tokens/s          generated answer tokens (committed, before the end token; never prompt or EOS padding)
                    divided by the engine's wall time of the run (the events' ``elapsed_s``; the final value
                    comes from the result, measured after the device synchronised).
* tokens/forward    generated tokens divided by forward passes (draft and verify passes both count).
* step time         the last step's wall time, and the mean (elapsed / steps).
* VRAM (CUDA)       process: bytes held by this process's tensors now (``memory_allocated``), its peak since
                    the run started (``max_memory_allocated``) and what the caching allocator reserved;
                    device-wide: total minus free as the driver reports it (``mem_get_info``, counts every
                    process on the GPU), and the highest such value seen during the run.
* RAM               resident memory of this process and of the whole machine (psutil).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import psutil
import torch


def tokens_per_second(generated_tokens: int, elapsed_s: float) -> float:
    return generated_tokens / elapsed_s if elapsed_s > 0 else 0.0


def tokens_per_forward(generated_tokens: int, forward_passes: int) -> float:
    return generated_tokens / forward_passes if forward_passes > 0 else 0.0


def mean_step_ms(elapsed_s: float, steps: int) -> float:
    return 1000.0 * elapsed_s / steps if steps > 0 else 0.0


@dataclass
class RunStats:
    """Speed counters of one sequence, folded from its StepEvents (all cumulative except ``last_step_ms``)."""

    gen_length: int = 0
    generated_tokens: int = 0
    forward_passes: int = 0
    verify_passes: int = 0
    steps: int = 0
    elapsed_s: float = 0.0
    last_step_ms: float = 0.0
    accepted_drafts: int = 0  # Flash-Verify
    rejected_drafts: int = 0
    finish_reason: str = ""  # "" while running, else "eos" | "length" | "cancelled"

    def update(self, event) -> None:
        """Fold one engine StepEvent (only its cumulative counters; cheap enough for every step)."""
        self.generated_tokens = event.generated_tokens
        self.forward_passes = event.forward_passes
        self.verify_passes = event.verify_passes
        self.steps = event.step + 1
        self.elapsed_s = event.elapsed_s
        self.last_step_ms = event.step_ms
        self.accepted_drafts += len(event.accepted)
        self.rejected_drafts += len(event.rejected)

    def finish(self, result) -> None:
        """Take the final numbers from the engine's GenerationResult (timed after device synchronisation)."""
        self.generated_tokens = len(result.token_ids)
        self.forward_passes = result.forward_passes
        self.verify_passes = result.verify_passes
        self.steps = result.steps
        self.elapsed_s = result.elapsed_s
        self.accepted_drafts = result.accepted_drafts
        self.rejected_drafts = result.rejected_drafts
        self.finish_reason = result.finish_reason

    @property
    def tokens_per_s(self) -> float:
        return tokens_per_second(self.generated_tokens, self.elapsed_s)

    @property
    def tokens_per_forward(self) -> float:
        return tokens_per_forward(self.generated_tokens, self.forward_passes)

    @property
    def mean_step_ms(self) -> float:
        return mean_step_ms(self.elapsed_s, self.steps)


@dataclass
class MemorySnapshot:
    device_type: str
    ram_process: int = 0
    ram_used: int = 0
    ram_total: int = 0
    vram_allocated: int | None = None  # this process, now
    vram_peak: int | None = None  # this process, since reset_peak
    vram_reserved: int | None = None
    vram_device_used: int | None = None  # whole GPU, every process
    vram_device_total: int | None = None


def _cuda_index(device) -> int | None:
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def memory_snapshot(device=None) -> MemorySnapshot:
    """RAM always; VRAM when ``device`` is a CUDA device and CUDA is available (never raises on CPU builds)."""
    vm = psutil.virtual_memory()
    snap = MemorySnapshot(device_type="cpu", ram_process=psutil.Process().memory_info().rss,
                          ram_used=vm.total - vm.available, ram_total=vm.total)
    index = _cuda_index(device)
    if index is None:
        return snap
    snap.device_type = "cuda"
    snap.vram_allocated = torch.cuda.memory_allocated(index)
    snap.vram_peak = torch.cuda.max_memory_allocated(index)
    snap.vram_reserved = torch.cuda.memory_reserved(index)
    free, total = torch.cuda.mem_get_info(index)
    snap.vram_device_used, snap.vram_device_total = total - free, total
    return snap


def reset_peak(device=None) -> None:
    """Start a new peak window for ``vram_peak`` (no-op without CUDA)."""
    index = _cuda_index(device)
    if index is not None:
        torch.cuda.reset_peak_memory_stats(index)


@dataclass
class MemoryTracker:
    """Samples memory during a run and keeps the device-wide peak (the driver keeps none)."""

    device: object = None
    last: MemorySnapshot | None = None
    device_peak: int = 0
    ram_peak: int = 0
    history: list = field(default_factory=list)

    def start(self) -> MemorySnapshot:
        reset_peak(self.device)
        self.device_peak = self.ram_peak = 0
        return self.sample()

    def sample(self) -> MemorySnapshot:
        self.last = memory_snapshot(self.device)
        self.device_peak = max(self.device_peak, self.last.vram_device_used or 0)
        self.ram_peak = max(self.ram_peak, self.last.ram_process)
        return self.last
