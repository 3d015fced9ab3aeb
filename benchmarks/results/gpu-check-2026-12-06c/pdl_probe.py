"""Probe: what programmatic dependent launch (PDL) saves at a kernel boundary of a batch-1 decode step.

A chain of 32 (A, B) pairs captured in one CUDA graph, like a step's layers: A is a norm-sized elementwise kernel
over [128, 4096] bf16 (x -> y), B streams a 100 MB bf16 weight (the fused QKV's size) and dots each chunk with
a slice of y (so it depends on A). Weights rotate over copies that together exceed L2. Variants:
  plain      - ordinary launches;
  pdl        - B launched with launch_pdl=True, griddepcontrol.wait before it reads y; A triggers its dependents
               when its programs finish their loads;
  pdl-early  - as pdl, and B's programs read their first weight block before waiting (work that does not
               depend on A overlaps A).
Prints us per pair (median of 200 replays) and the B-alone time (a graph of B only, no A).
"""
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from flash_dllm.kernels import graph_replay_ms

ROWS, D = 128, 4096
W_ELEMS = 12288 * 4096
BLOCK = 4096
N_PROGRAMS = 512  # 24 blocks of 4096 each: W_ELEMS splits evenly


@triton.jit
def norm_like(x_ptr, y_ptr, D: tl.constexpr, TRIGGER: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, D)
    x = tl.load(x_ptr + row * D + cols).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x) / D + 1e-6)
    if TRIGGER:
        gdc_launch_dependents()
    tl.store(y_ptr + row * D + cols, (x * r).to(tl.bfloat16))


@triton.jit
def stream_weight(w_ptr, y_ptr, out_ptr, chunk, BLOCK: tl.constexpr, WAIT: tl.constexpr, EARLY: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    base = pid.to(tl.int64) * chunk
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    first = tl.zeros([BLOCK], dtype=tl.float32)
    if EARLY:
        first = tl.load(w_ptr + base + offs).to(tl.float32)
    if WAIT:
        gdc_wait()
    y = tl.load(y_ptr + offs).to(tl.float32)
    if EARLY:
        acc += first * y
        start = BLOCK
    else:
        start = 0
    for k in range(start, chunk, BLOCK):
        w = tl.load(w_ptr + base + k + offs).to(tl.float32)
        acc += w * y
    tl.store(out_ptr + pid, tl.sum(acc))


def run(variant: str, copies: int = 6) -> tuple[float, float]:
    pdl = variant != "plain"
    early = variant == "pdl-early"
    x = torch.randn(ROWS, D, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ws = [torch.randn(W_ELEMS, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    out = torch.empty(N_PROGRAMS, device="cuda", dtype=torch.float32)
    chunk = W_ELEMS // N_PROGRAMS

    def pair(w, with_a=True):
        if with_a:
            norm_like[(ROWS,)](x, y, D, TRIGGER=pdl, num_warps=8)
        stream_weight[(N_PROGRAMS,)](w, y, out, chunk, BLOCK, WAIT=pdl, EARLY=early, num_warps=8,
                                     launch_pdl=pdl)

    results = []
    for with_a in (True, False):
        for i in range(32):
            pair(ws[i % copies], with_a)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(32):
                pair(ws[i % copies], with_a)
        results.append(graph_replay_ms(g, 200) * 1000 / 32)
    # correctness: the last B's output against torch
    ref = (ws[31 % copies].view(N_PROGRAMS, chunk // BLOCK, BLOCK).float() * y[0].float()).sum((1, 2))
    pair(ws[31 % copies], True)
    torch.cuda.synchronize()
    err = (out - ref).abs().max().item() / ref.abs().max().item()
    print(f"{variant:<10} pair {results[0]:6.2f} us | B alone {results[1]:6.2f} us | rel err {err:.1e}", flush=True)
    return results[0], results[1]


if __name__ == "__main__":
    print(torch.cuda.get_device_name(0), torch.__version__, triton.__version__)
    for rep in range(2):
        for v in ("plain", "pdl", "pdl-early"):
            run(v)
