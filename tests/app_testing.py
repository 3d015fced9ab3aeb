"""What the app and CLI test modules share: a free local port, and running the CLI in-process."""
import socket

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
