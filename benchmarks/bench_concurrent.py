"""Concurrent requests through the scheduler against the same requests one after another (CPU or GPU).

    python3 benchmarks/bench_concurrent.py [--model FOLDER|bundled | --geometry llada-8b] [--requests 8]
        [--gen-length 32] [--rounds 3] [--method flash-cache]

Each round submits the requests one after another (each waits for the previous one's answer), then all at once,
and compares every concurrent answer with its one-at-a-time answer (greedy: on the CPU they must be equal; bf16
batches on a GPU may round differently, so there the share of equal answers is printed). Prints both wall times,
the aggregate tokens/s of each (generated tokens only) and their ratio, and for the concurrent run how long each
request took to its first canvas frame (CanvasStart) and to its first committed tokens, in milliseconds and in
steps of the running batch (the median gap between one request's consecutive step events).
With --geometry the model has random weights at full size (no tokenizer: prompts are random ids of mixed
lengths), which is how the GPU target is measured.
"""
from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import torch

from flash_dllm.engine import Engine, GenerationSettings, hub

PROMPTS = ["What is 7 + 5?", "List three colours.", "What is 12 * 3?", "Count from one to five.",
           "Tom has 4 apples and buys 3 more. How many does he have?", "What is 9 - 4?", "Name two animals.",
           "What is 18 / 3?", "Hello!", "What is 2 + 2?", "List four fruits.", "What is 6 * 7?",
           "What is 100 - 1?", "Count to three.", "What is 11 + 11?", "Name a colour."]


class Stream:
    """One request's arrival, its first frame, its first committed tokens and its step-event times."""

    def __init__(self):
        self.arrived = time.perf_counter()
        self.first_frame = self.first_tokens = None
        self.step_times: list[float] = []

    def __call__(self, event) -> None:
        now = time.perf_counter()
        kind = getattr(event, "kind", "")
        if self.first_frame is None:
            self.first_frame = now
        if kind == "step":
            self.step_times.append(now)
            if self.first_tokens is None and event.committed:
                self.first_tokens = now


def sync(engine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def build(args):
    if args.geometry:
        from flash_dllm.engine.bench_worker import random_prompts
        from flash_dllm.engine.geometry import random_engine

        engine = random_engine(args.geometry, args.device)
        rng = random.Random(0)
        prompts = [p[: rng.randint(args.min_prompt, args.max_prompt)]
                   for p in random_prompts(engine, args.requests, args.max_prompt, seed=1)]
        return engine, prompts
    model = str(hub.bundled_model_path()) if args.model == "bundled" else args.model
    engine = Engine.load(model, device=args.device)
    return engine, (PROMPTS * (args.requests // len(PROMPTS) + 1))[: args.requests]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--geometry", default=None, help="random weights at this size (llada-8b, dream-7b)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--method", default="flash-cache")
    parser.add_argument("--min-prompt", type=int, default=64)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    engine, prompts = build(args)
    block = 32 if args.gen_length % 32 == 0 else args.gen_length
    s = GenerationSettings(method=args.method, gen_length=args.gen_length, block_length=block)
    print(f"device {engine.device}" + (f" ({torch.cuda.get_device_name(engine.device)})" if engine.device.type == "cuda"
                                      else f" ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)")
          + f"; torch {torch.__version__}; model {engine.name}; method {args.method}; {args.requests} requests, answer "
          f"{args.gen_length}, prompts {min(map(len, prompts)) if args.geometry else 'text'}"
          f"{'-' + str(max(map(len, prompts))) + ' tokens' if args.geometry else ''}; warm-up: every request once")
    for p in prompts:  # warm-up: kernels compiled, every slot-count bucket's graph captured
        engine.submit(p, s).result()
    [r.result() for r in [engine.submit(p, s) for p in prompts]]
    rows = []
    for _ in range(args.rounds):
        sync(engine)
        started = time.perf_counter()
        alone = [engine.submit(p, s).result() for p in prompts]
        sync(engine)
        sequential = time.perf_counter() - started
        streams = [Stream() for _ in prompts]
        started = time.perf_counter()
        requests = []
        for p, stream in zip(prompts, streams):
            stream.arrived = time.perf_counter()
            requests.append(engine.submit(p, s, on_event=stream))
        together = [r.result() for r in requests]
        sync(engine)
        concurrent = time.perf_counter() - started
        equal = sum(a.token_ids == b.token_ids for a, b in zip(alone, together))
        if engine.device.type == "cpu":
            assert equal == len(prompts), "a concurrent answer differs from its one-at-a-time answer"
        tokens = sum(len(r.token_ids) for r in together)
        gaps = [b - a for st in streams for a, b in zip(st.step_times[len(st.step_times) // 4:],
                                                       st.step_times[len(st.step_times) // 4 + 1:])]
        step = statistics.median(gaps) if gaps else float("nan")
        rows.append(dict(sequential=sequential, concurrent=concurrent, tokens=tokens, equal=equal, step=step,
                         frame=[st.first_frame - st.arrived for st in streams],
                         first=[(st.first_tokens or st.first_frame) - st.arrived for st in streams]))
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    frames = [x for r in rows for x in r["frame"]]
    firsts = [x for r in rows for x in r["first"]]
    step = med("step")
    print(f"{args.rounds} rounds, medians: one after another {med('sequential'):.2f} s "
          f"({med('tokens') / med('sequential'):.1f} tok/s), together {med('concurrent'):.2f} s "
          f"({med('tokens') / med('concurrent'):.1f} tok/s), speed-up {med('sequential') / med('concurrent'):.2f}x; "
          f"{int(med('tokens'))} generated tokens; answers equal to one-at-a-time: "
          f"{min(r['equal'] for r in rows)}/{len(prompts)}")
    print(f"batch step {step * 1000:.1f} ms; first canvas frame after arrival: median "
          f"{statistics.median(frames) * 1000:.1f} ms, max {max(frames) * 1000:.1f} ms ({max(frames) / step:.2f} steps); "
          f"first committed tokens: median {statistics.median(firsts) * 1000:.1f} ms, max {max(firsts) * 1000:.1f} ms "
          f"({max(firsts) / step:.2f} steps)")


if __name__ == "__main__":
    main()
