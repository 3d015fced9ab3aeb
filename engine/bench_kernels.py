"""GPU benchmark of the two Triton kernels against the torch paths they replace.

fused_qkv_rope_cache, LLaDA-8B and Dream-7B layer geometry, at 128 tokens (batch 1), 1024 (8 x 128) and
4096 (32 x 128): the fused kernel vs the unfused reference (one matmul on the stacked weight, RoPE from
tables, index_copy_) and vs a bare cuBLAS matmul of the same GEMM, plus the fused kernel's bandwidth
against a device-to-device copy measured in the same run. `fused` is a FusedQKVRopeCache op built once (what the
engine's hot loop calls); on Hopper it runs auto's measured choice and each of its four paths (pointer,
data-parallel TMA, stream-K TMA, cuBLAS + RoPE kernel) is also timed forced (`fused:<path>`). host_us_functional is the host cost of
the functional, input-checking fused_qkv_rope_cache(backend="triton") on the same inputs.

scheduled_attention on a ragged batch of 32 (one 4096-token prefill over 4096 keys beside 31 refreshes of
128 queries over 1000..4096 keys): the one-launch kernel vs SDPA on queries/keys padded to the maximum
(with a key-padding mask) and vs a loop of per-sequence SDPA calls.

The output and down projections at a decode step's row counts (32, 48, 128): cuBLAS followed by add+RMSNorm
against the projection op the engine runs (kernels/split_k_linear.py: the selector's choice, cuBLAS or split-K
partials that the norm sums) followed by the same norm, and each against the weight's streaming floor; and the
MLP's gate/up projection with its activation: cuBLAS then the activation kernel against the op the engine runs
(kernels/gate_up_silu.py: that pair, or one fused kernel), the weight in the layout the engine keeps on this GPU.

Timing: triton.testing.do_bench medians ("eager": one call per sample, L2 flushed before each, so a call
whose Python/launch cost exceeds the flush shows that cost too) and CUDA graph replays of a loop over
rotating input copies ("graph": no launch gaps, weights never L2-resident). host_us is the CPU time to
issue one call, measured with the GPU queue absorbing the work.
Usage: flash-dllm-chat bench kernels [--csv PATH] [--tokens N ...] [--ops fused attention projections]
(needs CUDA)
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph

from flash_dllm.kernels.fused_qkv_rope_cache import (KERNEL_PATHS, FusedQKVRopeCache, forced_fused_qkv,
                                                     fused_qkv_rope_cache, fused_qkv_rope_cache_reference,
                                                     read_path_request)
from flash_dllm.kernels.add_rms_norm import AddRMSNorm
from flash_dllm.kernels.scheduled_attention import ScheduledAttention, build_plan, scheduled_attention
from flash_dllm.kernels.gate_up_silu import GateUpSilu
from flash_dllm.kernels.split_k_linear import SkinnyLinear

MODELS = {  # n_heads, n_kv_heads, head_dim, d_model, bias, rope theta
    "llada-8b": (32, 32, 128, 4096, False, 5e5),
    "dream-7b": (28, 4, 128, 3584, True, 1e6),
}
MLP_WIDTH = {"llada-8b": 12288, "dream-7b": 18944}
PROJECTION_ROWS = (32, 48, 128)  # fast-dllm's block, Flash-Verify's verify pass, a flash-cache step
DTYPE = torch.bfloat16
SLOT = 4096 + 128  # cache rows per sequence slot
ROWS: list[dict] = []


def median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def graph_ms(fn, copies: int) -> float:
    """Median CUDA-graph replay time of fn(0..copies-1) in a row, per call."""
    return do_bench_cudagraph(lambda: [fn(i) for i in range(copies)], rep=200, return_mode="median") / copies


def record(op, model, shape, variant, ms, **extra):
    row = {"op": op, "model": model, "shape": shape, "variant": variant, "ms": round(ms, 5)}
    row.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in extra.items()})
    ROWS.append(row)
    details = "  ".join(f"{k}={row[k]}" for k in extra)
    print(f"  {variant:<26} {ms * 1000:10.1f} us  {details}", flush=True)


def host_us_per_call(fn, copies: int, calls: int = 50) -> float:
    """CPU time to issue one call (Python + launches), measured while the GPU queue absorbs the work."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(i % copies)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB; bytes read plus written per second."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def fused_inputs(model: str, n_tokens: int, copies: int):
    n_heads, n_kv_heads, head_dim, d_model, bias, theta = MODELS[model]
    rows = (n_heads + 2 * n_kv_heads) * head_dim
    weights = [torch.randn(rows, d_model, device="cuda", dtype=DTYPE) / d_model**0.5 for _ in range(copies)]
    biases = [torch.randn(rows, device="cuda", dtype=DTYPE) if bias else None for _ in range(copies)]
    xs = [torch.randn(n_tokens, d_model, device="cuda", dtype=DTYPE) for _ in range(copies)]
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float64) / head_dim)
    angles = torch.arange(SLOT, device="cuda", dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos().float(), angles.sin().float()
    n_seqs = max(1, n_tokens // 128)  # 128 refreshed positions per sequence, each in its own slot
    positions = torch.cat([torch.randperm(4096, device="cuda")[: n_tokens // n_seqs].sort().values
                           for _ in range(n_seqs)])
    cache_rows = positions + SLOT * torch.arange(n_seqs, device="cuda").repeat_interleave(n_tokens // n_seqs)
    k_cache = torch.zeros(n_seqs * SLOT, n_kv_heads * head_dim, device="cuda", dtype=DTYPE)
    v_cache = torch.zeros_like(k_cache)
    return weights, biases, xs, cos, sin, positions, cache_rows, k_cache, v_cache


def bench_fused(model: str, n_tokens: int, copy_gbs: float, l2_bytes: int) -> None:
    n_heads, n_kv_heads, head_dim, d_model, _, _ = MODELS[model]
    rows = (n_heads + 2 * n_kv_heads) * head_dim
    weight_bytes = rows * d_model * 2
    copies = min(8, max(2, math.ceil(4 * l2_bytes / weight_bytes)))  # working set >= 4x L2
    w, b, x, cos, sin, pos, crow, kc, vc = fused_inputs(model, n_tokens, copies)
    shape = f"N={n_tokens} D={d_model} cols={rows}"
    print(f"\nfused_qkv_rope_cache {model} {shape} (weights rotate over {copies} copies)", flush=True)

    op = FusedQKVRopeCache("triton", n_heads, n_kv_heads)

    def fused(i):
        return op(x[i], w[i], b[i], cos, sin, pos, crow, kc, vc)

    def functional(i):
        return fused_qkv_rope_cache(x[i], w[i], b[i], cos, sin, pos, crow, kc, vc, n_heads, n_kv_heads,
                                    backend="triton")

    def reference(i):
        return fused_qkv_rope_cache_reference(x[i], w[i], b[i], cos, sin, pos, crow, kc, vc, n_heads, n_kv_heads)

    def cublas(i):
        return F.linear(x[i], w[i])

    q = fused(0)  # tunes this bucket (and, on Hopper, times the four paths) before anything is timed
    ref_q = reference(0)
    err = ((q.float() - ref_q.float()).norm() / ref_q.float().norm()).item()
    config = describe_choice(op.bound_choice(x[0], w[0], b[0]))  # auto's choice, or FLASH_DLLM_FUSED_QKV_PATH's
    print(f"  fused {config}", flush=True)
    moved = weight_bytes + n_tokens * (d_model + rows) * 2 + n_tokens * head_dim * 4  # + q/k/v out, cos/sin
    flops = 2 * n_tokens * d_model * rows
    times, host = {}, {}
    for name, fn in (("fused", fused), ("reference", reference), ("cublas_matmul", cublas)):
        times[name, "eager"] = median_ms(lambda: fn(1 % copies))
        times[name, "graph"] = graph_ms(fn, copies)
        host[name] = host_us_per_call(fn, copies)
    functional(0)
    host["functional"] = host_us_per_call(functional, copies)
    for mode in ("eager", "graph"):
        t_fused, t_ref, t_mm = times["fused", mode], times["reference", mode], times["cublas_matmul", mode]
        gbs = moved / t_fused / 1e6
        eager_only = {"config": config, "host_us_functional": host["functional"]} if mode == "eager" else {}
        record("fused_qkv_rope_cache", model, shape, f"fused[{mode}]", t_fused, tflops=flops / t_fused / 1e9,
               gbs=gbs, frac_copy_bw=gbs / copy_gbs, speedup_vs_reference=t_ref / t_fused,
               vs_cublas=t_fused / t_mm, rel_err_q=err, host_us=host["fused"], **eager_only)
        record("fused_qkv_rope_cache", model, shape, f"reference[{mode}]", t_ref, tflops=flops / t_ref / 1e9,
               host_us=host["reference"])
        record("fused_qkv_rope_cache", model, shape, f"cublas_matmul[{mode}]", t_mm, tflops=flops / t_mm / 1e9,
               gbs=moved / t_mm / 1e6, frac_copy_bw=moved / t_mm / 1e6 / copy_gbs, host_us=host["cublas_matmul"])
    if read_path_request() == "auto" and torch.cuda.get_device_capability()[0] >= 9:
        for forced in KERNEL_PATHS:  # every Hopper kernel, CUDA-graph medians beside auto's choice
            with forced_fused_qkv(path=forced):
                fused(0)  # binds the forced path (tuned already while auto measured) outside the graph
                t = graph_ms(fused, copies)
                record("fused_qkv_rope_cache", model, shape, f"fused:{forced}[graph]", t, tflops=flops / t / 1e9,
                       vs_cublas=t / times["cublas_matmul", "graph"],
                       config=describe_choice(op.bound_choice(x[0], w[0], b[0])))


def describe_choice(choice) -> str:
    """path and config of a FusedQKVChoice, without commas (a CSV cell)."""
    return f"path {choice.path}: {choice.config}".replace(",", ";")


def ragged_batch(n_heads: int, n_kv_heads: int, head_dim: int = 128, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q_lens = [4096] + [128] * 31
    kv_lens = [4096] + torch.randint(1000, 4097, (31,), generator=gen).tolist()
    kv_starts = [b * SLOT for b in range(32)]
    q = torch.randn(sum(q_lens), n_heads * head_dim, device="cuda", dtype=DTYPE)
    k_cache = torch.randn(32 * SLOT, n_kv_heads * head_dim, device="cuda", dtype=DTYPE)
    v_cache = torch.randn_like(k_cache)
    return q_lens, kv_lens, kv_starts, q, k_cache, v_cache


def padded_sdpa_inputs(q_lens, kv_lens, kv_starts, q, k_cache, v_cache, n_heads, n_kv_heads, head_dim):
    """Everything padded to the longest query and key range; GQA heads expanded (SDPA's masked kernels)."""
    n_seqs, max_q, max_kv = len(q_lens), max(q_lens), max(kv_lens)
    qp = q.new_zeros(n_seqs, n_heads, max_q, head_dim)
    kp = q.new_zeros(n_seqs, n_heads, max_kv, head_dim)
    vp = torch.zeros_like(kp)
    key_ok = torch.zeros(n_seqs, 1, 1, max_kv, dtype=torch.bool, device="cuda")
    group, q0 = n_heads // n_kv_heads, 0
    for b, (n, kl, k0) in enumerate(zip(q_lens, kv_lens, kv_starts)):
        qp[b, :, :n] = q[q0 : q0 + n].view(n, n_heads, head_dim).transpose(0, 1)
        kp[b, :, :kl] = k_cache[k0 : k0 + kl].view(kl, n_kv_heads, head_dim).transpose(0, 1).repeat_interleave(group, 0)
        vp[b, :, :kl] = v_cache[k0 : k0 + kl].view(kl, n_kv_heads, head_dim).transpose(0, 1).repeat_interleave(group, 0)
        key_ok[b, ..., :kl] = True
        q0 += n
    return qp, kp, vp, key_ok


def per_sequence_sdpa(q_lens, kv_lens, kv_starts, q, k_cache, v_cache, n_heads, n_kv_heads, head_dim):
    out, q0 = torch.empty_like(q), 0
    for n, kl, k0 in zip(q_lens, kv_lens, kv_starts):
        qs = q[q0 : q0 + n].view(1, n, n_heads, head_dim).transpose(1, 2)
        ks = k_cache[k0 : k0 + kl].view(1, kl, n_kv_heads, head_dim).transpose(1, 2)
        vs = v_cache[k0 : k0 + kl].view(1, kl, n_kv_heads, head_dim).transpose(1, 2)
        o = F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=n_heads != n_kv_heads)
        out[q0 : q0 + n] = o.transpose(1, 2).reshape(n, -1)
        q0 += n
    return out


def bench_attention(model: str) -> None:
    n_heads, n_kv_heads, head_dim = MODELS[model][:3]
    q_lens, kv_lens, kv_starts, q, kc, vc = ragged_batch(n_heads, n_kv_heads, head_dim)
    shape = f"B=32 q=1x4096+31x128 kv=4096,1000..4096 H={n_heads}/{n_kv_heads}"
    print(f"\nscheduled_attention {model} {shape}", flush=True)
    flops = 4 * head_dim * n_heads * sum(n * kl for n, kl in zip(q_lens, kv_lens))
    loop_out = per_sequence_sdpa(q_lens, kv_lens, kv_starts, q, kc, vc, n_heads, n_kv_heads, head_dim)
    t_loop = median_ms(lambda: per_sequence_sdpa(q_lens, kv_lens, kv_starts, q, kc, vc, n_heads, n_kv_heads,
                                                 head_dim))
    qp, kp, vp, key_ok = padded_sdpa_inputs(q_lens, kv_lens, kv_starts, q, kc, vc, n_heads, n_kv_heads, head_dim)
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            # no MATH fallback: it would materialise 32 x H x 4096 x 4096 fp32 scores
            t_pad = median_ms(lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=key_ok))
    except RuntimeError as exc:  # no fused SDPA kernel takes this mask here: report, keep going
        print(f"  padded SDPA failed: {exc}")
        t_pad = float("nan")
    del qp, kp, vp
    window = torch.zeros(q.shape[0], dtype=torch.bool, device="cuda")
    for b, start in enumerate(torch.tensor([0] + q_lens).cumsum(0)[:-1].tolist()):
        window[start : start + 16] = b > 0  # the 16-row masked window of each refreshing sequence
    score = torch.zeros(kc.shape[0], device="cuda")
    for block_m in (64, 128):
        for with_score in (False, True):
            plan = build_plan(q_lens, kv_starts, kv_lens, "cuda", block_m=block_m,
                              score_query=window if with_score else None)
            so = score if with_score else None
            out = scheduled_attention(q, kc, vc, plan, n_heads, n_kv_heads, so, backend="triton")
            err = ((out.float() - loop_out.float()).norm() / loop_out.float().norm()).item()
            t = median_ms(lambda: scheduled_attention(q, kc, vc, plan, n_heads, n_kv_heads, so, backend="triton"))
            auto = ScheduledAttention("triton", n_heads, n_kv_heads, 128)
            auto(q, kc, vc, plan, score.clone() if with_score else None)  # its first call settles the split count
            splits = auto.key_splits(q, plan, so)
            config = f"key splits {splits}"
            record("scheduled_attention", model, shape, f"scheduled[bm={block_m}{'+score' if with_score else ''}]",
                   t, tflops=flops / t / 1e9, vs_padded_sdpa=t_pad / t, vs_sdpa_loop=t_loop / t, rel_err=err,
                   config=config)
    record("scheduled_attention", model, shape, "padded_sdpa", t_pad, tflops=flops / t_pad / 1e9)
    record("scheduled_attention", model, shape, "per_sequence_sdpa_loop", t_loop, tflops=flops / t_loop / 1e9)


def bench_projections(model: str, copy_gbs: float, l2_bytes: int, device: str = "cuda", timer=None) -> None:
    """timer(fn, copies) -> ms per call (default: graph_ms); device and timer are there for the CPU test."""
    timer = timer or graph_ms
    d_model = MODELS[model][3]
    op, norm = SkinnyLinear("triton"), AddRMSNorm("triton")
    for name, d_in in (("o", d_model), ("down", MLP_WIDTH[model])):
        weight_bytes = d_model * d_in * 2
        copies = min(16, max(2, math.ceil(4 * l2_bytes / weight_bytes)))
        weights = [torch.randn(d_model, d_in, device=device, dtype=DTYPE) / d_in ** 0.5 for _ in range(copies)]
        gain = torch.ones(d_model, device=device, dtype=DTYPE)
        floor_ms = weight_bytes / copy_gbs / 1e6
        for rows in PROJECTION_ROWS:
            x = torch.randn(rows, d_in, device=device, dtype=DTYPE)
            h = torch.zeros(rows, d_model, device=device, dtype=DTYPE)
            normed = torch.empty_like(h)
            shape = f"{name} N={rows} D_in={d_in} D_out={d_model}"
            print(f"\nprojection {model} {shape} (weights rotate over {copies} copies)", flush=True)
            for w in weights:
                op(x, w)  # binds each weight (and, for the first, tunes the problem) before anything is timed
            choice = op.bound_choice(x, weights[0])
            t_cublas = timer(lambda i: norm(h, F.linear(x, weights[i]), gain, 1e-6, normed, True), copies)
            t_op = timer(lambda i: norm(h, op(x, weights[i]), gain, 1e-6, normed, True), copies)
            record("projection_into_norm", model, shape, "cublas+norm[graph]", t_cublas, x_floor=t_cublas / floor_ms)
            record("projection_into_norm", model, shape, "engine+norm[graph]", t_op, x_floor=t_op / floor_ms,
                   vs_cublas=t_op / t_cublas, config=str(choice).replace(",", ";"))


def bench_gate_up(model: str, copy_gbs: float, l2_bytes: int, device: str = "cuda", timer=None) -> None:
    """timer(fn, copies) -> ms per call (default: graph_ms); device and timer are there for the CPU test."""
    timer = timer or graph_ms
    d_model, d_ff = MODELS[model][3], MLP_WIDTH[model]
    op = GateUpSilu("triton")
    transposed = device == "cuda" and torch.cuda.get_device_capability()[0] >= 9  # as Engine stores it there
    weight_bytes = 2 * d_ff * d_model * 2
    copies = min(16, max(2, math.ceil(4 * l2_bytes / weight_bytes)))
    weights = [torch.randn(2 * d_ff, d_model, device=device, dtype=DTYPE) / d_model ** 0.5 for _ in range(copies)]
    weights = [w.t().contiguous().t() if transposed else w for w in weights]
    floor_ms = weight_bytes / copy_gbs / 1e6
    for rows in PROJECTION_ROWS:
        x = torch.randn(rows, d_model, device=device, dtype=DTYPE)
        shape = f"gate_up N={rows} D_in={d_model} D_ff={d_ff}{' kn-storage' if transposed else ''}"
        print(f"\ngate/up + activation {model} {shape} (weights rotate over {copies} copies)", flush=True)
        for w in weights:
            op(x, w)  # binds each weight (and, for the first, tunes the problem) before anything is timed
        choice = op.bound_choice(x, weights[0])
        t_cublas = timer(lambda i: op.silu_mul(F.linear(x, weights[i])), copies)
        t_op = timer(lambda i: op(x, weights[i]), copies)
        record("gate_up_silu", model, shape, "cublas+silu_mul[graph]", t_cublas, x_floor=t_cublas / floor_ms)
        record("gate_up_silu", model, shape, "engine[graph]", t_op, x_floor=t_op / floor_ms,
               vs_cublas=t_op / t_cublas, config=str(choice).replace(",", ";"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flash-dllm-chat bench kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="write all measurements here")
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 1024, 4096])
    parser.add_argument("--ops", nargs="+", choices=("fused", "attention", "projections"),  # projections: O, down, gate/up
                        default=["fused", "attention", "projections"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("error: bench kernels needs a CUDA GPU (and TRITON_INTERPRET unset)", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    env = {**device_env(), "sms": props.multi_processor_count, "l2_mb": props.L2_cache_size / 2**20}
    print(f"{env}\ndtype={DTYPE}; do_bench median (warmup 25 ms, rep 200 ms); graph = CUDA-graph replay", flush=True)
    torch.manual_seed(0)
    copy_gbs = copy_bandwidth_gbs()
    print(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    ROWS.append({"op": "copy", "model": "-", "shape": "1 GiB", "variant": "d2d_copy", "gbs": round(copy_gbs, 1)})
    cases = []
    if "fused" in args.ops:
        cases += [(bench_fused, (model, n, copy_gbs, props.L2_cache_size)) for model in MODELS for n in args.tokens]
    if "attention" in args.ops:
        cases += [(bench_attention, (model,)) for model in MODELS]
    if "projections" in args.ops:
        cases += [(bench, (model, copy_gbs, props.L2_cache_size)) for model in MODELS
                  for bench in (bench_projections, bench_gate_up)]
    failed = 0
    for bench, case in cases:
        try:
            bench(*case)
        except Exception:  # one broken case must not cost the others' numbers
            failed += 1
            traceback.print_exc()
        torch.cuda.empty_cache()
        if args.csv:  # rewritten after every case, so a crash later keeps what was measured
            write_csv(args.csv, env)
    return 1 if failed else 0


def write_csv(path: str, env: dict) -> None:
    write_rows_csv(path, ROWS, env)


def device_env() -> dict:
    """The columns that say where a probe ran."""
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__}


def write_rows_csv(path: str, rows: list[dict], env: dict) -> None:
    """rows with env's columns first; the header is every key any row has, in first-seen order."""
    fields = list(dict.fromkeys([*env, *(k for r in rows for k in r)]))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({**env, **row})


if __name__ == "__main__":
    sys.exit(main())
