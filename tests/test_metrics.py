"""The stats shown beside the canvas: definitions, memory on CPU and (simulated) CUDA, the engine's numbers, and
the panel's rows (app/stats.py)."""
from __future__ import annotations

import torch

from flash_dllm.app.stats import format_bytes, stats_rows
from flash_dllm.engine import Engine, GenerationResult, GenerationSettings, StepEvent, metrics
from flash_dllm.engine.tiny import TinySpec, write_tiny_model


def test_rates_are_defined_on_generated_tokens_and_zero_safe():
    assert metrics.tokens_per_second(50, 2.0) == 25.0
    assert metrics.tokens_per_second(50, 0.0) == 0.0
    assert metrics.tokens_per_forward(60, 20) == 3.0
    assert metrics.tokens_per_forward(5, 0) == 0.0
    assert metrics.mean_step_ms(0.5, 25) == 20.0
    assert metrics.mean_step_ms(1.0, 0) == 0.0


def test_run_stats_fold_step_events_and_take_the_final_result():
    stats = metrics.RunStats(gen_length=64)
    stats.update(StepEvent(seq=0, step=0, committed=[3], forward_passes=2, verify_passes=1, generated_tokens=1,
                           elapsed_s=0.01, step_ms=10.0, drafted=[4, 5], accepted=[4], rejected=[5]))
    stats.update(StepEvent(seq=0, step=9, committed=[6, 7], forward_passes=20, verify_passes=10, generated_tokens=30,
                           elapsed_s=0.5, step_ms=4.0, drafted=[8], accepted=[], rejected=[8]))
    assert (stats.steps, stats.forward_passes, stats.verify_passes) == (10, 20, 10)
    assert stats.tokens_per_s == 60.0
    assert stats.tokens_per_forward == 1.5
    assert stats.last_step_ms == 4.0 and stats.mean_step_ms == 50.0
    assert (stats.accepted_drafts, stats.rejected_drafts) == (1, 2)
    result = GenerationResult(text="x", token_ids=list(range(40)), forward_passes=25, steps=12, elapsed_s=0.8,
                              tokens_per_s=50.0, method="flash-verify", model="m", finish_reason="eos",
                              verify_passes=12, accepted_drafts=7, rejected_drafts=3)
    stats.finish(result)
    assert stats.tokens_per_s == result.tokens_per_s
    assert stats.tokens_per_forward == 40 / 25
    assert stats.finish_reason == "eos" and (stats.accepted_drafts, stats.rejected_drafts) == (7, 3)
    labels = [label for label, _ in stats_rows(stats, None, None)]
    assert labels[:7] == ["tokens/s", "tokens/forward", "forward passes", "steps", "step time", "elapsed", "answer length"]
    assert "drafts accepted" in labels


def test_memory_on_cpu_reports_ram_and_no_vram():
    snap = metrics.memory_snapshot("cpu")
    assert snap.device_type == "cpu"
    assert snap.ram_process > 0 and 0 < snap.ram_used <= snap.ram_total
    assert snap.vram_allocated is None and snap.vram_device_total is None
    rows = dict(stats_rows(None, snap, {"model": "m", "device": "cpu", "dtype": "float32", "kernels": "torch"}))
    assert "RAM process" in rows and "VRAM process" not in rows
    assert rows["kernels"] == "torch" and rows["device"] == "cpu"
    metrics.reset_peak("cpu")  # a no-op without CUDA, never raises


def test_memory_on_cuda_uses_allocator_and_driver_numbers(monkeypatch):
    gib = 1024**3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: 3 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda index: 5 * gib)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 6 * gib)
    used = {"free": 10 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (used["free"], 24 * gib))
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda index: resets.append(index))
    tracker = metrics.MemoryTracker("cuda:0")
    tracker.start()
    assert resets == [0]
    used["free"] = 4 * gib
    tracker.sample()
    used["free"] = 12 * gib
    snap = tracker.sample()
    assert snap.device_type == "cuda"
    assert (snap.vram_allocated, snap.vram_peak, snap.vram_reserved) == (3 * gib, 5 * gib, 6 * gib)
    assert (snap.vram_device_used, snap.vram_device_total) == (12 * gib, 24 * gib)
    assert tracker.device_peak == 20 * gib  # the highest device-wide use seen, not the last one
    rows = dict(stats_rows(None, snap, None, tracker.device_peak))
    assert rows["VRAM process"].startswith("3.00 GiB (peak 5.00 GiB")
    assert rows["VRAM device"] == "12.00 GiB of 24.00 GiB (peak 20.00 GiB)"


def test_format_bytes():
    assert format_bytes(None) == "–"
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 1024**3) == "3.00 GiB"


def test_live_stats_from_a_real_engine_match_its_result(tmp_path):
    folder = write_tiny_model(tmp_path / "tiny", TinySpec("llada"))
    engine = Engine.load(str(folder), device="cpu")
    stats = metrics.RunStats()
    events = []
    results = engine.generate(["hi"], GenerationSettings(method="flash-verify", gen_length=32, block_length=16),
                              on_event=events.append)
    steps = [e for e in events if isinstance(e, StepEvent)]
    for event in steps:
        stats.update(event)
    result = results[0]
    assert stats.steps == result.steps == len(steps)
    assert stats.forward_passes == result.forward_passes and stats.verify_passes == result.verify_passes
    assert stats.generated_tokens == len(result.token_ids)
    assert stats.tokens_per_s == stats.generated_tokens / steps[-1].elapsed_s
    stats.finish(result)
    assert abs(stats.tokens_per_s - result.tokens_per_s) < 1e-3 * max(1.0, result.tokens_per_s)
    assert abs(stats.tokens_per_forward - result.tokens_per_forward) < 1e-3


def test_results_take_their_rates_from_the_metric_definitions(tmp_path, monkeypatch):
    """GenerationResult's tokens/s and tokens/forward are metrics.tokens_per_second / tokens_per_forward (one
    definition), not a second formula beside them."""
    import flash_dllm.engine.engine as engine_module

    folder = write_tiny_model(tmp_path / "tiny", TinySpec("llada"))
    engine = Engine.load(str(folder), device="cpu")
    seen = []
    monkeypatch.setattr(engine_module, "tokens_per_second", lambda tokens, elapsed: seen.append("s") or 1234.5)
    monkeypatch.setattr(engine_module, "tokens_per_forward", lambda tokens, forwards: seen.append("f") or 6.5)
    (result,) = engine.generate(["hi"], GenerationSettings(method="llada", gen_length=8, block_length=8, steps=2))
    assert (result.tokens_per_s, result.tokens_per_forward) == (1234.5, 6.5) and sorted(seen) == ["f", "s"]
