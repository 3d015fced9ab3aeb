"""Where a batch-1 Flash-Cache attention call spends its time (CUDA only; diagnostic, not a benchmark of record).

The step's shape: one sequence, 128 query rows (two 64-row tiles), ~1,314 cached keys, LLaDA-8B heads (32/32,
head dim 128), bf16, no excluded keys (a flash-cache step passes no kv_keep), the first 16 rows scored
(attention mass) or not. Every number is the median of 200 replays of a CUDA graph holding `copies` calls over
rotating caches (together larger than L2), per call:
  * the op as the engine calls it (auto split count), and its split and combine kernels each alone;
  * the split kernel with its (BLOCK_N, warps, stages) forced, at 2-6 splits;
  * 256 keys (4 splits of one 64-key block each): the fixed cost of a program;
  * an empty Triton kernel on the same grid: the launch floor inside a graph;
  * SDPA's flash, memory-efficient and cuDNN kernels on the dense [1, 32, 128 | 1314, 128] problem (no mass),
    for what a tuned kernel reaches at this shape.
(The mass-by-dot comparison of 2026-12-06 lives in results/gpu-check-2026-12-06f/mass-by-dot.patch.)
Usage: python3 benchmarks/probe_attention_batch1.py [--kv 1314] [--csv PATH]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import triton
import triton.language as tl

from bench_attention import HEAD_DIM as D, MODELS, ROWS_PER_SEQ as ROWS, DecodeStep, graph_us
from flash_dllm.kernels import _scheduled_attention_triton as K
from flash_dllm.kernels.scheduled_attention import ScheduledAttention

MODEL, BLOCK_M = "llada-8b", 64
H = MODELS[MODEL][0]  # query heads = KV heads
DRY = os.environ.get("PROBE_DRY") == "1"  # CPU dry run under TRITON_INTERPRET=1: every path once, no timing
DEV = "cpu" if DRY else "cuda"
RESULTS: list[dict] = []


@triton.jit
def _empty_kernel(x_ptr):
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0.0)


class Shape(DecodeStep):
    """bench_attention's decode step at batch 1 with a fixed key count and no excluded keys (a flash-cache step
    passes no kv_keep); score is its mass output, or None to leave the mass out."""

    def __init__(self, kv_len: int, copies: int, scored: bool):
        super().__init__(MODEL, 1, BLOCK_M, copies, kv_len=kv_len, excluded=0.0, device=DEV)
        self.kv_len = kv_len
        self.score = self.score if scored else None


def timed(fn, n_calls: int) -> float:
    if DRY:
        fn()
        return 1.0
    return graph_us(fn, n_calls)


def record(name: str, us: float, flops: float | None, **extra) -> None:
    tflops = flops / us / 1e6 if flops else float("nan")
    RESULTS.append({"variant": name, "us": round(us, 2), "tflops": round(tflops, 1), **extra})
    print(f"  {name:<58} {us:7.2f} us  {tflops:6.1f} TFLOP/s", flush=True)


def split_launcher(inner, shape: Shape, config: dict | None):
    """Launch the split kernel alone (config None: the autotuned one), as the launcher does."""
    bucket = inner.bucket(shape.q, shape.plan, shape.score)
    meta = dict(bucket.split_meta)
    out = torch.empty_like(shape.q)
    ws = (bucket.acc_ws, bucket.m_ws, bucket.l_ws) if bucket.combine_grid else (shape.q,) * 3
    sq = shape.plan.score_query.view(torch.uint8) if meta["HAS_SCORE"] else shape.q
    scores = shape.score if meta["HAS_SCORE"] else shape.q
    kernel = K._attention_split_kernel if config is None else K._attention_split_kernel.fn
    extra = {} if config is None else config

    def launch(k_cache, v_cache):
        kernel[bucket.split_grid](
            shape.q, k_cache, v_cache, out, shape.plan.tile_seq, shape.plan.tile_q0, shape.plan.q_start,
            shape.plan.q_len, shape.plan.kv_start, shape.plan.kv_len, shape.q, shape.q, shape.q, sq, scores, *ws,
            shape.q.stride(0), k_cache.stride(0), v_cache.stride(0), out.stride(0), 0,
            shape.plan.block_m, 1, bucket.n_splits, shape.q.shape[0], inner.qk_scale_log2, **meta, **extra)
    return bucket, launch, out, ws


def probe(kv_len: int, scored: bool, l2_bytes: int) -> None:
    copies = max(2, math.ceil(3 * l2_bytes / (2 * kv_len * H * D * 2)))
    shape = Shape(kv_len, copies, scored)
    tag = f"kv={kv_len} mass={'on' if scored else 'off'}"
    print(f"\n{tag} (graph of {copies} calls)", flush=True)
    calls = lambda f: (lambda: [f(k, v) for k, v in shape.caches])  # noqa: E731
    auto = ScheduledAttention("triton", H, H, D)
    k, v = shape.caches[0]
    auto(shape.q, k, v, shape.plan, shape.score.clone() if shape.score is not None else None)  # settles the splits
    chosen = auto.key_splits(shape.q, shape.plan, shape.score)
    record(f"op auto (splits={chosen})", timed(calls(lambda k, v: auto(shape.q, k, v, shape.plan, shape.score)),
                                              copies), shape.flops(), kv=kv_len, mass=scored)
    for n_splits in (2, 3, 4, 5, 6):
        op = ScheduledAttention("triton", H, H, D, n_splits=n_splits)
        inner = op.triton
        op(shape.q, *shape.caches[0], shape.plan, shape.score)  # bucket + autotune
        bucket, launch, _, ws = split_launcher(inner, shape, None)
        best = K._attention_split_kernel.best_config
        record(f"split only, {n_splits} splits, autotuned {best.kwargs} w{best.num_warps} s{best.num_stages}",
               timed(calls(launch), copies), shape.flops(), kv=kv_len, mass=scored, splits=n_splits)
        if n_splits == chosen or (n_splits == 4 and kv_len > 256):
            out = torch.empty_like(shape.q)

            def combine(k, v, bucket=bucket, out=out, ws=ws):
                K._attention_combine_kernel[bucket.combine_grid](
                    out, shape.plan.tile_seq, shape.plan.tile_q0, shape.plan.q_start, shape.plan.q_len,
                    shape.plan.kv_start, shape.plan.kv_len, *ws, out.stride(0), shape.plan.block_m,
                    shape.q.shape[0], **bucket.combine_meta)
            record(f"combine only, {n_splits} parts", timed(calls(combine), copies), None, kv=kv_len, splits=n_splits)
        if n_splits in (2, 4) and kv_len > 256:
            for block_n, warps, stages in ((32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2),
                                           (64, 8, 3), (128, 8, 2)):
                try:
                    _, launch, _, _ = split_launcher(inner, shape, {"BLOCK_N": block_n, "num_warps": warps,
                                                                              "num_stages": stages})
                    us = timed(calls(launch), copies)
                except Exception as exc:  # out of shared memory etc.: say so, go on
                    print(f"  BLOCK_N={block_n} w{warps} s{stages}: {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                record(f"split only, {n_splits} splits, BLOCK_N={block_n} w{warps} s{stages}", us, shape.flops(),
                       kv=kv_len, mass=scored, splits=n_splits, block_n=block_n, warps=warps, stages=stages)


def sdpa(kv_len: int, l2_bytes: int) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    copies = max(2, math.ceil(3 * l2_bytes / (2 * kv_len * H * D * 2)))
    q = torch.randn(1, H, ROWS, D, device=DEV, dtype=torch.bfloat16)
    kvs = [(torch.randn(1, H, kv_len, D, device=DEV, dtype=torch.bfloat16),
            torch.randn(1, H, kv_len, D, device=DEV, dtype=torch.bfloat16)) for _ in range(copies)]
    print(f"\nSDPA dense kv={kv_len} (graph of {copies} calls)")
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                us = timed(lambda: [torch.nn.functional.scaled_dot_product_attention(q, k, v) for k, v in kvs], copies)
        except Exception as exc:
            print(f"  sdpa {name}: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        record(f"sdpa {name}", us, 4.0 * D * H * ROWS * kv_len, kv=kv_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv", type=int, default=1314)
    parser.add_argument("--csv")
    args = parser.parse_args()
    if DRY:
        props = type("P", (), {"name": "dry run", "multi_processor_count": 132, "L2_cache_size": 1 << 20})()
    elif not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("probe_attention_batch1.py needs a CUDA device and TRITON_INTERPRET unset")
    else:
        props = torch.cuda.get_device_properties(0)
    print(f"{props.name}: {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}")
    x = torch.zeros(1, device=DEV)
    grid = (2, H, 5)  # the split kernel's grid at batch 1
    record("empty Triton kernel, grid (2, 32, 5), 1 call", timed(lambda: _empty_kernel[grid](x), 1), None)
    record("empty Triton kernel, 9 calls", timed(lambda: [_empty_kernel[grid](x) for _ in range(9)], 9), None)
    for scored in (True, False):
        probe(args.kv, scored, props.L2_cache_size)
    probe(256, True, props.L2_cache_size)  # 4 splits of one 64-key block: the fixed cost of a program
    sdpa(args.kv, props.L2_cache_size)
    write_csv(args.csv)


def write_csv(path: str | None) -> None:
    if path:
        import csv

        keys = sorted({k for row in RESULTS for k in row})
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(RESULTS)


if __name__ == "__main__":
    main()
