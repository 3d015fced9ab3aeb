"""Helpers shared by the decoder tests: step events without timings, the device decoder against the host
reference, and CUDA graph vs eager runs."""
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


def compare_to_reference(engine, s, prompts, lag: int | None = None, events_match=None, defer: bool = False):
    """Generate with the device decoder and with the host reference (engine/host_reference.py); assert the same
    answers, counts and finish reasons, and the same step events (``events_match(device, reference)``, default
    equality). ``lag``: build this shape's session first, then keep its host that many steps ahead of its
    reads. ``defer``: likewise, then build a record's events after the next launch, as on a GPU (for a method
    that reads each record at once). Returns (results, reference states)."""
    from flash_dllm.engine.host_reference import run_reference

    if lag is not None or defer:
        engine.generate(prompts, s)
        if lag is not None:
            engine._decode[1].lag = lag
        engine._decode[1].defer_events = defer
    device_events, reference_events = [], []
    results = engine.generate(prompts, s, on_event=device_events.append)
    states = engine.new_states(prompts, s)
    run_reference(engine.model, engine.ops, s, states, emit=reference_events.append, piece=engine.tokenizer.piece)
    assert [r.token_ids for r in results] == [st.answer_ids() for st in states]
    for name in ("forward_passes", "verify_passes", "accepted_drafts", "steps", "finish_reason"):
        assert [getattr(r, name) for r in results] == [getattr(st, name) for st in states], name
    device, reference = step_fields(device_events), step_fields(reference_events)
    assert (events_match or (lambda a, b: a == b))(device, reference)
    return results, states
