"""Probe (Hopper): how close can a Triton GEMM with nothing fused get to cuBLAS on the fused QKV kernel's GEMM?

A bound for the fused kernel, not a kernel of ours: out = x @ W^T, bf16, no bias, no RoPE, no cache write.
Three variants, each swept over tiles, K splits, stages and warps:
  plain   TMA tile loads, one store after the K loop (bf16 out, or -- split over K -- each split's fp32 partial to
          its own buffer with NO reduction at all: a lower bound for every split-K / stream-K scheme);
  ws      the same through Triton's automatic Hopper warp specialization (producer + two consumer warpgroups);
  reduce  split-K finished inside the kernel (the last split to arrive sums the partials and stores bf16): the
          floor of any one-kernel split-K, the fused kernel's stream-K tail included.
CUDA-graph medians over rotating weights (never L2-resident) vs cuBLAS in the same run. If even the best of these
is slower than 1.15 x cuBLAS, no epilogue work can close the gap.

Usage: python3 benchmarks/probe_triton_gemm_floor.py [--cases dream-7b:128,...] [--variants plain,ws,reduce]
       [--csv PATH]
"""
from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from bench_kernels import MODELS, device_env, graph_ms, write_rows_csv


@triton.jit
def _split_mainloop(x_desc, w_desc, pid_m, pid_n, split, k_per_split, d_model, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N] tile of x @ W^T over this split's K range, TMA tile loads."""
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, d_model)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_begin, k_end, BLOCK_K):
        a = x_desc.load([pid_m * BLOCK_M, k])
        w = w_desc.load([pid_n * BLOCK_N, k])
        acc = tl.dot(a, w.T, acc)
    return acc


@triton.jit
def _store_tile(acc, out_ptr, pid_m, pid_n, split, n_tokens, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SPLIT_ONE: tl.constexpr):
    """The only work after the K loop: bf16 rows (one split), or this split's fp32 partial, never summed."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    mask = rows[:, None] < n_tokens
    if SPLIT_ONE:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr + split.to(tl.int64) * n_tokens * n_cols + offs, acc, mask=mask)


@triton.jit
def _gemm_kernel(x_desc, w_desc, out_ptr, n_tokens, n_cols, d_model, k_per_split,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_ONE: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    acc = _split_mainloop(x_desc, w_desc, pid_m, pid_n, split, k_per_split, d_model, BLOCK_M, BLOCK_N, BLOCK_K)
    _store_tile(acc, out_ptr, pid_m, pid_n, split, n_tokens, n_cols, BLOCK_M, BLOCK_N, SPLIT_ONE)


@triton.jit
def _gemm_ws_kernel(x_ptr, w_ptr, out_ptr, n_tokens, n_cols, d_model, k_per_split,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_ONE: tl.constexpr):
    """The same GEMM through Triton's Hopper automatic warp specialization (a TMA producer warpgroup feeding
    two consumer warpgroups that split the tile's rows): it needs num_warps=4, device-side descriptors (the
    pass re-types their blocks when it splits the A load) and no else blocks."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    x_desc = tl.make_tensor_descriptor(x_ptr, [n_tokens, d_model], [d_model, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, [n_cols, d_model], [d_model, 1], [BLOCK_N, BLOCK_K])
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, d_model)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(k_begin, k_end, BLOCK_K, warp_specialize=True):
        a = x_desc.load([pid_m * BLOCK_M, k])
        w = w_desc.load([pid_n * BLOCK_N, k])
        acc = tl.dot(a, w.T, acc)
    _store_tile(acc, out_ptr, pid_m, pid_n, split, n_tokens, n_cols, BLOCK_M, BLOCK_N, SPLIT_ONE)


def _k_per_split(d_model: int, block_k: int, split: int) -> int:
    """K elements per split: the K steps shared out evenly, whole steps each (the last split may be short)."""
    return triton.cdiv(triton.cdiv(d_model, block_k), split) * block_k


