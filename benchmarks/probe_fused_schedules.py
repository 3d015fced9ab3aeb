"""Probe (Hopper): every stream-K config of the fused QKV kernel with and without its reduce kernel, and chosen
data-parallel TMA configs, one at a time (CUDA-graph medians over rotating weights, bf16), vs cuBLAS.

Usage: python3 benchmarks/probe_fused_schedules.py [--csv PATH]
"""
from __future__ import annotations

import argparse
import csv
import os

import torch
import torch.nn.functional as F

from bench_kernels import MODELS, fused_inputs, graph_ms
from flash_dllm.kernels import _fused_qkv_rope_cache_streamk as sk
from flash_dllm.kernels import _fused_qkv_rope_cache_tma as tma
from flash_dllm.kernels._fused_qkv_rope_cache_triton import PATH_ENV
from flash_dllm.kernels.fused_qkv_rope_cache import fused_qkv_rope_cache

TMA_CONFIGS = [(128, 1, 64, 64, 5, 4), (128, 1, 64, 64, 6, 4), (128, 1, 64, 32, 10, 4), (64, 1, 64, 64, 4, 4),
               (128, 1, 64, 64, 4, 8)]


class _NoReduce:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv")
    parser.add_argument("--cases", default="dream-7b:128,dream-7b:1024,llada-8b:128")
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

        def fused(i):
            return fused_qkv_rope_cache(x[i], w[i], b[i], cos, sin, pos, crow, kc, vc, n_heads, n_kv_heads,
                                        backend="triton")

        def record(variant, t):
            rows.append({"model": model, "tokens": n_tokens, "variant": variant, "us": round(t * 1000, 2),
                         "vs_cublas": round(t / t_mm, 3)})
            print(f"  {variant:<58} {t * 1000:7.1f} us  x{t / t_mm:.3f}", flush=True)

        os.environ[PATH_ENV] = "streamk"
        for config in sk.CUDA_CONFIGS[:6]:
            sk._BEST.clear()
            saved = sk.CUDA_CONFIGS
            sk.CUDA_CONFIGS = [config]
            try:
                fused(0)
                record(f"streamk {config}", graph_ms(fused, copies))
                reduce_kernel = sk._fused_qkv_streamk_reduce_kernel
                sk._fused_qkv_streamk_reduce_kernel = _NoReduce()
                try:
                    record(f"streamk main only {config}", graph_ms(fused, copies))
                finally:
                    sk._fused_qkv_streamk_reduce_kernel = reduce_kernel
            except Exception as exc:  # noqa: BLE001 - a probe: report and go on
                print(f"  {config}: {str(exc)[:120]}")
            finally:
                sk.CUDA_CONFIGS = saved
        sk._BEST.clear()
        os.environ[PATH_ENV] = "tma"
        kernel = tma._fused_qkv_rope_cache_tma_kernel
        saved_configs = kernel.configs
        for row in TMA_CONFIGS:
            kernel.configs = [tma._config(*row)]
            kernel.cache.clear()
            try:
                fused(0)
                record(f"tma {row}", graph_ms(fused, copies))
            except Exception as exc:  # noqa: BLE001
                print(f"  tma {row}: {str(exc)[:120]}")
        kernel.configs = saved_configs
        kernel.cache.clear()
        os.environ.pop(PATH_ENV)
        del w, b, x
        torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
