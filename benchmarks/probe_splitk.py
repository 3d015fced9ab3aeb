"""Probe (H200): split-K schedules for the small-N QKV GEMM, plain matmul only (no RoPE), vs cuBLAS.

Each config: grid of (row tiles x column tiles x S K-splits); a program streams x[BM, Kslice] and
w[BN, Kslice] through TMA and either stores bf16 (S == 1), or stores its fp32 partial and the last of the
tile's S programs to arrive sums the partials in split order (deterministic) and stores bf16 ("last"), or
stores the fp32 partial for a second reduce kernel ("two"). CUDA-graph medians over rotating weight copies.
Usage: python3 benchmarks/probe_splitk.py [--csv PATH]
"""
from __future__ import annotations

import argparse
import csv
import itertools
import math

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _splitk_kernel(x_desc, w_desc, out_ptr, ws_ptr, cnt_ptr, M, N, K, S: tl.constexpr, MODE: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BN)
    split = pid % S
    tile = pid // S
    pid_n = tile % tiles_n
    pid_m = tile // tiles_n
    steps = tl.cdiv(K, BK)
    k0 = (split * steps // S) * BK
    k1 = ((split + 1) * steps // S) * BK
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(k0, k1, BK):
        a = x_desc.load([pid_m * BM, k])
        w = w_desc.load([pid_n * BN, k])
        acc = tl.dot(a, w.T, acc)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    out_ptrs = out_ptr + offs_m[:, None] * N + offs_n[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    if MODE == 0:
        tl.store(out_ptrs, acc.to(tl.bfloat16), mask=mask)
    else:
        slot = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        tl.store(ws_ptr + (pid.to(tl.int64) * BM * BN) + slot, acc, cache_modifier=".cg")
        if MODE == 1:
            tl.debug_barrier()
            old = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if old == S - 1:
                tl.debug_barrier()
                total = tl.zeros([BM, BN], dtype=tl.float32)
                for s in range(S):
                    total += tl.load(ws_ptr + ((tile * S + s).to(tl.int64) * BM * BN) + slot, cache_modifier=".cg")
                tl.store(out_ptrs, total.to(tl.bfloat16), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def _reduce_kernel(ws_ptr, out_ptr, M, N, S: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   RB: tl.constexpr):
    # one program per (tile, RB-row slice): sums S partials of that slice
    pid = tl.program_id(0)
    per_tile = BM // RB
    tile = pid // per_tile
    r0 = (pid % per_tile) * RB
    tiles_n = tl.cdiv(N, BN)
    pid_n = tile % tiles_n
    pid_m = tile // tiles_n
    slot = (r0 + tl.arange(0, RB))[:, None] * BN + tl.arange(0, BN)[None, :]
    total = tl.zeros([RB, BN], dtype=tl.float32)
    for s in range(S):
        total += tl.load(ws_ptr + ((tile * S + s).to(tl.int64) * BM * BN) + slot)
    offs_m = pid_m * BM + r0 + tl.arange(0, RB)
    offs_n = pid_n * BN + tl.arange(0, BN)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], total.to(tl.bfloat16), mask=mask)


SHAPES = {"dream128": (128, 3584, 4608), "llada128": (128, 4096, 12288), "dream1024": (1024, 3584, 4608),
          "llada1024": (1024, 4096, 12288)}


def run_shape(name, rows_out, sms):
    M, K, N = SHAPES[name]
    wbytes = N * K * 2
    copies = max(2, min(8, math.ceil(4 * 60e6 / wbytes)))
    ws_ = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / K**0.5 for _ in range(copies)]
    xs = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(xs[0], ws_[0]).float()
    t_cublas = do_bench_cudagraph(lambda: [torch.nn.functional.linear(xs[i], ws_[i]) for i in range(copies)],
                                  rep=200, return_mode="median") / copies
    print(f"\n{name} M={M} K={K} N={N} copies={copies}: cuBLAS {t_cublas * 1000:.1f} us", flush=True)
    rows_out.append(dict(shape=name, variant="cublas", us=round(t_cublas * 1000, 2)))
    small = M <= 256
    tiles_list = ((128, 128), (128, 256), (64, 256)) if small else ((128, 128), (128, 256))
    kst = ((64, 5), (128, 3), (128, 4)) if small else ((64, 3), (64, 4))
    splits = (1, 2, 3, 4, 7) if small else (1, 2, 3)
    configs = []
    for (BM, BN), (BK, stages), S in itertools.product(tiles_list, kst, splits):
        warps = 4 if BM * BN <= 128 * 128 else 8
        for mode in ((0,) if S == 1 else (1, 2) if small else (1,)):
            if stages * (BM + BN) * BK * 2 <= 220 * 1024:
                configs.append((BM, BN, S, BK, stages, warps, mode))
    print(f"  {len(configs)} configs", flush=True)
    best = None
    for BM, BN, S, BK, stages, warps, mode in configs:
        tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
        grid = tiles * S
        x_descs = [TensorDescriptor.from_tensor(x, [BM, BK]) for x in xs]
        w_descs = [TensorDescriptor.from_tensor(w, [BN, BK]) for w in ws_]
        ws = torch.empty(grid * BM * BN, device="cuda", dtype=torch.float32)
        cnt = torch.zeros(tiles, device="cuda", dtype=torch.int32)

        def call(i):
            _splitk_kernel[(grid,)](x_descs[i], w_descs[i], out, ws, cnt, M, N, K, S=S, MODE=1 if mode == 1 else
                                    (0 if S == 1 else 2), BM=BM, BN=BN, BK=BK, num_stages=stages,
                                    num_warps=warps)
            if mode == 2:
                _reduce_kernel[(tiles * (BM // 16),)](ws, out, M, N, S=S, BM=BM, BN=BN, RB=16, num_warps=4)
        try:
            call(0)
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            if err > 1e-2:
                print(f"  BAD err {err} {BM} {BN} {S} {BK} {stages} {warps} {mode}")
                continue
            t = do_bench_cudagraph(lambda: [call(i) for i in range(copies)], rep=100,
                                   return_mode="median") / copies
        except Exception as exc:  # noqa: BLE001 - probe: report and go on
            print(f"  fail {BM} {BN} {S} {BK} {stages} {warps} {mode}: {str(exc)[:100]}")
            continue
        kslice = K // S
        per_prog = (BM + BN) * kslice * 2
        row = dict(shape=name, variant=f"BM{BM} BN{BN} S{S} BK{BK} st{stages} w{warps} mode{mode}",
                   us=round(t * 1000, 2), vs_cublas=round(t / t_cublas, 3), programs=grid,
                   kb_per_prog=per_prog // 1024, total_mb=round(grid * per_prog / 1e6, 1))
        rows_out.append(row)
        if best is None or t < best[0]:
            best = (t, row)
    ranked = sorted([r for r in rows_out if r["shape"] == name and "vs_cublas" in r], key=lambda r: r["us"])
    for r in ranked[:12]:
        print(f"  {r['us']:7.1f} us  x{r['vs_cublas']:.3f}  {r['variant']:<40} progs {r['programs']:4d} "
              f"{r['kb_per_prog']:5d} KB/prog total {r['total_mb']} MB", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv")
    parser.add_argument("--shapes", default="dream128,llada128,dream1024")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(props.name, torch.__version__, triton.__version__, props.multi_processor_count, flush=True)
    rows = []
    for name in args.shapes.split(","):
        run_shape(name, rows, props.multi_processor_count)
    if args.csv:
        keys = sorted({k for r in rows for k in r})
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
