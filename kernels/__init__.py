"""Triton kernels of flash-dllm-chat, one op per file.

Each op module holds a plain-PyTorch reference, a Triton kernel and a dispatcher. The dispatcher takes
``backend``: "triton" (CUDA, or the CPU interpreter when TRITON_INTERPRET=1) or "torch" (the reference).
fused_qkv_rope_cache and split_k_linear also have op objects (FusedQKVRopeCache, SkinnyLinear) that make their
constant decisions (which kernel, which config) once per problem, for hot loops and CUDA graphs. Nothing here
imports model code.
"""
from __future__ import annotations

import importlib
import os

import torch

BACKENDS = ("triton", "torch")


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (must be set before import)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - triton missing on some platforms
        return False
    return True


def bind_backend(backend: str, reference, triton_module: str, triton_name: str):
    """The implementation of an op for `backend`: its torch reference, or its Triton entry point imported from
    `triton_module` (relative to this package) now, so a call never imports."""
    if backend == "torch":
        return reference
    if backend == "triton":
        return getattr(importlib.import_module(triton_module, __name__), triton_name)
    raise ValueError(f"unknown kernel backend {backend!r}")


def resolve_backend(requested: str | None, device: torch.device | str) -> str:
    """Pick the kernel path: default Triton on CUDA and the torch reference on CPU.

    An explicit "triton" on CPU is honoured only under TRITON_INTERPRET=1 (tests); otherwise it is an error
    with a message that says why, because silently falling back would make an explicit choice lie.
    """
    device = torch.device(device)
    if requested in (None, "", "auto"):
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if requested not in BACKENDS:
        raise ValueError(f"unknown kernel path {requested!r}; choose one of: {', '.join(BACKENDS)}")
    if requested == "triton":
        if not triton_available():
            raise ValueError("kernel backend 'triton': the triton package is not installed")
        if device.type != "cuda" and not interpreting():
            raise ValueError("kernel backend 'triton' needs a CUDA device "
                             "(or TRITON_INTERPRET=1 for the CPU interpreter)")
    return requested


def gpu_time_ms(fn, reps: int = 20, quantiles=None):
    """Median CUDA time (ms) of fn() alone, L2 cold, host launch cost hidden; a list for `quantiles`.

    Before each timed call the stream clears a 256 MB buffer (evicting L2) and then spins for ~1 ms
    (torch.cuda._sleep), so the host has issued fn's launches before the GPU reaches them and the events time
    the kernels, not the launch gap. triton.testing.do_bench times that gap too whenever fn's host cost
    exceeds its flush (~100-250 us for a Triton launch with tensor descriptors, far more than a 20-40 us
    kernel), which made autotuning at small token counts pick by noise. Used by the autotuners (Triton's
    `do_bench=` hook) and the fused QKV path's own tuning; signature-compatible with do_bench's call there.
    """
    fn()
    torch.cuda.synchronize()
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        flush.zero_()
        torch.cuda._sleep(2_000_000)  # cycles: ~1 ms at H200 clocks
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends)])
    if quantiles is None:
        return times.median().item()
    return torch.quantile(times, torch.tensor(list(quantiles))).tolist()


def graph_replay_ms(graph, reps: int = 200) -> float:
    """Median time (ms) of one replay of a captured torch.cuda.CUDAGraph, each replay timed with CUDA events."""
    graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends)]).median().item()
