"""One process of `flash-dllm-chat bench decode`: the ceilings of this device, then every cell once."""
from __future__ import annotations

import platform
import random
import shutil
import statistics
import subprocess
import threading
import time

import torch

from flash_dllm.engine.bench import SKIP, cells_of
from flash_dllm.engine.settings import GenerationSettings

WARMUP_STEPS = 8  # enough for the loop to compile, tune and capture its steady step
MAX_GENERATIONS = 100  # generations per cell while collecting timed steps (a trained model's answers end early)


def environment(device: torch.device) -> dict:
    import triton

    env = {"device": str(device), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "device_name": platform.processor() or platform.machine()}
    if device.type != "cuda":
        return env
    props = torch.cuda.get_device_properties(device)
    env.update(device_name=props.name, sms=props.multi_processor_count, memory_gb=round(props.total_memory / 1e9, 1))
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", f"--id={device.index or 0}"]
        try:
            env["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    env["copy_gbs"] = round(copy_bandwidth_gbs(device), 1)
    env["matmul_tflops"] = round(matmul_tflops(device), 1)
    return env


def _cuda_median_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs(device) -> float:
    """Device-to-device copy of 2 GiB, bytes read plus written per second."""
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = _cuda_median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def matmul_tflops(device) -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    ms = _cuda_median_ms(lambda: a @ b)
    return 2 * 8192 ** 3 / (ms * 1e-3) / 1e12


def iteration_flops(engine, batch: int, kv_len: int) -> float:
    """FLOPs of one steady iteration (linears, attention over kv_len keys, logits at the read-out cells)."""
    cfg, session = engine.model.config, engine._decode[1]
    hq, hkv, dh, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    linear = 2 * d * ((hq + 2 * hkv) * dh + hq * dh + 3 * cfg.mlp_hidden)

    def forward(rows: int, readout: int) -> float:
        return cfg.n_layers * (rows * linear + 4 * rows * kv_len * hq * dh) + 2 * readout * cfg.vocab_size * d

    method = session.method
    flops = forward(batch * method.steady_rows, batch * method.readout) * method.forwards_per_step
    if session.verifier is not None:
        flops += forward(batch * session.verifier.layout.rows, batch * session.verifier.cap)
    return flops


def random_prompts(engine, batch: int, length: int, seed: int) -> list[list[int]]:
    cfg = engine.model.config
    special = {cfg.mask_id, cfg.eos_id, *engine.tokenizer.end_ids}
    rng = random.Random(seed)
    top = min(cfg.vocab_size, 120000)
    prompts = []
    for _ in range(batch):
        ids = []
        while len(ids) < length:
            t = rng.randrange(top)
            if t not in special:
                ids.append(t)
        prompts.append(ids)
    return prompts


def run_generation(engine, prompts, settings, stop_after: int):
    """Generate, cancelling once sequence 0 has taken stop_after steps; its StepEvents and the wall time."""
    cancel, events = threading.Event(), []

    def on_event(event) -> None:
        if getattr(event, "kind", "") == "step" and event.seq == 0:
            events.append(event)
            if len(events) >= stop_after:
                cancel.set()

    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    started = time.perf_counter()
    results = engine.generate(prompts, settings, on_event=on_event, cancel=cancel)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    return results, events, time.perf_counter() - started


def measure(engine, method: str, batch: int, args) -> dict:
    from flash_dllm.engine.block_diffusion import benchmark_config
    from flash_dllm.engine.settings import block_length_for

    block = block_length_for(args.gen_length, 32)  # as `generate` and the API choose one
    model_config = engine.model.config  # a block method's cell times a block-causal variant of the geometry
    engine.model.config = benchmark_config(model_config, method, block)
    try:
        return _measure(engine, method, batch, args, block)
    finally:
        engine.model.config = model_config


def _measure(engine, method: str, batch: int, args, block: int) -> dict:
    settings = GenerationSettings(method=method, gen_length=args.gen_length, block_length=block, threshold=0.9,
                                  gamma=0.8, seed=0, use_chat_template=False)
    prompts = random_prompts(engine, batch, args.prompt_length, seed=batch)
    cuda = engine.device.type == "cuda"
    row = {"method": method, "batch": batch, "model": engine.name, "prompt_length": args.prompt_length,
           "gen_length": args.gen_length, "kernels": engine.kernels, "graphs": engine.graphs and cuda}
    engine.release_decode_memory()  # the previous cell's KV cache must not count in this cell's peak
    if cuda:
        torch.cuda.reset_peak_memory_stats(engine.device)
    try:
        run_generation(engine, prompts, settings, WARMUP_STEPS)
        capture_s = engine.last_run.capture_s
        # untimed: the first step (whole prompts) and, where steps are captured, the eager ones before the capture
        skip = SKIP if row["graphs"] else 1
        timed, results, generations, wall, first_ms = [], [], 0, 0.0, 0.0
        while len(timed) < args.iterations and generations < MAX_GENERATIONS:
            # a trained model's answers can end in a few steps: generate again until enough steps are timed
            done, events, seconds = run_generation(engine, prompts, settings, skip + args.iterations - len(timed))
            if generations == 0 and events:
                first_ms = events[0].step_ms
            timed += [e.step_ms for e in events[skip:]]
            results += done
            generations, wall = generations + 1, wall + seconds
    except torch.cuda.OutOfMemoryError:
        return {**row, "error": "out of memory", "iterations": 0}
    except Exception as err:  # noqa: BLE001 - recorded in the table instead of ending the other cells
        if "out of memory" not in str(err).lower():
            raise
        return {**row, "error": "out of memory", "iterations": 0}
    timed = timed[: args.iterations]
    tokens = sum(len(r.token_ids) for r in results)
    forwards = sum(r.forward_passes for r in results)
    if not timed:
        row["error"] = f"every answer ended within {skip} steps: no steady step to time"
    row.update(iterations=len(timed), iter_ms_median=statistics.median(timed) if timed else None,
               generations=generations,
               iter_ms_all=[round(t, 4) for t in timed], tokens_per_s=tokens / wall if wall > 0 else 0.0,
               tokens_per_forward=tokens / forwards if forwards else 0.0,
               forwards_per_iter=engine._decode[1].method.forwards_per_step + (1 if engine._decode[1].verifier else 0),
               first_step_ms=first_ms, capture_s=capture_s,
               peak_gb=torch.cuda.max_memory_allocated(engine.device) / 1e9 if cuda else None,
               weight_bytes=_weight_bytes(engine), flops_per_iter=iteration_flops(
                   engine, batch, args.prompt_length + args.gen_length))
    return row


def _weight_bytes(engine) -> int:
    from flash_dllm.engine.geometry import weight_bytes

    return weight_bytes(engine.model)


def build_engine(args):
    from flash_dllm.engine.engine import Engine
    from flash_dllm.engine.geometry import random_engine

    graphs = not args.no_graphs
    if args.model:
        return Engine.load(args.model, device=args.device, kernels=args.kernels, graphs=graphs)
    return random_engine(args.geometry or "llada-8b", args.device, args.kernels, graphs)


def run_worker(args) -> dict:
    from flash_dllm.engine.settings import SettingsError

    engine = build_engine(args)
    context = engine.model.config.max_seq_len
    if args.prompt_length + args.gen_length > context:  # before the ceilings: nothing would be timed
        raise SettingsError(f"prompt {args.prompt_length} + answer {args.gen_length} tokens exceed {engine.name}'s "
                            f"context of {context}; pass a smaller --prompt-length or --gen-length")
    env = environment(engine.device)
    cells = cells_of(args)
    shift = args.rotation % len(cells)
    order = cells[shift:] + cells[:shift]  # processes alternate which cell runs first
    measured = {}
    with torch.no_grad():
        for method, batch in order:
            row = measured[(method, batch)] = measure(engine, method, batch, args)
            said = row["error"] if row.get("error") else f"{row['iter_ms_median']:.3f} ms/iter"
            print(f"  {method} batch {batch}: {said}", flush=True)
    return {"env": env, "cells": [measured[cell] for cell in cells]}
