"""The canvas fold, its rendering and replay, the frame coalescing of live runs, and the exports."""
from __future__ import annotations

import json
import re
import threading
import time

import pytest

from flash_dllm.app import export as export_mod
from flash_dllm.app.canvas import Canvas, display_piece
from flash_dllm.app.export import export_gif, export_html, html_frames
from flash_dllm.app.live import FIRST_STEP_NOTE_S, LiveRun, RunView
from flash_dllm.engine import (CanvasStart, Engine, Failed, Finished, GenerationSettings, SequenceDone, SettingsError,
                               StepEvent)
from flash_dllm.engine.tiny import TinySpec, write_tiny_model


def cell_classes(html: str) -> list[set[str]]:
    cells = html.split('<div class="fd-cells">', 1)[1]
    return [set(m.split()) for m in re.findall(r'<i class="(k [^"]*)"', cells.split('<div class="fd-legend">')[0])]


def start(n=16, block=8):
    return CanvasStart(seq=0, gen_length=n, block_length=block, prompt_tail=["Hi", "\n"], method="flash-verify")


def test_display_piece_makes_every_token_visible():
    assert display_piece("\n") == "↵"
    assert display_piece(" ") == "␣"
    assert display_piece("") == "∅"
    assert display_piece("a\x01b\x7f") == "a␁b␡"
    assert display_piece(" the") == " the"


def test_official_end_rule_answer_ends_at_the_first_end_token():
    """The official end rule decodes every cell (no padding): the live answer stops before the first committed
    end token, that cell is the end, later cells are marked as outside the answer, also when an earlier end
    token commits after a later one."""
    begin = CanvasStart(seq=0, gen_length=8, block_length=8, prompt_tail=["Hi"], method="llada", end_tokens=[2, 9])
    canvas = Canvas.from_start(begin)
    canvas.render()
    canvas.apply(StepEvent(seq=0, step=0, committed=[0, 5, 6], tokens=[5, 9, 2],
                           pieces=["Hi", "<|eot_id|>", "<|endoftext|>"], confidences=[0.9, 0.9, 0.9]))
    assert canvas.answer_preview() == "Hi"
    classes = cell_classes(canvas.render())
    assert "e" in classes[5] and "z" in classes[6] and "z" not in classes[5] and "e" not in classes[0]
    canvas.apply(StepEvent(seq=0, step=1, committed=[1, 2, 3], tokens=[6, 2, 7], pieces=["!", "<|endoftext|>", "x"],
                           confidences=[0.9, 0.9, 0.9], window=[1, 2, 3, 4]))
    html = canvas.render()
    classes = cell_classes(html)
    assert canvas.answer_preview() == "Hi!" and canvas.end_cell == 2
    assert "e" in classes[2] and all("z" in classes[c] and "e" not in classes[c] for c in (3, 5, 6))
    assert "answer ends at #2" in html and "after the end" in html and "block cached" not in html
    assert canvas.padding_cells == 0
    assert ">⏎<" in html and "end &lt;|endoftext|&gt;" in html  # the legend's end mark; the piece in the title
    replay = canvas.at_step(2)  # a replay (and an export) knows the end tokens too
    assert replay.answer_preview() == "Hi!" and "z" in cell_classes(replay.render())[3]
    assert "w" in cell_classes(html)[4]
    canvas.finish("eos")
    assert all("w" not in c for c in cell_classes(canvas.render()))  # no window outline once done


def test_a_finished_canvas_drops_its_last_window():
    canvas = Canvas.from_start(start(n=4, block=4))
    canvas.apply(StepEvent(seq=0, step=0, committed=[0], tokens=[5], pieces=["a"], confidences=[0.9],
                           window=[0, 1, 2, 3]))
    assert sum("w" in c for c in cell_classes(canvas.render())) == 4
    canvas.finish("length")
    assert sum("w" in c for c in cell_classes(canvas.render())) == 0 and canvas.finish_reason == "length"


