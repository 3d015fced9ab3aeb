"""Probe (Hopper): every stream-K config of the fused QKV kernel (aligned and balanced tails) and chosen
data-parallel TMA configs, one at a time (CUDA-graph medians over rotating weights, bf16), vs cuBLAS; with
--profile also each kernel's own device time from the CUDA profiler (no launch gaps).

Usage: python3 benchmarks/probe_fused_schedules.py [--cases model:tokens,...] [--csv PATH] [--profile]
       [--only TEXT ...] [--no-tma]   (--only: stream-K configs whose repr holds every TEXT)
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from bench_kernels import MODELS, device_env, fused_inputs, graph_ms, write_rows_csv
from flash_dllm.kernels._fused_qkv_streamk import CUDA_CONFIGS as STREAMK_CONFIGS
from flash_dllm.kernels._fused_qkv_tma import TMAConfig
from flash_dllm.kernels.fused_qkv_rope_cache import FusedQKVRopeCache, forced_fused_qkv

TMA_CONFIGS = [TMAConfig(128, 1, 64, 64, 5, 4), TMAConfig(128, 1, 64, 64, 6, 4), TMAConfig(128, 2, 64, 64, 4, 8),
               TMAConfig(64, 1, 64, 64, 4, 4)]


def kernel_us(fn, copies: int, calls: int = 24) -> float:
    """Mean device time (us) of the CUDA kernels one fn(i) launches, summed, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(i % copies)
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0
                and "Memset" not in e.key and "Memcpy" not in e.key)
    return total / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv")
    parser.add_argument("--cases", default="dream-7b:128,dream-7b:1024,dream-7b:4096")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--no-tma", action="store_true")
    args = parser.parse_args()
    rows = []
    for case in args.cases.split(","):
        model, n_tokens = case.split(":")
        n_tokens = int(n_tokens)
        n_heads, n_kv_heads = MODELS[model][:2]
        copies = 8 if model == "dream-7b" else 3
        w, b, x, cos, sin, pos, crow, kc, vc = fused_inputs(model, n_tokens, copies)
        t_mm = graph_ms(lambda i: F.linear(x[i], w[i]), copies)
        print(f"\n{model} N={n_tokens}: cuBLAS {t_mm * 1000:.1f} us", flush=True)

        op = FusedQKVRopeCache("triton", n_heads, n_kv_heads)

        def fused(i):
            return op(x[i], w[i], b[i], cos, sin, pos, crow, kc, vc)

        def record(variant, t):
            rows.append({"model": model, "tokens": n_tokens, "variant": variant, "us": round(t * 1000, 2),
                         "vs_cublas": round(t / t_mm, 3)})
            print(f"  {variant:<100} {t * 1000:7.1f} us  x{t / t_mm:.3f}", flush=True)

        record("cublas", t_mm)
        if args.profile:
            record("cublas kernel (profiler)", kernel_us(lambda i: F.linear(x[i], w[i]), copies) / 1000)
        forcings = [("streamk", config, {"streamk_configs": [config]}) for config in STREAMK_CONFIGS
                    if all(text in repr(config) for text in args.only)]
        forcings += [] if args.no_tma else [("tma", config, {"tma_configs": [config]}) for config in TMA_CONFIGS]
        for path, config, configs in forcings:  # one config at a time: the tuner has nothing to choose
            try:
                with forced_fused_qkv(path=path, **configs):
                    fused(0)
                    record(f"{path} {config}", graph_ms(fused, copies))
                    if args.profile and path == "streamk":
                        record(f"streamk kernel (profiler) {config}", kernel_us(fused, copies) / 1000)
            except Exception as exc:  # noqa: BLE001 - a probe: report and go on
                print(f"  {path} {config}: {str(exc)[:120]}")
        del w, b, x
        torch.cuda.empty_cache()
    if args.csv:
        write_rows_csv(args.csv, rows, device_env())


if __name__ == "__main__":
    main()
