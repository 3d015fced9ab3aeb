"""Probe (Hopper): can a Triton split-K GEMM beat cuBLAS on the batch-1 step's output and down projections?

cuBLAS reads the O weight (a square d x d) and the down weight at 55-77 % of copy bandwidth at 32-128 tokens
(benchmarks/README.md, 2026-12-07 profile). Both are followed by our add+RMSNorm kernel, so a split-K GEMM could
leave its K splits as fp32 partials and let that norm sum them (deterministic: a fixed order, no atomics). This
probe times, per case (projection x token count), CUDA-graph medians over rotating weights (never L2-resident):
  cublas       F.linear(x, W) (W [N, K], as loaded)
  cublas-nn    x @ Wt (Wt [K, N] contiguous, the layout the engine stores gate/up in on Hopper)
  splitk ...   our Triton GEMM: each program owns BLOCK_N output columns and one of S K ranges and writes an fp32
               partial [S, M, N]; "swap" puts the weight rows on the MMA's M side (tokens on its N side, which
               may be as small as 8), "normal" the tokens; "ptr" loads through pointers, "tma" through descriptors
and then the pipelines the step would run: cuBLAS + the engine's add+RMSNorm against the best split-K + the same
add+RMSNorm given the S partials (it sums them, rounds once, then adds and normalizes). The 2026-12-07 data was
taken with a summing norm of the probe's own, before add_rms_norm took partials.
The floor is the weight's bytes over the copy bandwidth measured in the same run.

Usage: python3 benchmarks/probe_skinny_gemm.py [--cases llada-8b:o:128,llada-8b:down:32,...] [--csv PATH]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from bench_kernels import copy_bandwidth_gbs, device_env, graph_ms, write_rows_csv
from flash_dllm.kernels.add_rms_norm import add_rms_norm

GEOMETRY = {"llada-8b": (4096, 12288), "dream-7b": (3584, 18944)}  # d_model, MLP width
DEFAULT_CASES = ",".join(f"llada-8b:{p}:{m}" for p in ("o", "down") for m in (128, 48, 32)) + \
    ",dream-7b:o:144,dream-7b:down:144"


def problem(model: str, proj: str) -> tuple[int, int]:
    """(N, K) of out[M, N] = x[M, K] @ W[N, K]^T."""
    d, ffn = GEOMETRY[model]
    return {"o": (d, d), "down": (d, ffn), "gate-up": (2 * ffn, d)}[proj]


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, x_desc, w_desc, part_ptr, M, N, k_per_split, stride_x, stride_w,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                   SWAP: tl.constexpr, TMA: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    k0 = split * k_per_split
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(k0, k0 + k_per_split, BLOCK_K, num_stages=STAGES):
        if TMA:
            w = w_desc.load([pid_n * BLOCK_N, k])
            x = x_desc.load([0, k])
        else:
            w = tl.load(w_ptr + cols[:, None].to(tl.int64) * stride_w + (k + ks)[None, :])
            x = tl.load(x_ptr + rows[:, None] * stride_x + (k + ks)[None, :], mask=rows[:, None] < M, other=0.0)
        if SWAP:
            acc = tl.dot(w, x.T, acc)
        else:
            acc = tl.dot(x, w.T, acc)
    base = part_ptr + split.to(tl.int64) * M * N
    if SWAP:
        tl.store(base + rows[None, :] * N + cols[:, None], acc, mask=rows[None, :] < M)
    else:
        tl.store(base + rows[:, None] * N + cols[None, :], acc, mask=rows[:, None] < M)


def run_splitk(x, w, part, cfg):
    orient, loads, bm, bn, bk, split, stages, warps = cfg
    m, k = x.shape
    n = w.shape[0]
    k_per_split = k // split
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk]) if loads == "tma" else None
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk]) if loads == "tma" else None
    _splitk_kernel[(n // bn, split)](x, w, x_desc, w_desc, part, m, n, k_per_split, x.stride(0), w.stride(0),
                                     BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, SWAP=orient == "swap",
                                     TMA=loads == "tma", num_warps=warps)


def valid(cfg, n, k) -> bool:
    orient, loads, bm, bn, bk, split, stages, warps = cfg
    if n % bn or k % split or (k // split) % bk:
        return False
    smem = stages * (bn + bm) * bk * 2
    return smem <= 220 * 1024 and not (orient == "normal" and bm < 64 and warps == 8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--csv")
    args = parser.parse_args()
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    props = torch.cuda.get_device_properties(0)
    bandwidth = copy_bandwidth_gbs()
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}, "
          f"copy {bandwidth:.0f} GB/s", flush=True)
    rows = []
    for case in args.cases.split(","):
        model, proj, m = case.split(":")
        m = int(m)
        n, k = problem(model, proj)
        bm = max(16, triton.next_power_of_2(m))
        copies = max(4, min(16, (1 << 30) // (n * k * 2)))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5 for _ in range(copies)]
        weights_nn = [w.t().contiguous() for w in weights]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        floor_us = n * k * 2 / bandwidth / 1e3
        t_tn = graph_ms(lambda i: F.linear(x, weights[i]), copies) * 1e3
        t_nn = graph_ms(lambda i: torch.matmul(x, weights_nn[i]), copies) * 1e3
        print(f"\n{case}: {m}x{n}x{k}, floor {floor_us:.1f} us; cuBLAS {t_tn:.1f} us (x{t_tn / floor_us:.2f} floor), "
              f"NN {t_nn:.1f} us (x{t_nn / floor_us:.2f})", flush=True)
        for variant, t in (("cublas", t_tn), ("cublas-nn", t_nn)):
            rows.append({"case": case, "variant": variant, "us": round(t, 2), "x_floor": round(t / floor_us, 3)})
        reference = F.linear(x, weights[0]).float()
        splits = [s for s in (1, 2, 3, 4, 6, 8, 12, 16) if 64 <= (n // 128) * s <= 1100 or (n // 64) * s <= 1100]
        coarse = [(o, ld, bm, bn, 128, s, 4, 4) for (o, ld), bn, s in itertools.product(
            (("swap", "ptr"), ("swap", "tma"), ("normal", "tma")), (64, 128), splits)]
        results = {}

        def measure(cfg):
            if cfg in results or not valid(cfg, n, k):
                return
            part = torch.empty((cfg[5], m, n), device="cuda", dtype=torch.float32)
            try:
                run_splitk(x, weights[0], part, cfg)
                err = (part.sum(0) - reference).abs().max().item()
                t = graph_ms(lambda i: run_splitk(x, weights[i], part, cfg), copies) * 1e3
            except Exception as exc:  # noqa: BLE001 - a probe: shared memory overflow, compiler refusal
                print(f"  {cfg}: {type(exc).__name__}", flush=True)
                return
            results[cfg] = (t, err)

        for cfg in coarse:
            measure(cfg)
        best = sorted(results, key=lambda c: results[c][0])[:3]
        for o, ld, _, bn, _, s, _, _ in best:  # refine around the three best coarse points
            for bk, stages, warps in itertools.product((64, 128, 256), (3, 4, 6), (4, 8)):
                measure((o, ld, bm, bn, bk, s, stages, warps))
        ranked = sorted(results, key=lambda c: results[c][0])
        for cfg in ranked[:8]:
            t, err = results[cfg]
            print(f"  splitk {'/'.join(map(str, cfg))}: {t:6.1f} us  x{t / floor_us:.2f} floor  "
                  f"x{t / min(t_tn, t_nn):.3f} cuBLAS  (max err {err:.2g})", flush=True)
        for cfg in ranked:
            t, err = results[cfg]
            rows.append({"case": case, "variant": "splitk " + "/".join(map(str, cfg)), "us": round(t, 2),
                         "x_floor": round(t / floor_us, 3), "max_err": f"{err:.3g}"})
        if ranked:  # the pipelines: GEMM + the norm that follows it in a layer
            cfg = ranked[0]
            d = n
            part = torch.empty((cfg[5], m, n), device="cuda", dtype=torch.float32)
            h = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
            g = torch.ones(d, device="cuda", dtype=torch.bfloat16)
            normed = torch.empty_like(h)

            def ours(i):
                run_splitk(x, weights[i], part, cfg)
                add_rms_norm(h, part, g, 1e-5, out=normed, inplace=True, backend="triton")  # sums the parts

            def theirs(i):
                add_rms_norm(h, F.linear(x, weights[i]), g, 1e-5, out=normed, inplace=True, backend="triton")

            t_ours = graph_ms(ours, copies) * 1e3
            t_theirs = graph_ms(theirs, copies) * 1e3
            print(f"  pipeline: cuBLAS + add_rms_norm {t_theirs:.1f} us; best split-K + summing norm {t_ours:.1f} us "
                  f"(x{t_ours / t_theirs:.3f})", flush=True)
            rows.append({"case": case, "variant": "pipeline cublas+norm", "us": round(t_theirs, 2)})
            rows.append({"case": case, "variant": "pipeline splitk+sumnorm", "us": round(t_ours, 2)})
        weights = weights_nn = None  # free this case's copies before the next case makes its own
        torch.cuda.empty_cache()
        if args.csv:
            write_rows_csv(args.csv, rows, device_env())


if __name__ == "__main__":
    main()