def test_engine_tells_the_canvas_its_end_tokens(tmp_path):
    """CanvasStart carries the tokenizer's end tokens, so a canvas can find where an answer ends."""
    folder = write_tiny_model(tmp_path / "tiny", TinySpec())
    engine = Engine.load(str(folder), device="cpu")
    events = []
    engine.generate(["hi"], GenerationSettings(method="llada", gen_length=8, block_length=8), on_event=events.append)
    begin = next(e for e in events if isinstance(e, CanvasStart))
    assert set(begin.end_tokens) == set(engine.tokenizer.end_ids) and begin.end_tokens


def test_fold_marks_masked_committed_window_drafts_and_padding():
    canvas = Canvas.from_start(start())
    html = canvas.render()
    assert [c for c in cell_classes(html)] == [{"k", "m"} | ({"b"} if i == 8 else set()) for i in range(16)]
    canvas.apply(StepEvent(seq=0, step=0, committed=[0, 1], tokens=[5, 6], pieces=["He", "llo"],
                           confidences=[0.95, 0.5], window=[0, 1, 2, 3], drafted=[2, 3], draft_pieces=["!", "?"],
                           draft_tokens=[7, 8], accepted=[], rejected=[2, 3]))
    classes = cell_classes(canvas.render())
    assert {"c", "f", "w"} <= classes[0] and {"c", "f"} <= classes[1]
    assert {"m", "r", "w"} <= classes[2] and "line-through" not in canvas.render()  # styling lives in CSS
    assert classes[4] == {"k", "m"}
    assert 'style="--t:0;--c:0.95"' in canvas.render() and ">He<" in canvas.render()
    # next step: an accepted draft, the end token at cell 3, padding after it
    canvas.apply(StepEvent(seq=0, step=1, committed=[2, 3], tokens=[7, 2], pieces=["!", "<|eot|>"],
                           confidences=[0.9, 0.99], window=[2, 3, 4], drafted=[3], draft_pieces=["<|eot|>"],
                           accepted=[3], rejected=[], padding_from=4))
    classes = cell_classes(canvas.render())
    assert "f" not in classes[0] and "w" not in classes[0]  # last step's transient marks are gone
    assert {"c", "a", "e"} <= classes[3]
    assert all("p" in classes[i] for i in range(4, 16))
    assert (canvas.committed_cells, canvas.masked_cells, canvas.padding_cells) == (4, 0, 12)
    assert canvas.answer_preview() == "Hello!"
    html = canvas.render()
    assert 'data-step="2"' in html and 'style="--n:2"' in html and "…Hi↵" in html


def test_render_touches_only_changed_cells(monkeypatch):
    canvas = Canvas.from_start(start(n=512, block=32))
    canvas.render()
    rendered = []
    original = Canvas.cell_fragment
    monkeypatch.setattr(Canvas, "cell_fragment", lambda self, cell: rendered.append(cell) or original(self, cell))
    canvas.apply(StepEvent(seq=0, step=0, committed=[10, 11], pieces=["a", "b"], confidences=[0.9, 0.8],
                           window=list(range(8, 16))))
    canvas.render()
    assert sorted(rendered) == list(range(8, 16))
    rendered.clear()
    canvas.apply(StepEvent(seq=0, step=1, committed=[12], pieces=["c"], confidences=[0.7], window=list(range(9, 17))))
    canvas.render()
    assert sorted(rendered) == list(range(8, 17))  # old window + new window, nothing else


def synthetic_events(n: int, per_step: int = 1):
    events, cell, step = [], 0, 0
    while cell < n:
        cells = list(range(cell, min(n, cell + per_step)))
        window = list(range(cell, min(n, cell + 32)))
        events.append(StepEvent(seq=0, step=step, committed=cells, tokens=cells, pieces=[f"t{c}" for c in cells],
                                confidences=[0.5] * len(cells), window=window, forward_passes=step + 1,
                                generated_tokens=cell + len(cells), elapsed_s=0.001 * (step + 1), step_ms=1.0))
        cell += per_step
        step += 1
    return events


