"""The app ends after Ctrl-C in bounded time even when the usual shutdown would hang (app/shutdown.py)."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from process_testing import interruptible

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")


def spawn(body: str) -> subprocess.Popen:
    code = "import sys, threading, time\nfrom flash_dllm.app import shutdown\n" + textwrap.dedent(body)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, preexec_fn=interruptible)
    assert process.stdout.readline().strip() == "ready"
    return process


def finish(process: subprocess.Popen, within: float) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        code = process.wait(timeout=within)
    finally:
        if process.poll() is None:
            process.kill()
    return code, process.stdout.read(), time.monotonic() - started


def test_ctrl_c_ends_a_process_whose_main_thread_is_stuck_in_c_code():
    # SIGINT blocked in the main thread and a C sleep: no Python handler can run there; the wakeup fd still
    # tells the deadline thread, which ends the process. The signal may land (on the deadline thread) while the
    # main thread still runs the bytecode between "ready" and the C call, which would then run the Python
    # handler: a KeyboardInterrupt there would end the child before the case is set up, so the handler does
    # nothing (the wakeup fd is written by the C-level handler either way).
    process = spawn("""
        import ctypes, signal
        assert shutdown.watch_interrupts(2.0)
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        print("ready", flush=True)
        ctypes.CDLL(None).sleep(60)
        print("woke up", flush=True)
    """)
    process.send_signal(signal.SIGINT)
    code, output, seconds = finish(process, 30)
    assert code == 0 and "shutdown took more than 2 s" in output and "woke up" not in output
    assert seconds < 20


def test_exit_process_runs_atexit_hooks_and_skips_a_thread_that_never_ends():
    process = spawn("""
        import atexit
        atexit.register(lambda: print("atexit ran", flush=True))
        threading.Thread(target=lambda: time.sleep(600)).start()  # not a daemon: a normal exit would wait
        print("ready", flush=True)
        shutdown.exit_process(3, 10.0)
    """)
    code, output, seconds = finish(process, 30)
    assert code == 3 and "atexit ran" in output and seconds < 8


def test_a_hanging_atexit_hook_is_cut_off_by_the_deadline():
    process = spawn("""
        import atexit
        atexit.register(lambda: time.sleep(600))
        print("ready", flush=True)
        shutdown.exit_process(0, 2.0)
    """)
    code, output, seconds = finish(process, 30)
    assert code == 0 and "shutdown took more than 2 s" in output and seconds < 20


def test_other_handled_signals_do_not_start_the_deadline():
    # the wakeup fd also carries signals other code handles (a terminal resize, a child's exit): only Ctrl-C
    # may start the countdown
    process = spawn("""
        import signal
        signal.signal(signal.SIGUSR2, lambda *_: None)
        assert shutdown.watch_interrupts(1.0)
        print("ready", flush=True)
        time.sleep(3)
        print("survived", flush=True)
    """)
    process.send_signal(signal.SIGUSR2)
    code, output, _ = finish(process, 30)
    assert code == 0 and "survived" in output and "shutdown took" not in output
