"""`flash-dllm-chat bench decode` on a tiny model on the CPU: the files it writes and the errors it gives."""
from __future__ import annotations

import csv
import json

import pytest

from flash_dllm.app.cli import main

FIELDS = {"method", "batch", "ms_per_iter_min", "ms_per_iter_median", "ms_per_iter_max", "tokens_per_s",
          "tokens_per_forward", "peak_gb", "processes", "iterations_per_process"}


@pytest.mark.slow
def test_bench_decode_writes_csv_json_and_png(tiny_dream, tmp_path, capsys):
    out = tmp_path / "bench"
    code = main(["bench", "decode", "--model", str(tiny_dream), "--methods", "flash-cache,flash-verify,llada",
                 "--batch-sizes", "1,2", "--prompt-length", "12", "--gen-length", "16", "--iterations", "6",
                 "--repeats", "2", "--device", "cpu", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "decode.json").read_text())
    rows = doc["rows"]
    assert [(r["method"], r["batch"]) for r in rows] == [(m, b) for b in (1, 2) for m in
                                                         ("flash-cache", "flash-verify", "llada")]
    for row in rows:
        assert FIELDS <= set(row), set(row) ^ FIELDS
        assert row["processes"] == 2 and row["iterations_per_process"] >= 1
        assert 0 < row["ms_per_iter_min"] <= row["ms_per_iter_median"] <= row["ms_per_iter_max"]
        assert row["tokens_per_s"] > 0 and 0 < row["tokens_per_forward"] <= 16
        assert "floor_ms" not in row  # no ceilings without a GPU: no floor is claimed
    assert {r["method"]: r["forwards_per_iter"] for r in rows if r["batch"] == 1}["flash-verify"] == 2
    assert doc["environment"]["torch"] and doc["settings"]["iterations"] == 6
    with open(out / "decode.csv", newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == len(rows) and FIELDS <= set(table[0])
    assert float(table[0]["ms_per_iter_median"]) == rows[0]["ms_per_iter_median"]
    png = (out / "decode.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "ms/iter" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--methods", "flash-cache,warp-drive"], "unknown method"),
    (["--batch-sizes", "0"], "batch sizes >= 1"),
    (["--repeats", "0"], "at least 1"),
])
def test_bench_decode_rejects_bad_arguments_in_one_line(tiny_dream, tmp_path, capsys, argv, message):
    code = main(["bench", "decode", "--model", str(tiny_dream), "--device", "cpu", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and message in err and len(err.strip().splitlines()) == 1


def test_short_answers_are_generated_again_until_every_iteration_is_timed(tiny_dream, tmp_path, capsys):
    """A 4-cell answer has 3 steady steps; 7 timed iterations take several generations (a trained model's
    answers to random prompts end early the same way)."""
    out = tmp_path / "bench"
    code = main(["bench", "decode", "--model", str(tiny_dream), "--methods", "llada", "--prompt-length", "8",
                 "--gen-length", "4", "--iterations", "7", "--repeats", "1", "--device", "cpu", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    row = json.loads((out / "decode.json").read_text())["rows"][0]
    assert row["iterations_per_process"] == 7 and row["ms_per_iter_median"] > 0


def test_a_prompt_past_the_models_context_is_said_in_one_line(tiny_dream, tmp_path, capfd):
    """The defaults (800 + 512 tokens) exceed a small model's context: the worker says which flags to change,
    without a traceback, and the run stops at once."""
    code = main(["bench", "decode", "--model", str(tiny_dream), "--prompt-length", "100000", "--repeats", "3",
                 "--device", "cpu", "--out", str(tmp_path)])
    err = capfd.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert "exceed" in err and "--prompt-length" in err and "process 1 failed (exit 2)" in err
    assert not (tmp_path / "decode.json").exists()


def test_full_geometry_on_the_cpu_is_refused_with_what_to_do_instead(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "decode", "--geometry", "dream-7b"]) == 2
    err = capsys.readouterr().err
    assert "GPU benchmark" in err and "--model" in err


def test_bench_kernels_says_it_needs_a_gpu(capsys):
    assert main(["bench", "kernels"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_bench_offers_every_full_size_geometry():
    from flash_dllm.engine.bench import GEOMETRY_NAMES
    from flash_dllm.engine.geometry import GEOMETRY

    assert set(GEOMETRY_NAMES) == set(GEOMETRY)


@pytest.fixture()
def small_kernel_bench(monkeypatch):
    """bench_kernels with a small "small" geometry and a fresh table, and a counting timer (each call runs the
    timed function once per weight copy and says 2 µs): (the module, the timer, the copies it was given)."""
    from flash_dllm.engine import bench_kernels
    from flash_dllm.kernels import interpreting

    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py)")
    monkeypatch.setitem(bench_kernels.MODELS, "small", (4, 4, 16, 64, False, 1e4))
    monkeypatch.setitem(bench_kernels.MLP_WIDTH, "small", 96)
    monkeypatch.setattr(bench_kernels, "ROWS", [])
    calls = []

    def timer(fn, copies):
        for i in range(copies):
            fn(i)
        calls.append(copies)
        return 0.002

    return bench_kernels, timer, calls


def test_bench_kernels_projection_case_records_both_pipelines(small_kernel_bench):
    """The projections case on the CPU (interpreted kernels, a counting timer, a small geometry): per
    projection and row count one cuBLAS + norm row and one row of what the engine runs, with the choice."""
    bench_kernels, timer, calls = small_kernel_bench
    bench_kernels.bench_projections("small", copy_gbs=100.0, l2_bytes=1, device="cpu", timer=timer)
    rows = bench_kernels.ROWS
    assert len(rows) == 2 * 2 * len(bench_kernels.PROJECTION_ROWS) and len(calls) == len(rows)
    engine_rows = [r for r in rows if r["variant"].startswith("engine")]
    assert all(r["config"] == "cublas" and r["vs_cublas"] == 1.0 for r in engine_rows)  # the interpreter's choice
    assert {r["shape"].split()[0] for r in rows} == {"o", "down"}
    assert all(r["x_floor"] > 0 for r in rows)


def test_bench_kernels_gate_up_case_records_both_pipelines(small_kernel_bench):
    """The gate/up case on the CPU (interpreted kernels, a counting timer, a small geometry): per row count one
    cuBLAS + activation row and one row of what the engine runs, with the choice."""
    bench_kernels, timer, calls = small_kernel_bench
    bench_kernels.bench_gate_up("small", copy_gbs=100.0, l2_bytes=1, device="cpu", timer=timer)
    rows = bench_kernels.ROWS
    assert len(rows) == 2 * len(bench_kernels.PROJECTION_ROWS) and len(calls) == len(rows)
    assert {r["op"] for r in rows} == {"gate_up_silu"}
    engine_rows = [r for r in rows if r["variant"].startswith("engine")]
    assert all(r["config"] == "cublas" and r["vs_cublas"] == 1.0 for r in engine_rows)  # the interpreter's choice
    floor_ms = 2 * 96 * 64 * 2 / 100.0 / 1e6  # both weights once, at the given copy bandwidth
    assert all(r["x_floor"] == pytest.approx(0.002 / floor_ms, rel=1e-3) for r in rows)
