"""What the app and CLI test modules share: a free local port, running the CLI in-process, and an engine whose
runs wait until the test lets them start (the page's browser tests)."""
import socket
import threading
import time

from flash_dllm.app.cli import main


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
