"""Plot the decoder benchmark CSV (benchmarks/bench_decoders.py) against the official Flash-dLLM anchor."""
from __future__ import annotations

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Official Flash-dLLM on the same H200, LLaDA-8B random weights (../shared/research/peer-flash-dllm-h200.md).
OFFICIAL_MS = {("flash-cache", 1): 18.9, ("flash-verify", 1): 31.8, ("flash-cache", 8): 54.7, ("flash-verify", 8): 78.0}


def main(csv_path: str, png_path: str) -> None:
    rows = [r for r in csv.DictReader(open(csv_path)) if r.get("iter_ms_median") and r["family"] == "llada"]
    methods = ["fast-dllm", "flash-cache", "flash-verify"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, batch in zip(axes, (1, 8)):
        ours = [next(float(r["iter_ms_median"]) for r in rows if r["method"] == m and int(r["batch"]) == batch) for m in methods]
        official = [OFFICIAL_MS.get((m, batch), 0) for m in methods]
        xs = range(len(methods))
        ax.bar([x - 0.2 for x in xs], ours, 0.4, label="flash-dllm-chat")
        ax.bar([x + 0.2 for x in xs], official, 0.4, label="official Flash-dLLM")
        floor = float(rows[0]["floor_ms"])
        ax.axhline(floor, color="k", ls="--", lw=1, label=f"weight-streaming floor {floor:.2f} ms/forward")
        ax.set_xticks(list(xs), methods)
        ax.set_title(f"LLaDA-8B geometry, batch {batch}")
        ax.set_ylabel("ms per iteration (median)")
        ax.legend(fontsize=7)
    fig.suptitle("H200, random weights, prompt 800 + 512 answer, 1 token/iteration (worst case)", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
