"""Files of `flash-dllm-chat bench decode`: decode.csv, decode.json and decode.png in the --out folder."""
from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

COLUMNS = ["method", "batch", "ms_per_iter_min", "ms_per_iter_median", "ms_per_iter_max", "spread", "tokens_per_s",
           "tokens_per_forward", "forwards_per_iter", "peak_gb", "floor_ms", "x_floor", "weight_floor_ms",
           "compute_floor_ms", "copy_gbs", "matmul_tflops", "capture_s", "first_step_ms", "processes",
           "iterations_per_process", "model", "prompt_length", "gen_length", "kernels", "graphs", "error"]


def write_outputs(folder: Path, rows: list[dict], env: dict, settings: dict) -> None:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with open(folder / "decode.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS + ["device", "torch", "triton", "date"],
                                extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "device": env.get("device_name"), "torch": env.get("torch"),
                             "triton": env.get("triton"), "date": stamp})
    settings = {k: v for k, v in settings.items() if k not in ("worker", "rotation")}
    doc = {"date": stamp, "environment": env, "settings": settings, "rows": rows}
    (folder / "decode.json").write_text(json.dumps(doc, indent=2))
    plot(folder / "decode.png", rows, env)


def plot(path: Path, rows: list[dict], env: dict) -> None:
    """Median ms per iteration per method, one panel per batch size, min-max as error bars, the floor as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.8), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        cells = [r for r in rows if r["batch"] == batch and "ms_per_iter_median" in r]
        names = [r["method"] for r in cells]
        medians = [r["ms_per_iter_median"] for r in cells]
        low = [r["ms_per_iter_median"] - r["ms_per_iter_min"] for r in cells]
        high = [r["ms_per_iter_max"] - r["ms_per_iter_median"] for r in cells]
        ax.bar(names, medians, yerr=[low, high], capsize=4, color="#4c72b0")
        floors = {r["floor_ms"] for r in cells if r.get("floor_ms")}
        for i, r in enumerate(cells):
            if r.get("floor_ms"):
                ax.hlines(r["floor_ms"], i - 0.4, i + 0.4, colors="#c44e52", linestyles="--",
                          label="floor" if i == 0 else None)
                ax.annotate(f"{r['x_floor']:.2f}x", (i, r["ms_per_iter_median"]), ha="center", va="bottom",
                            fontsize=8)
        ax.set_title(f"batch {batch}")
        ax.set_ylabel("ms per iteration (median of processes)")
        ax.tick_params(axis="x", labelrotation=20)
        if floors:
            ax.legend(loc="upper left", fontsize=8)
    model = rows[0].get("model", "") if rows else ""
    fig.suptitle(f"{model} on {env.get('device_name', env.get('device'))} (torch {env.get('torch')}, "
                 f"triton {env.get('triton')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