def test_fold_and_render_keep_up_with_hundreds_of_steps_per_second():
    events = synthetic_events(1024)
    canvas = Canvas.from_start(start(n=1024, block=32))
    began = time.perf_counter()
    for index, event in enumerate(events):
        canvas.apply(event)
        if index % 10 == 0:  # a frame every 10 steps: 100+ frames of a 1024-cell canvas
            canvas.render()
    spent = time.perf_counter() - began
    assert canvas.masked_cells == 0
    assert spent < 1.0, f"1024 steps + {len(events) // 10} frames took {spent:.2f} s"


def test_replay_at_any_step_equals_the_live_canvas_then():
    events = synthetic_events(64, per_step=3)
    live = Canvas.from_start(start(n=64, block=16))
    snapshots = {}
    for event in events:
        live.apply(event)
        snapshots[live.steps] = live.render()
    for step in (1, 5, len(events)):
        assert live.at_step(step).render() == snapshots[step]
    assert live.at_step(0).masked_cells == 64
    assert live.at_step(10_000).steps == len(events)


class FakeEngine:
    """The engine's generate contract (events through on_event, cancel checked between steps, results returned),
    with controlled timing; ``threads`` records where it ran."""

    def __init__(self, events, delay_s=0.0, error: Exception | None = None):
        self.events, self.delay_s, self.error = events, delay_s, error
        self.closed, self.threads = threading.Event(), []

    def generate(self, prompts, settings, on_event=None, cancel=None):
        self.threads.append(threading.current_thread())
        try:
            for event in self.events:
                if cancel is not None and cancel.is_set():
                    break
                if self.delay_s:
                    time.sleep(self.delay_s)
                on_event(event)
            if self.error is not None:
                raise self.error
            return []
        finally:
            self.closed.set()

    def submit(self, prompt, settings, on_event=None):
        """The submit contract: a request whose result() runs the scripted decode (on the waiting thread)."""
        engine, cancel = self, threading.Event()

        class FakeRequest:
            id = 1

            def cancel(self):
                cancel.set()

            def result(self, timeout=None):
                return engine.generate([prompt], settings, on_event=on_event, cancel=cancel)

        return FakeRequest()


def test_fast_steps_are_coalesced_into_few_frames_without_losing_any():
    events = synthetic_events(2000)
    run = LiveRun(FakeEngine(events), ["x"], None, frame_s=0.05).start()
    frames = list(run.frames())
    got = [e for batch in frames for e in batch if isinstance(e, StepEvent)]
    assert got == events  # every step, in order
    assert isinstance(frames[-1][-1], Finished)
    assert len(frames) < 100, f"{len(frames)} frames for 2000 instant steps"


def test_one_decode_thread_and_a_failure_still_ends_the_frames():
    engine = FakeEngine(synthetic_events(3), error=SettingsError("gen length must be at least 1 (got 0)"))
    run = LiveRun(engine, ["x"], None, frame_s=0.01).start()
    frames = list(run.frames())
    assert engine.threads == [run._thread] and run._thread is not threading.current_thread()
    assert isinstance(frames[-1][-1], Failed) and "gen length" in frames[-1][-1].message
    assert sum(isinstance(e, StepEvent) for batch in frames for e in batch) == 3
    crash = LiveRun(FakeEngine([], error=KeyError("boom")), ["x"], None).start()
    last = list(crash.frames())[-1][-1]
    assert isinstance(last, Failed) and last.message == "KeyError: 'boom'"


def test_slow_steps_are_shown_one_frame_each_and_stop_is_between_steps():
    events = synthetic_events(6)
    run = LiveRun(FakeEngine(events, delay_s=0.08), ["x"], None, frame_s=0.02).start()
    steps_per_frame = [sum(isinstance(e, StepEvent) for e in batch) for batch in run.frames()]
    assert steps_per_frame == [1] * 6  # each slow step is on screen as soon as it happened
    engine = FakeEngine(synthetic_events(200), delay_s=0.01)
    run = LiveRun(engine, ["x"], None, frame_s=0.02).start()
    seen = 0
    for batch in run.frames():
        seen += sum(isinstance(e, StepEvent) for e in batch)
        if seen >= 3:
            run.stop()
    run.close()
    assert 3 <= seen < 200 and engine.closed.is_set()


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny") / "llada", TinySpec("llada"))
    return Engine.load(str(folder), device="cpu")


