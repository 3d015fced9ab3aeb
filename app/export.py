"""Exports of a recorded denoising: an animated GIF, and a self-contained HTML player.

Both replay the engine's recorded StepEvents through the same `Canvas` fold the live page uses. The HTML
stores each distinct cell fragment once and, per step, only the cells whose fragment changed, so a 512-step
run stays small; the player (assets/canvas.js) and the styles (assets/canvas.css) are inlined.
"""
from __future__ import annotations

import colorsys
import html
import json
from importlib import resources
from pathlib import Path

from flash_dllm.app.canvas import COMMITTED, LEGEND, MASKED, PADDING, Canvas, display_piece


def asset_text(name: str) -> str:
    return resources.files("flash_dllm.assets").joinpath(name).read_text(encoding="utf-8")


def _fresh(recording: Canvas) -> Canvas:
    return Canvas(recording.gen_length, recording.block_length, recording.prompt_tail, recording.method,
                  record=False, label=recording.label, end_tokens=recording.end_tokens)


def html_frames(recording: Canvas) -> dict:
    """Fragment table plus per-step deltas: frame k = initial cells with deltas[0..k-1] applied."""
    canvas = _fresh(recording)
    table: dict[str, int] = {}

    def intern(fragment: str) -> int:
        return table.setdefault(fragment, len(table))

    current = [intern(f) for f in canvas.cell_fragments()]
    initial = list(current)
    deltas, heads, steps = [], [canvas.header()], [max(canvas.steps, 1)]
    for number, event in enumerate(recording.events, start=1):
        canvas.apply(event)
        if number == len(recording.events):
            canvas.finish(recording.finish_reason)
        delta = []
        for cell, fragment in enumerate(canvas.cell_fragments()):
            index = intern(fragment)
            if index != current[cell]:
                current[cell] = index
                delta.append([cell, index])
        deltas.append(delta)
        heads.append(canvas.header())
        steps.append(max(canvas.steps, 1))
    fragments = [None] * len(table)
    for fragment, index in table.items():
        fragments[index] = fragment
    return {"fragments": fragments, "initial": initial, "deltas": deltas, "heads": heads, "n": steps,
            "prompt": canvas.prompt_html()}


def export_html(recording: Canvas, path: str | Path, title: str = "flash-dllm-chat denoising") -> Path:
    data = json.dumps(html_frames(recording), ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:16px;max-width:1100px}}
.fd-player{{display:flex;gap:8px;align-items:center;margin:8px 0}}
.fd-player input[type=range]{{flex:1}}
{asset_text("canvas.css")}</style></head>
<body><h3>{html.escape(title)}</h3>
<div class="fd-player"><button id="fd-play">▶ play</button>
<input id="fd-step" type="range" min="0" max="{len(recording.events)}" value="{len(recording.events)}">
<span id="fd-label"></span></div>
<div class="fd-canvas" id="fd-canvas"><div class="fd-head" id="fd-head"></div>
<div class="fd-cells" id="fd-cells"></div>{LEGEND}</div>
<script type="application/json" id="fd-data">{data}</script>
<script>{asset_text("canvas.js")}</script>
</body></html>
"""
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


# ---------------------------------------------------------------------- GIF
CELL_W, CELL_H, GAP, COLUMNS, HEADER_H = 30, 18, 2, 32, 22


def cell_colour(canvas: Canvas, cell: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(background, text) colour of a cell: the CSS of assets/canvas.css in RGB."""
    state = canvas.state[cell]
    if state == MASKED:
        return ((254, 226, 226), (185, 28, 28)) if cell in canvas.rejected else ((217, 221, 228), (31, 35, 40))
    if state == PADDING:
        return (236, 237, 240), (156, 163, 175)
    if canvas.padding_from is not None and cell == canvas.padding_from - 1:
        return (55, 65, 81), (249, 250, 251)
    n = max(canvas.steps, 1)
    hue = (215 - 185 * canvas.commit_step[cell] / n) / 360.0
    light = 0.93 - 0.28 * canvas.confidence[cell]
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.8)
    return (int(r * 255), int(g * 255), int(b * 255)), (17, 24, 39)


def draw_frame(canvas: Canvas, font):
    from PIL import Image, ImageDraw

    rows = (canvas.gen_length + COLUMNS - 1) // COLUMNS
    width = COLUMNS * (CELL_W + GAP) + GAP
    height = HEADER_H + rows * (CELL_H + GAP) + GAP
    image = Image.new("RGB", (width, height), (251, 251, 252))
    draw = ImageDraw.Draw(image)
    head = (f"{canvas.method}  step {canvas.steps}  {canvas.committed_cells}/{canvas.gen_length} committed  "
            f"{canvas.padding_cells} padding")
    draw.text((GAP + 2, 4), head, fill=(55, 65, 81), font=font)
    for cell in range(canvas.gen_length):
        x = GAP + (cell % COLUMNS) * (CELL_W + GAP)
        y = HEADER_H + (cell // COLUMNS) * (CELL_H + GAP)
        background, ink = cell_colour(canvas, cell)
        outline = None
        if cell in canvas.accepted:
            outline = (22, 163, 74)
        elif cell in canvas.fresh:
            outline = (17, 24, 39)
        elif cell in canvas.window:
            outline = (124, 58, 237)
        draw.rectangle([x, y, x + CELL_W - 1, y + CELL_H - 1], fill=background, outline=outline)
        text = ""
        if canvas.state[cell] == COMMITTED:
            text = display_piece(canvas.pieces[cell])
        elif cell in canvas.rejected:
            text = display_piece(canvas.rejected[cell])
        if text:
            draw.text((x + 2, y + 3), text[:4], fill=ink, font=font)
    return image


def export_gif(recording: Canvas, path: str | Path, max_frames: int = 120, frame_ms: int = 70) -> Path:
    """Animated GIF of the denoising (at most ``max_frames`` frames, evenly spaced, last frame held)."""
    from PIL import ImageFont

    try:
        font = ImageFont.load_default(size=11)
    except TypeError:  # Pillow without FreeType
        font = ImageFont.load_default()
    total = len(recording.events)
    wanted = sorted({round(i * total / max(1, max_frames - 1)) for i in range(max_frames)} | {0, total})
    canvas, applied, frames = _fresh(recording), 0, []
    for step in wanted:
        while applied < step:
            canvas.apply(recording.events[applied])
            applied += 1
        frames.append(draw_frame(canvas, font).convert("P", palette=1, colors=255))
    durations = [frame_ms] * len(frames)
    durations[-1] = 2500
    path = Path(path)
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=durations, loop=0, optimize=False)
    return path
