"""Plot the fused QKV benchmark CSV (benchmarks/bench_kernels.py --ops fused): each Hopper path and `auto`
as a multiple of cuBLAS on the same GEMM, per model and token count, with the issue's 1.15 target line.

Usage: python3 benchmarks/plot_kernels.py benchmarks/results/kernels-fused-h200.csv assets/bench-fused-qkv-h200.png
"""
from __future__ import annotations

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

VARIANTS = {"fused[graph]": "auto", "fused:pointer[graph]": "pointer", "fused:tma[graph]": "tma",
            "fused:streamk[graph]": "streamk"}


def main(csv_path: str, png_path: str) -> None:
    rows = [r for r in csv.DictReader(open(csv_path)) if r["op"] == "fused_qkv_rope_cache" and r["variant"] in VARIANTS]
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), sharey=True)
    for ax, model in zip(axes, models):
        shapes = sorted({r["shape"] for r in rows if r["model"] == model}, key=lambda s: int(s.split()[0][2:]))
        width = 0.8 / len(VARIANTS)
        for i, (variant, label) in enumerate(VARIANTS.items()):
            ratios = [next(float(r["vs_cublas"]) for r in rows if r["model"] == model and r["shape"] == shape
                           and r["variant"] == variant) for shape in shapes]
            ax.bar([x + (i - 1.5) * width for x in range(len(shapes))], ratios, width, label=label)
        ax.axhline(1.15, color="k", ls="--", lw=1, label="target: 1.15x cuBLAS")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(shapes)), [s.split()[0].replace("N=", "") + " tokens" for s in shapes])
        ax.set_title(f"{model} QKV + RoPE + cache write")
        ax.set_ylim(0.9, 2.0)
        ax.set_ylabel("time / cuBLAS GEMM (CUDA graph)")
        ax.legend(fontsize=7)
    fig.suptitle("H200, bf16, random weights at full layer geometry, 2026-12-03", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