def test_a_gpu_run_without_a_step_says_why_it_waits():
    """The first steps after the app starts compile and tune the GPU kernels: after a few seconds without a step
    the status says so, only on a GPU, and never once a step (or the end) has come."""
    gpu, cpu = RunView("A", {}, "cuda:0"), RunView("A", {}, "cpu")
    later = gpu.started + FIRST_STEP_NOTE_S + 1
    assert gpu.waiting_note(gpu.started + 1) == "" and cpu.waiting_note(later) == ""
    assert "compile and tune" in gpu.waiting_note(later)
    gpu.stats.steps = 1
    assert gpu.waiting_note(later) == ""
    failed = RunView("A", {}, "cuda:0")
    failed.fold([Failed("out of memory")])
    assert failed.waiting_note(failed.started + FIRST_STEP_NOTE_S + 1) == ""


def test_canvas_folded_from_the_engine_matches_its_answer(tiny_engine):
    settings = GenerationSettings(method="flash-verify", gen_length=48, block_length=16)
    view = RunView("A", tiny_engine.describe(), tiny_engine.device)
    run = LiveRun(tiny_engine, "Tell me something", settings).start()
    for batch in run.frames():
        view.fold(batch)
    result = view.result
    canvas = view.canvas
    assert result is not None and view.error is None
    assert canvas.masked_cells == 0 and canvas.steps == result.steps
    end = canvas.padding_from - 1 if canvas.padding_from is not None else canvas.gen_length
    assert [canvas.pieces[c] for c in range(end)] == [tiny_engine.tokenizer.piece(t) for t in result.token_ids]
    assert view.stats.generated_tokens == len(result.token_ids)
    assert "tokens/s" in view.stats_html() and "fd-canvas" in view.canvas_html()


def replay_html_frame(data: dict, step: int) -> list[str]:
    current = list(data["initial"])
    for delta in data["deltas"][:step]:
        for cell, index in delta:
            current[cell] = index
    return [data["fragments"][i] for i in current]


def test_html_export_replays_every_step_and_is_self_contained(tmp_path):
    events = synthetic_events(40, per_step=2)
    live = Canvas.from_start(start(n=40, block=8))
    live.apply_all(events)
    live.finish_reason = "length"
    data = html_frames(live)
    assert len(data["deltas"]) == len(events)
    for step in (0, 7, len(events)):
        assert replay_html_frame(data, step) == live.at_step(step).cell_fragments()
    path = export_html(live, tmp_path / "run.html")
    page = path.read_text(encoding="utf-8")
    assert "<script src" not in page and "<link" not in page  # nothing fetched from elsewhere
    assert ".fd-canvas" in page and "fd-data" in page and "function show(step)" in page
    embedded = re.search(r'<script type="application/json" id="fd-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(embedded.replace("<\\/", "</"))["n"][-1] == len(events)


def test_gif_export_animates_the_denoising(tmp_path):
    from PIL import Image

    events = synthetic_events(64, per_step=2)
    live = Canvas.from_start(start(n=64, block=16))
    live.apply_all(events)
    path = export_gif(live, tmp_path / "run.gif", max_frames=12)
    with Image.open(path) as image:
        assert image.format == "GIF" and image.n_frames == 12
        image.seek(0)
        y = export_mod.HEADER_H + export_mod.CELL_H // 2
        first = image.convert("RGB").getpixel((4, y))
        image.seek(image.n_frames - 1)
        last = image.convert("RGB").getpixel((4, y))
    assert first == (217, 221, 228)  # masked grey
    assert first != last  # the first cell went from masked to committed


def test_sequence_done_sets_the_finish_reason():
    canvas_view = RunView("A", {}, "cpu")
    canvas_view.fold([start(), *synthetic_events(16)[:3], SequenceDone(0, "t0t1t2", [0, 1, 2], "cancelled")])
    assert canvas_view.canvas.finish_reason == "cancelled" and "stopped" in canvas_view.canvas_html()
