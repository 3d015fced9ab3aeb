"""What the app and CLI test modules share: a free local port, running the CLI in-process, an engine whose
runs wait until the test lets them start, and the page served on that engine to a headless chromium (the
page's browser tests)."""
import contextlib
import shutil
import socket
import threading
import time
from typing import NamedTuple

import torch

from flash_dllm.app.cli import main

BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
STATUS = "() => (document.querySelector('#status') || {}).textContent || ''"  # the page's status line


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(argv, capsys):
    """Run the command line in this process: (exit code, stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


class HeldEngine:
    """The real engine, except that a run waits (before its first step) until Stop or `release`: the test
    decides when the first token may commit."""

    def __init__(self, engine):
        self.engine, self.release = engine, threading.Event()

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompts, settings, on_event=None, cancel=None):
        while not self.release.is_set() and not (cancel is not None and cancel.is_set()):
            time.sleep(0.02)
        return self.engine.generate(prompts, settings, on_event=on_event, cancel=cancel)

    def submit(self, prompt, settings, on_event=None):
        return HeldRequest(self.engine, prompt, settings, on_event, self.release)


class HeldRequest:
    """A submitted request that reaches the real engine only after `release` (or, cancelled first, at once
    and cancelled there)."""

    def __init__(self, engine, prompt, settings, on_event, release):
        self.id, self.cancel_event, self.real, self.held_result = id(self), threading.Event(), None, None
        self.submitted = threading.Event()

        def wait_then_submit():
            while not release.is_set() and not self.cancel_event.is_set():
                time.sleep(0.02)
            self.real = engine.submit(prompt, settings, on_event=on_event)
            if self.cancel_event.is_set():  # stopped while held: as a request cancelled before admission
                self.real.cancel()
                self.held_result = engine._cancelled_result(self.real)
            self.submitted.set()

        threading.Thread(target=wait_then_submit, daemon=True).start()

    def cancel(self):
        self.cancel_event.set()
        if self.real is not None:
            self.real.cancel()

    def result(self, timeout=None):
        self.submitted.wait()
        self.real.result(timeout)
        return self.held_result or self.real.result(timeout)


class BrowserSite(NamedTuple):
    ctx: object  # the app's AppContext
    url: str
    browser: object  # playwright's Browser
    engine: HeldEngine
    errors: list  # page errors seen by any tab: the site checks there were none when it closes


@contextlib.contextmanager
def held_browser_site(tmp_path_factory, prepare=None):
    """The app on a tiny LLaDA model behind a HeldEngine (CPU, one torch thread), and chromium. ``prepare(ctx)``
    runs before the app is served. Asserts at the end that no tab saw a page error."""
    import pytest

    sync_api = pytest.importorskip("playwright.sync_api")
    from flash_dllm.app.chats import ChatStore
    from flash_dllm.app.launch import serve
    from flash_dllm.app.models import LoadOptions, ModelHost
    from flash_dllm.app.turns import AppContext
    from flash_dllm.engine import Engine
    from flash_dllm.engine.tiny import TinySpec, write_tiny_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny", TinySpec("llada"))
    engine = HeldEngine(Engine.load(str(folder), device="cpu"))
    ctx = AppContext(ModelHost(engine, LoadOptions(device="cpu"), name=str(folder)),
                     ChatStore(tmp_path_factory.mktemp("chats")))
    if prepare is not None:
        prepare(ctx, folder)
    demo = serve(ctx, port=free_port())
    playwright = sync_api.sync_playwright().start()
    browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True,
                                         args=BROWSER_ARGS)
    errors: list[str] = []
    try:
        yield BrowserSite(ctx, demo.local_url, browser, engine, errors)
    finally:
        browser.close()
        playwright.stop()
        demo.close()
        torch.set_num_threads(threads)
    assert errors == []


def open_llada_page(site: BrowserSite, before_method=None):
    """A new tab on the site, with llada at a 64-token answer in 32-token blocks; ``before_method(tab)`` runs
    once the page has loaded."""
    tab = site.browser.new_page(viewport={"width": 1500, "height": 1000})
    tab.on("pageerror", lambda err: site.errors.append(str(err)))
    tab.goto(site.url, wait_until="domcontentloaded")
    tab.get_by_role("textbox", name="Message").wait_for(timeout=30_000)
    if before_method is not None:
        before_method(tab)
    tab.get_by_label("llada").check()
    tab.get_by_text("Raw knobs").click()
    for label, number in (("gen length", 64), ("block length", 32)):
        box = tab.get_by_label(f"number input for {label}")
        box.fill(str(number))
        box.press("Enter")
    return tab
