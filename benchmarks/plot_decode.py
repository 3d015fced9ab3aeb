"""The README's decode plot: `flash-dllm-chat bench decode` results (JSON files) beside the same day's
measurements of the eager loop, with each cell's floor.

    python3 benchmarks/plot_decode.py OUT.png RESULT.json [RESULT.json ...]
"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# The eager loop (benchmarks/README.md, "Experiment (2026-12-04)"): medians of 5-21 processes, same H200.
EAGER = {("llada-8b", 1): {"flash-cache": 16.04, "flash-verify": 47.14, "fast-dllm": 23.66},
         ("dream-7b", 1): {"flash-cache": 18.0, "flash-verify": 35.3, "fast-dllm": 16.8},
         ("llada-8b", 8): {"flash-cache": 35.6, "flash-verify": 46.9, "fast-dllm": 16.1},
         ("llada-8b", 32): {"flash-cache": 124.3, "flash-verify": 152.1, "fast-dllm": 34.5}}


def main(out: str, paths: list[str]) -> None:
    results = [json.load(open(path)) for path in paths]
    rows = [row for result in results for row in result["rows"] if "ms_per_iter_median" in row]
    panels = sorted({(r["model"], r["batch"]) for r in rows}, key=lambda p: (p[1], p[0]))
    gpu = results[0]["environment"].get("device_name", "GPU")
    eager = EAGER if "H200" in gpu else {}  # the eager loop was measured on an H200 only
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.8), squeeze=False)
    for ax, (model, batch) in zip(axes[0], panels):
        cells = [r for r in rows if (r["model"], r["batch"]) == (model, batch)]
        xs = range(len(cells))
        before = [eager.get((model, batch), {}).get(r["method"], 0) for r in cells]
        if any(before):
            ax.bar([x - 0.2 for x in xs], before, 0.4, color="#bbbbbb", label="eager loop (2026-12-04)")
        ax.bar([x + 0.2 for x in xs], [r["ms_per_iter_median"] for r in cells], 0.4, color="#4c72b0",
               yerr=[[r["ms_per_iter_median"] - r["ms_per_iter_min"] for r in cells],
                     [r["ms_per_iter_max"] - r["ms_per_iter_median"] for r in cells]], capsize=3,
               label="device step + CUDA graph")
        for x, r in zip(xs, cells):
            ax.hlines(r["floor_ms"], x - 0.45, x + 0.45, colors="#c44e52", linestyles="--",
                      label="floor" if x == 0 else None)
            ax.annotate(f"{r['x_floor']:.2f}x", (x + 0.2, r["ms_per_iter_median"]), ha="center", va="bottom",
                        fontsize=7)
        ax.set_xticks(list(xs), [r["method"] for r in cells], rotation=20, fontsize=8)
        ax.set_title(f"{model}, batch {batch}", fontsize=9)
        ax.set_ylabel("ms per iteration")
    axes[0][0].legend(fontsize=7, loc="upper left")
    days = ", ".join(sorted({result["date"][:10] for result in results}))
    fig.suptitle(f"{gpu}, random weights, prompt 800, answer 512 ({days})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