def run_ws(x, w, out, block_m, block_n, block_k, split, stages):
    n_tokens, d_model = x.shape
    k_per_split = _k_per_split(d_model, block_k, split)
    grid = (w.shape[0] // block_n, triton.cdiv(n_tokens, block_m), split)
    _gemm_ws_kernel[grid](x, w, out, n_tokens, w.shape[0], d_model, k_per_split, BLOCK_M=block_m,
                          BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_ONE=split == 1, num_stages=stages, num_warps=4)


def run(x, w, out, block_m, block_n, block_k, split, stages, warps):
    n_tokens, d_model = x.shape
    k_per_split = _k_per_split(d_model, block_k, split)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w, [block_n, block_k])
    grid = (w.shape[0] // block_n, triton.cdiv(n_tokens, block_m), split)
    _gemm_kernel[grid](x_desc, w_desc, out, n_tokens, w.shape[0], d_model, k_per_split, BLOCK_M=block_m,
                       BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_ONE=split == 1, num_stages=stages, num_warps=warps)


@triton.jit
def _gemm_splitk_reduce_kernel(x_desc, w_desc, ws_ptr, arrivals_ptr, out_ptr, n_tokens, n_cols, d_model, k_per_split,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               SPLIT: tl.constexpr, SLICE: tl.constexpr):
    """Split-K with the reduction in the kernel and nothing else (no bias, no RoPE, plain bf16 rows): each split
    stores its fp32 partial and counts in on the tile's counter; the last one sums all SPLIT partials slice by
    slice (every contributor's loads issued before the adds) and stores bf16. The floor of any split-K scheme
    that finishes in one kernel, the fused kernel's stream-K tail included."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    tile = pid_m * tl.num_programs(0) + pid_n
    acc = _split_mainloop(x_desc, w_desc, pid_m, pid_n, split, k_per_split, d_model, BLOCK_M, BLOCK_N, BLOCK_K)
    TILE: tl.constexpr = BLOCK_M * BLOCK_N
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile_ws = ws_ptr + tile.to(tl.int64) * SPLIT * TILE
    tl.store(tile_ws + split * TILE + offs, acc)
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        tl.store(arrivals_ptr + tile, 0)
        slice_offs = tl.arange(0, SLICE)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        for row0 in tl.static_range(0, BLOCK_M, SLICE):
            total = tl.load(tile_ws + row0 * BLOCK_N + slice_offs, cache_modifier=".cg")
            for c in tl.static_range(1, SPLIT):
                total += tl.load(tile_ws + c * TILE + row0 * BLOCK_N + slice_offs, cache_modifier=".cg")
            rows = pid_m * BLOCK_M + row0 + tl.arange(0, SLICE)
            tl.store(out_ptr + rows[:, None].to(tl.int64) * n_cols + cols[None, :], total.to(tl.bfloat16),
                     mask=rows[:, None] < n_tokens)


def run_reduce(x, w, ws, arrivals, out, block_m, block_n, block_k, split, slice_rows, stages, warps):
    n_tokens, d_model = x.shape
    k_per_split = _k_per_split(d_model, block_k, split)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, block_k])
    w_desc = TensorDescriptor.from_tensor(w, [block_n, block_k])
    grid = (w.shape[0] // block_n, triton.cdiv(n_tokens, block_m), split)
    _gemm_splitk_reduce_kernel[grid](x_desc, w_desc, ws, arrivals, out, n_tokens, w.shape[0], d_model, k_per_split,
                                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split,
                                     SLICE=slice_rows, num_stages=stages, num_warps=warps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv")
    parser.add_argument("--cases", default="dream-7b:128,dream-7b:1024")
    parser.add_argument("--variants", default="plain,ws,reduce",
                        help="plain: TMA GEMM; ws: Triton's Hopper warp specialization; reduce: split-K reduced in "
                             "the kernel")
    args = parser.parse_args()
    variants = set(args.variants.split(","))
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}")
    rows = []
    for case in args.cases.split(","):
        model, n_tokens = case.split(":")
        n_tokens = int(n_tokens)
        n_heads, n_kv_heads, head_dim, d_model = MODELS[model][:4]
        n_cols = (n_heads + 2 * n_kv_heads) * head_dim
        copies = 8
        weights = [torch.randn(n_cols, d_model, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(n_tokens, d_model, device="cuda", dtype=torch.bfloat16)
        t_mm = graph_ms(lambda i: F.linear(x, weights[i]), copies)
        print(f"\n{model} N={n_tokens} ({n_tokens}x{n_cols}x{d_model}): cuBLAS {t_mm * 1000:.1f} us", flush=True)
        results = []
        splits = (1, 2, 3, 4) if n_tokens <= 256 else (1, 2)
        reduce_splits = (2, 3, 4) if n_tokens <= 256 else (2,)
        arrivals = torch.zeros(4096, device="cuda", dtype=torch.int32)
        for (bm, bn), split, slice_rows, (stages, warps) in [] if "reduce" not in variants else itertools.product(
                ((64, 128), (128, 128)), reduce_splits, (32, 64), ((5, 4), (4, 8), (5, 8))):
            bk = 64
            if slice_rows > bm:
                continue
            partials = torch.empty(triton.cdiv(n_tokens, bm) * n_cols * bm * split, device="cuda",
                                   dtype=torch.float32)
            out = torch.empty((n_tokens, n_cols), device="cuda", dtype=torch.bfloat16)
            try:
                run_reduce(x, weights[0], partials, arrivals, out, bm, bn, bk, split, slice_rows, stages, warps)
                run_reduce(x, weights[0], partials, arrivals, out, bm, bn, bk, split, slice_rows, stages, warps)
                torch.cuda.synchronize()  # run twice: the second call proves the arrival counters were reset
                err = (out.float() - F.linear(x, weights[0]).float()).abs().max().item()
                t = graph_ms(lambda i: run_reduce(x, weights[i], partials, arrivals, out, bm, bn, bk, split,
                                                  slice_rows, stages, warps), copies)
            except Exception as exc:  # noqa: BLE001 - a probe: shared memory overflow etc.
                print(f"  reduce BM={bm} split={split}: {type(exc).__name__}", flush=True)
                continue
            results.append((t, f"reduce BM={bm} BN={bn} split={split} slice={slice_rows} stages={stages} "
                               f"warps={warps} (max err {err:.2g})"))
            rows.append({"model": model, "tokens": n_tokens, "variant": results[-1][1], "us": round(t * 1000, 2),
                         "vs_cublas": round(t / t_mm, 3)})
        for (bm, bn), split, stages in [] if "ws" not in variants else itertools.product(
                ((64, 128), (128, 128), (128, 256)), splits, (3, 4, 5)):
            bk = 64
            out = torch.empty((split, n_tokens, n_cols), device="cuda",
                              dtype=torch.bfloat16 if split == 1 else torch.float32)
            try:
                run_ws(x, weights[0], out, bm, bn, bk, split, stages)
                torch.cuda.synchronize()
                t = graph_ms(lambda i: run_ws(x, weights[i], out, bm, bn, bk, split, stages), copies)
            except Exception as exc:  # noqa: BLE001 - a probe: shared memory overflow, a compiler refusal
                print(f"  WS BM={bm} BN={bn} split={split} stages={stages}: {type(exc).__name__}: "
                      f"{str(exc).strip().splitlines()[-1][:160] if str(exc).strip() else ''}", flush=True)
                continue
            results.append((t, f"WS BM={bm} BN={bn} BK={bk} split={split} stages={stages} warps=4+8"))
            rows.append({"model": model, "tokens": n_tokens, "variant": results[-1][1], "us": round(t * 1000, 2),
                         "vs_cublas": round(t / t_mm, 3)})
        for (bm, bn), split, (stages, warps) in [] if "plain" not in variants else itertools.product(
                ((64, 64), (64, 128), (128, 64), (128, 128), (64, 256), (128, 256)), splits,
                ((4, 4), (5, 4), (6, 4), (3, 8), (4, 8))):
            bk = 64
            if bn == 256 and warps == 4:
                continue
            out = torch.empty((split, n_tokens, n_cols), device="cuda",
                              dtype=torch.bfloat16 if split == 1 else torch.float32)
            try:
                run(x, weights[0], out, bm, bn, bk, split, stages, warps)
                t = graph_ms(lambda i: run(x, weights[i], out, bm, bn, bk, split, stages, warps), copies)
            except Exception as exc:  # noqa: BLE001 - a probe: shared memory overflow etc.
                del exc
                continue
            results.append((t, f"BM={bm} BN={bn} BK={bk} split={split} stages={stages} warps={warps}"))
            rows.append({"model": model, "tokens": n_tokens, "variant": results[-1][1], "us": round(t * 1000, 2),
                         "vs_cublas": round(t / t_mm, 3)})
        for t, name in sorted(results)[:12]:
            print(f"  {name:<50} {t * 1000:7.1f} us  x{t / t_mm:.3f}", flush=True)
        rows.append({"model": model, "tokens": n_tokens, "variant": "cublas", "us": round(t_mm * 1000, 2),
                     "vs_cublas": 1.0})
        if args.csv:  # after every case, so a run cut short by a time limit keeps what it measured
            write_rows_csv(args.csv, rows, device_env())


if __name__ == "__main__":
    main()
