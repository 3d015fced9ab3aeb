"""Helpers shared by the decoder tests: step events without timings, and CUDA graph vs eager runs."""
from __future__ import annotations

import os

import pytest
import torch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                                reason="CUDA graphs need a CUDA device (and compiled Triton kernels)")


def step_fields(events) -> list[dict]:
    """StepEvents without their timings, in a canonical order (the reference emits per step in slot order too)."""
    rows = [{k: v for k, v in e.to_dict().items() if k not in ("elapsed_s", "step_ms")}
            for e in events if getattr(e, "kind", "") == "step"]
    return sorted(rows, key=lambda r: (r["step"], r["seq"]))


def graph_and_eager(engine, prompts, s):
    """The same call replayed as CUDA graphs and run eagerly (fresh sessions both)."""
    outcomes = []
    for graphs in (True, False):
        engine.graphs, engine._decode = graphs, None
        events = []
        results = engine.generate(prompts, s, on_event=events.append)
        outcomes.append((results, step_fields(events), engine.last_run))
    engine.graphs, engine._decode = True, None
    return outcomes
