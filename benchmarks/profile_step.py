"""Where a steady decode step's time goes: a torch.profiler trace of a few replayed steps, summarised.

    python3 benchmarks/profile_step.py --geometry llada-8b --method flash-cache --batch 1 [--trace out.json]

Prints the wall time per step (GPU timeline, from the step records), the summed GPU kernel time per step,
the share of the wall the GPU is busy, and the kernels by GPU time. Random weights at full geometry.
"""
from __future__ import annotations

import argparse
import threading
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from flash_dllm.engine.bench_worker import random_prompts
from flash_dllm.engine.geometry import random_engine
from flash_dllm.engine.settings import GenerationSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", default="llada-8b")
    parser.add_argument("--method", default="flash-cache")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="profiled steps")
    parser.add_argument("--start", type=int, default=20,
                        help="first profiled step (fast-dllm refreshes its cache at steps 0, 32, 64, ... with random "
                             "weights: 33 keeps a 20-step window free of them)")
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--trace", help="write the Chrome trace here")
    args = parser.parse_args()
    engine = random_engine(args.geometry, "cuda", graphs=not args.no_graphs)
    s = GenerationSettings(method=args.method, gen_length=512, block_length=32, seed=0, use_chat_template=False)
    prompts = random_prompts(engine, args.batch, 800, seed=1)
    engine.generate(prompts, s, cancel=_StepCancel(8))  # compile, tune, capture
    start, stop = args.start, args.start + args.steps
    holder: dict = {}
    cancel = threading.Event()

    def on_event(event) -> None:
        if getattr(event, "kind", "") != "step" or event.seq != 0:
            return
        if event.step == start:
            torch.cuda.synchronize()
            holder["prof"] = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            holder["prof"].__enter__()
        if start < event.step <= stop:
            holder.setdefault("ms", []).append(event.step_ms)
        if event.step == stop:
            torch.cuda.synchronize()
            holder["prof"].__exit__(None, None, None)
            cancel.set()

    engine.generate(prompts, s, on_event=on_event, cancel=cancel)
    prof = holder["prof"]
    if args.trace:
        prof.export_chrome_trace(args.trace)
    kernels: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            kernels[event.name[:90]] += event.device_time_total / 1000.0
            counts[event.name[:90]] += 1
    # the profile window covers the steps between its start and stop events (lagged reads: about args.steps)
    n = args.steps
    busy = sum(kernels.values()) / n
    wall = sorted(holder["ms"])[len(holder["ms"]) // 2]
    print(f"{args.geometry} {args.method} batch {args.batch}: wall {wall:.3f} ms/step (median of {len(holder['ms'])}),"
          f" GPU kernels {busy:.3f} ms/step, busy {100 * busy / wall:.0f}%, {sum(counts.values()) / n:.0f} kernels/step")
    for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {ms / n:8.4f} ms/step  {counts[name] / n:6.1f}/step  {name}")


class _StepCancel(threading.Event):
    """A cancel flag that sets itself after `steps` checks (the loop checks it once per step)."""

    def __init__(self, steps: int):
        super().__init__()
        self.left = steps

    def is_set(self) -> bool:
        self.left -= 1
        return self.left < 0 or super().is_set()


if __name__ == "__main__":
    main()
