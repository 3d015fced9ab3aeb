"""A real browser (Debian's chromium through Playwright) loads the page, sends a message and photographs the
canvas mid-generation; the picture is the README's assets/screenshot-canvas.png (refreshed when the run sets
UPDATE_SCREENSHOT=1)."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import flash_dllm.assets
from flash_dllm.app.chats import ChatStore
from flash_dllm.app.launch import serve
from flash_dllm.app.models import LoadOptions, ModelHost
from flash_dllm.app.turns import AppContext
from flash_dllm.engine import Engine, hub
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from app_testing import free_port  # noqa: E402

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path(flash_dllm.assets.__file__).parent / "screenshot-canvas.png"
STATUS = "() => (document.querySelector('#status') || {}).textContent || ''"
STOP_ARMED = "() => document.querySelector('#stop-btn').classList.contains('armed')"


@dataclass
class Scene:
    """What to ask which model so that the picture catches the canvas half decoded."""

    model: str
    method: str
    gen_length: int
    block_length: int
    prompt: str
    min_step: int
    min_masked: int

    def mid_generation(self) -> str:
        return ("() => { const c = document.querySelector('#canvas-a .fd-canvas');"
                f" return (c && +c.dataset.step >= {self.min_step} && +c.dataset.masked >= {self.min_masked})"
                f" || /Done|Stopped|ready for the next/.test(({STATUS})()); }}")



def scenes(tmp_path: Path) -> list[Scene]:
    """The bundled model first (real words: LLaDA's one-token-per-step decode of a long reply), then a random
    tiny model big enough that a 256-cell flash-verify answer takes seconds on a CPU."""
    found = []
    bundled = hub.bundled_model_path()
    if bundled is not None:
        found.append(Scene(str(bundled), "llada", 64, 32, "What can you do?", 16, 16))
    slow = write_tiny_model(tmp_path / "tiny-slow", TinySpec("llada", d_model=256, n_layers=6, mlp_hidden=512))
    found.append(Scene(str(slow), "flash-verify", 256, 32, "Explain how a diffusion model writes.", 40, 64))
    return found


def photograph_mid_generation(page, url: str, scene: Scene, path: Path) -> dict | None:
    """Send the scene's message, screenshot while decoding, then press Stop. Returns the canvas state at the
    moment of the picture, or None when the answer finished before Stop reached it."""
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_label("Message").wait_for(timeout=30_000)
    page.get_by_label(scene.method).check()
    page.get_by_text("Raw knobs").click()
    for label, number in (("gen length", scene.gen_length), ("block length", scene.block_length)):
        box = page.get_by_label(f"number input for {label}")
        box.fill(str(number))
        box.press("Enter")
    page.get_by_text("Raw knobs").click()
    page.evaluate("window.scrollTo(0, 0)")
    assert not page.evaluate(STOP_ARMED), "Stop is shown in the stop colour before anything was sent"
    page.get_by_label("Message").fill(scene.prompt)
    page.keyboard.press("Enter")
    page.wait_for_function(scene.mid_generation(), timeout=60_000)
    state = page.eval_on_selector("#canvas-a .fd-canvas", "c => ({step: +c.dataset.step, masked: +c.dataset.masked})")
    page.screenshot(path=str(path))
    decoding = "Decoding" in page.evaluate(STATUS)  # still decoding after the picture: it shows a live canvas
    if decoding:
        assert page.evaluate(STOP_ARMED), "Stop is not in the stop colour while the answer decodes"
        page.get_by_role("button", name="Stop").click()
    page.wait_for_function(f"() => /Done|Stopped|ready for the next/.test(({STATUS})())", timeout=60_000)
    page.wait_for_function(f"() => !({STOP_ARMED})()", timeout=10_000)  # back to plain once the turn has ended
    # an answer that ended between the check and the click is done, not stopped: the next scene is slower
    return state if decoding and "Stopped" in page.evaluate(STATUS) else None


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium "
                                             "chromium-driver); the real-browser test needs it")
def test_page_streams_the_canvas_in_a_real_browser(tmp_path, monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    monkeypatch.setenv("FLASH_DLLM_HOME", str(tmp_path / "home"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    shot = tmp_path / "shot.png"
    page_errors: list[str] = []
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            try:
                for scene in scenes(tmp_path):
                    engine = Engine.load(scene.model, device="cpu")
                    ctx = AppContext(ModelHost(engine, LoadOptions(device="cpu"), name=scene.model), ChatStore(tmp_path / "home" / "chats"))
                    demo = serve(ctx, port=free_port())
                    try:
                        page = browser.new_page(viewport={"width": 1500, "height": 1000})
                        page.on("pageerror", lambda err: page_errors.append(str(err)))
                        state = photograph_mid_generation(page, demo.local_url, scene, shot)
                        final_text = page.evaluate(STATUS)
                        canvas_text = page.inner_text("#canvas-a")
                        page.close()
                    finally:
                        demo.close()
                    if state is not None:
                        break
            finally:
                browser.close()
    finally:
        torch.set_num_threads(threads)
    assert state is not None, "every answer finished before the screenshot was taken"
    assert state["step"] >= scene.min_step and state["masked"] >= scene.min_masked
    assert "Stopped" in final_text and scene.method in canvas_text and "stopped" in canvas_text
    assert page_errors == []
    assert shot.stat().st_size > 20_000
    if os.environ.get("UPDATE_SCREENSHOT"):  # refresh the README's picture only when asked (keeps checkouts clean)
        shutil.copyfile(shot, SCREENSHOT)
