"""Ending the app after Ctrl-C within a bounded time, however the shutdown goes.

After Ctrl-C, Python joins every non-daemon thread before it exits, and Gradio runs the page's handlers on
AnyIO worker threads, which are not daemons: a handler still streaming a long CPU generation, or one stuck
on a connection, would keep the app alive after Ctrl-C for as long as it runs. A hang after the threads are
joined (in a destructor during finalisation, when daemon threads are frozen) could not even be cut short
by a watchdog thread. So:
- a daemon thread learns of the signal through ``signal.set_wakeup_fd`` (written by the C-level handler,
  whatever the main thread is doing) and starts a deadline;
- the served run ends with ``exit_process``, which runs the atexit hooks under that deadline and then leaves
  with ``os._exit``, never entering finalisation. Nothing is lost: chats are saved after every turn;
- ``SIGUSR1`` dumps every thread's stack (``kill -USR1 PID``), for a shutdown that hangs somewhere new.

A process whose SIGINT is *ignored* never sees Ctrl-C at all; a shell's background job without job control
starts its children so (that, not a hang, is what a login test that outlived Ctrl-C had met).
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import threading
from typing import NoReturn

_deadline_lock = threading.Lock()
_deadline_armed = False


def arm_deadline(seconds: float) -> None:
    """End the process ``seconds`` from now unless it has ended by itself (the first call wins)."""
    global _deadline_armed
    with _deadline_lock:
        if _deadline_armed:
            return
        _deadline_armed = True

    def force_exit():
        print(f"flash-dllm-chat: shutdown took more than {seconds:.0f} s; exiting now", flush=True)
        os._exit(0)
    timer = threading.Timer(seconds, force_exit)
    timer.daemon = True
    timer.start()


def watch_interrupts(seconds: float) -> bool:
    """From the first Ctrl-C (SIGINT) on, the process has ``seconds`` to end. Main thread only; False where
    the platform cannot (no wakeup fd), in which case the served run's own deadline still applies."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except (AttributeError, OSError, ValueError):
        return False
    if previous != -1:  # someone else (an asyncio loop in this thread) reads the wakeup fd: leave it theirs
        signal.set_wakeup_fd(previous)
        return False

    def wait_for_signal():
        while True:
            try:
                received = os.read(read_end, 1)
            except InterruptedError:
                continue
            except OSError:
                return
            if not received:
                return
            if signal.SIGINT in received:  # the fd carries every handled signal's number, not only Ctrl-C's
                arm_deadline(seconds)
                return
    threading.Thread(target=wait_for_signal, name="interrupt-deadline", daemon=True).start()
    return True


def exit_process(code: int, seconds: float) -> NoReturn:
    """Run the atexit hooks (bounded by the deadline), flush, and leave without interpreter finalisation."""
    arm_deadline(seconds)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
