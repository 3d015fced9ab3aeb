"""The stats panel beside the canvas: a run's numbers and memory as labelled rows, then as an HTML table.

What the numbers mean is defined once in the engine (flash_dllm.engine.metrics); this module only words them.
"""
from __future__ import annotations

import html

from flash_dllm.engine import MemorySnapshot, RunStats


def format_bytes(n: int | None) -> str:
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"  # pragma: no cover - loop always returns


def stats_rows(stats: RunStats | None, memory: MemorySnapshot | None, engine_info: dict | None,
               device_peak: int | None = None, ram_peak: int | None = None) -> list[tuple[str, str]]:
    """The stats panel as (label, value) rows: speed, memory, then the engine's identity."""
    rows: list[tuple[str, str]] = []
    if stats is not None:
        rows += [
            ("tokens/s", f"{stats.tokens_per_s:.1f}"),
            ("tokens/forward", f"{stats.tokens_per_forward:.2f}"),
            ("forward passes", f"{stats.forward_passes}"
             + (f" ({stats.verify_passes} verify)" if stats.verify_passes else "")),
            ("steps", str(stats.steps)),
            ("step time", f"{stats.last_step_ms:.1f} ms (mean {stats.mean_step_ms:.1f} ms)"),
            ("elapsed", f"{stats.elapsed_s:.2f} s"),
            ("answer length", f"{stats.generated_tokens} / {stats.gen_length} tokens"),
        ]
        drafts = stats.accepted_drafts + stats.rejected_drafts
        if drafts:
            share = 100.0 * stats.accepted_drafts / drafts
            rows.append(("drafts accepted", f"{stats.accepted_drafts} / {drafts} ({share:.0f}%)"))
    if memory is not None:
        if memory.device_type == "cuda":
            rows += [
                ("VRAM process", f"{format_bytes(memory.vram_allocated)} (peak {format_bytes(memory.vram_peak)}, "
                                 f"reserved {format_bytes(memory.vram_reserved)})"),
                ("VRAM device", f"{format_bytes(memory.vram_device_used)} of {format_bytes(memory.vram_device_total)}"
                                + (f" (peak {format_bytes(device_peak)})" if device_peak else "")),
            ]
        rows.append(("RAM process", format_bytes(memory.ram_process)
                     + (f" (peak {format_bytes(ram_peak)})" if ram_peak else "")))
        rows.append(("RAM machine", f"{format_bytes(memory.ram_used)} of {format_bytes(memory.ram_total)}"))
    if engine_info:
        rows += [
            ("model", str(engine_info.get("model", "–"))),
            ("device", str(engine_info.get("device", "–"))),
            ("dtype", str(engine_info.get("dtype", "–"))),
            ("kernels", str(engine_info.get("kernels", "–"))),
        ]
    return rows


def stats_table(rows: list[tuple[str, str]], title: str = "") -> str:
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    head = f"<div class=\"fd-head\">{html.escape(title)}</div>" if title else ""
    return f'<div class="fd-stats">{head}<table>{body}</table></div>'
