"""`flash-dllm-chat bench decode`: how fast the decode step runs on this machine, against its physical floors.

For every method x batch size, each of `--repeats` separate processes (so one process's slow phase cannot
decide a number) measures, in the same process: the device-to-device copy bandwidth and the bf16 matmul ceiling
(on a GPU), then one warm-up generation (Triton compiles and tunes, the steady step is captured as a CUDA
graph) and one timed generation. An iteration is one step of the decode loop (two forward passes for
flash-verify); its time is the GPU-timeline gap between consecutive step records, so it includes any idle
time the host causes. Per process the median over the timed iterations is kept; the table reports the min,
median and max of those medians. Processes alternate the order of the cells.

Floors: weight_floor_ms = bytes of the weights / copy bandwidth (streaming every weight once; the embedding is
counted although a step only gathers its rows), compute_floor_ms = FLOPs of one iteration / matmul ceiling,
floor_ms = the larger, x_floor = median / floor_ms. tokens_per_s = generated tokens (not prompt, not padding)
over the wall time of the timed generation after synchronising; tokens_per_forward beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from flash_dllm.engine.bench_report import write_outputs

# engine/geometry.py's GEOMETRY keys, named here so that `bench --help` imports no torch (a test keeps them equal)
GEOMETRY_NAMES = ("llada-8b", "dream-7b", "llada-moe", "llada2-mini")

SKIP = 3  # iterations not timed: the first step (whole prompts), and the steps the loop runs before replaying


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flash-dllm-chat bench",
                                     description="`bench decode`: how fast the decode step runs on this machine, "
                                                 "against its physical floors; `bench kernels`: the Triton kernels "
                                                 "against the torch paths they replace.")
    sub = parser.add_subparsers(dest="what", metavar="WHAT", required=True)
    decode = sub.add_parser("decode", help="time the decode step of every method against the floors")
    source = decode.add_mutually_exclusive_group()
    source.add_argument("--model", help="a model folder or Hugging Face repo id")
    source.add_argument("--geometry", choices=list(GEOMETRY_NAMES),
                        help="random weights at this model's full geometry (default without --model: llada-8b)")
    decode.add_argument("--methods", default="flash-cache,flash-verify,fast-dllm", help="comma-separated methods")
    decode.add_argument("--batch-sizes", default="1", help="comma-separated batch sizes (e.g. 1,8,32)")
    decode.add_argument("--prompt-length", type=int, default=800, help="prompt tokens (random ids)")
    decode.add_argument("--gen-length", type=int, default=512, help="answer length")
    decode.add_argument("--iterations", type=int, default=400, help="timed iterations per process and cell")
    decode.add_argument("--repeats", type=int, default=5, help="separate processes")
    decode.add_argument("--device", default="auto")
    decode.add_argument("--kernels", choices=["triton", "torch"], help="kernel backend (default: triton on GPU)")
    decode.add_argument("--no-graphs", action="store_true", help="run every step eagerly")
    decode.add_argument("--out", default="bench-results", help="folder for decode.csv / decode.json / decode.png")
    decode.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one process's share, JSON out path
    decode.add_argument("--rotation", type=int, default=0, help=argparse.SUPPRESS)
    kernels = sub.add_parser("kernels", help="time the Triton kernels against the torch paths they replace",
                             add_help=False)
    kernels.add_argument("rest", nargs=argparse.REMAINDER)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["kernels"]:  # everything after `kernels` belongs to the kernel benchmark
        from flash_dllm.engine.bench_kernels import main as kernels_main

        return int(kernels_main(argv[1:]) or 0)
    args = parse_args(argv)
    if args.worker:
        from flash_dllm.engine.bench_worker import run_worker
        from flash_dllm.engine.settings import SettingsError

        try:
            rows = run_worker(args)
        except SettingsError as err:  # settings this model cannot run: say so, without a traceback
            print(f"error: {err}", file=sys.stderr)
            return 2
        Path(args.worker).write_text(json.dumps(rows))
        return 0
    return run_decode(args)


def cells_of(args) -> list[tuple[str, int]]:
    from flash_dllm.engine.methods import METHODS

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if not methods or not batches or min(batches) < 1:
        raise ValueError("give at least one method and batch sizes >= 1")
    return [(m, b) for b in batches for m in methods]


def run_decode(args) -> int:
    cells_of(args)  # a bad method or batch size fails before any process starts
    if args.repeats < 1 or args.iterations < 1:
        raise ValueError("--repeats and --iterations must be at least 1")
    if not args.model and not _on_gpu(args.device):
        raise ValueError(f"random weights at {args.geometry or 'llada-8b'} geometry are a GPU benchmark (about 30 GB "
                         "in fp32 on the CPU, minutes per step); on the CPU pass --model with a small model folder "
                         "(the prompts are random tokens: a trained model may answer them in a step or two, a "
                         "random-weight one decodes every cell)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_process = []
    for rotation in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            target = Path(scratch) / "rows.json"
            command = [sys.executable, "-m", "flash_dllm.engine.bench", "decode", *worker_argv(args),
                       "--worker", str(target), "--rotation", str(rotation)]
            print(f"process {rotation + 1}/{args.repeats} ...", flush=True)
            done = subprocess.run(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            if done.returncode != 0:
                killed = " (killed: out of memory?)" if done.returncode in (-9, 137) else ""
                print(f"error: benchmark process {rotation + 1} failed (exit {done.returncode}){killed}",
                      file=sys.stderr)
                return 1
            per_process.append(json.loads(target.read_text()))
    rows = aggregate(per_process)
    env = per_process[0]["env"]
    write_outputs(out, rows, env, vars(args))
    print(f"\nsettings: {args.model or args.geometry or 'llada-8b'}, prompt {args.prompt_length} tokens, answer "
          f"{args.gen_length}, methods {args.methods}, batch sizes {args.batch_sizes}, {args.iterations} timed "
          f"iterations per process after warm-up, {args.repeats} processes, kernels {args.kernels or 'default'}, "
          f"graphs {'off' if args.no_graphs else 'on'}")
    print_table(rows, env)
    print(f"\nwrote {out / 'decode.csv'}, {out / 'decode.json'}, {out / 'decode.png'}")
    return 0


def _on_gpu(device: str) -> bool:
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def worker_argv(args) -> list[str]:
    argv = ["--methods", args.methods, "--batch-sizes", args.batch_sizes, "--prompt-length", str(args.prompt_length),
            "--gen-length", str(args.gen_length), "--iterations", str(args.iterations), "--device", args.device]
    argv += ["--model", args.model] if args.model else ["--geometry", args.geometry or "llada-8b"]
    argv += ["--kernels", args.kernels] if args.kernels else []
    return argv + (["--no-graphs"] if args.no_graphs else [])


def aggregate(per_process: list[dict]) -> list[dict]:
    """One row per (method, batch): the spread of the per-process medians, floors from the processes' ceilings."""
    rows = []
    first = per_process[0]["cells"]
    for index, cell in enumerate(first):
        runs = [p["cells"][index] for p in per_process]
        medians = [r["iter_ms_median"] for r in runs if r.get("iter_ms_median") is not None]
        row = {k: cell[k] for k in ("method", "batch", "model", "prompt_length", "gen_length", "graphs", "kernels")}
        row.update(processes=len(runs), iterations_per_process=min(r["iterations"] for r in runs))
        if not medians:
            row["error"] = "; ".join(sorted({r.get("error", "no timed iteration") for r in runs}))
            rows.append(row)
            continue
        row.update(ms_per_iter_min=round(min(medians), 3), ms_per_iter_median=round(statistics.median(medians), 3),
                   ms_per_iter_max=round(max(medians), 3),
                   spread=round(max(medians) / min(medians), 3),
                   tokens_per_s=round(statistics.median(r["tokens_per_s"] for r in runs), 2),
                   tokens_per_forward=round(statistics.median(r["tokens_per_forward"] for r in runs), 3),
                   forwards_per_iter=cell["forwards_per_iter"],
                   peak_gb=round(max(r["peak_gb"] for r in runs), 2) if cell.get("peak_gb") is not None else None,
                   capture_s=round(statistics.median(r["capture_s"] for r in runs), 3),
                   first_step_ms=round(statistics.median(r["first_step_ms"] for r in runs), 2))
        ceilings = [p["env"] for p in per_process if p["env"].get("copy_gbs")]
        if ceilings:
            copy = statistics.median(c["copy_gbs"] for c in ceilings)
            tflops = statistics.median(c["matmul_tflops"] for c in ceilings)
            weight_ms = cell["weight_bytes"] / (copy * 1e9) * 1e3
            compute_ms = cell["flops_per_iter"] / (tflops * 1e12) * 1e3
            floor = max(weight_ms, compute_ms)
            row.update(copy_gbs=round(copy, 1), matmul_tflops=round(tflops, 1), weight_floor_ms=round(weight_ms, 3),
                       compute_floor_ms=round(compute_ms, 3), floor_ms=round(floor, 3),
                       x_floor=round(row["ms_per_iter_median"] / floor, 3))
        rows.append(row)
    return rows


def print_table(rows: list[dict], env: dict) -> None:
    print(f"\n{env.get('device_name', env.get('device'))} | torch {env.get('torch')} | triton {env.get('triton')} | "
          f"driver {env.get('driver', '-')} | copy {env.get('copy_gbs', '-')} GB/s | "
          f"matmul {env.get('matmul_tflops', '-')} TFLOP/s")
    head = ["method", "batch", "ms/iter min", "median", "max", "floor ms", "x floor", "tok/s", "tok/fwd", "peak GB"]
    print(" | ".join(head))
    for r in rows:
        if "error" in r:
            print(f"{r['method']} | {r['batch']} | error: {r['error']}")
            continue
        print(" | ".join(str(v) for v in (r["method"], r["batch"], r["ms_per_iter_min"], r["ms_per_iter_median"],
                                          r["ms_per_iter_max"], r.get("floor_ms", "-"), r.get("x_floor", "-"),
                                          r["tokens_per_s"], r["tokens_per_forward"], r.get("peak_gb", "-"))))


if __name__ == "__main__":
    sys.exit(main())
