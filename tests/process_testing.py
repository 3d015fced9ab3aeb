"""Helpers for tests that run the app (or a piece of it) as a child process and signal it."""
import signal


def interruptible():
    """Popen preexec_fn: a child of a shell's background job inherits SIGINT *ignored* (POSIX, without job
    control), and Python then never turns Ctrl-C into KeyboardInterrupt. A test that sends SIGINT gives the
    child the default back, so it passes however the test run itself was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
