"""`flash-dllm-chat` with no subcommand: load the engine, serve the page on 127.0.0.1, open the browser.

A share link (``--share``) is public: anyone who has it can use this machine's GPU, read and delete the
chats, and download models, so it is only made when asked, the console and the page say so, and
``--auth`` protects it. Without network the app still starts and says the link could not be made.

The OpenAI-compatible API (app/api.py) is mounted at /v1 on the same port, behind the same guard. The page's
login does not cover it; ``--api-key`` does, and a shared app always has a key (app/api_keys.py).
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import threading
import traceback
from dataclasses import asdict
from pathlib import Path

from flash_dllm.app import shutdown
from flash_dllm.app.cli import add_load_arguments
from flash_dllm.app.guard import AccessPolicy, GuardMiddleware

SHARE_WARNING = ("Anyone with the public link can use this machine: its GPU, your chats and the model "
                 "downloads. The link lasts up to a week while the app runs.")


def add_launch_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    group = parser.add_argument_group("chat app (no subcommand)")
    add_load_arguments(group)
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    group.add_argument("--port", type=int, default=None, help="port (default: the first free one from 7860)")
    group.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    group.add_argument("--share", action="store_true",
                       help="ask Gradio for a temporary public link (anyone with it can use this machine)")
    group.add_argument("--auth", default=None, metavar="USER:PASSWORD|FILE",
                       help="require a login: user:password, or a file with one user:password per line")
    group.add_argument("--api-key", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on the API at /v1 (default: $FLASH_DLLM_API_KEY; "
                            "a shared app always requires one, generated and printed when not given)")
    return parser


class LaunchError(ValueError):
    """A bad command-line value; the message says what to pass instead."""


def parse_auth(value: str | None) -> list[tuple[str, str]] | None:
    """``--auth`` as (user, password) pairs; None when the flag was not given. An empty value is refused: it
    is what ``--auth "$PASS"`` passes when the variable is unset, and running without a login then would
    publish an open link."""
    if value is None:
        return None
    if not value.strip():
        raise LaunchError("--auth is empty (an unset variable?); give user:password or a file of them")
    path = Path(value).expanduser()
    is_file = path.is_file()
    if is_file:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise LaunchError(f"--auth {path}: not a UTF-8 text file of user:password lines") from None
        except OSError as err:
            raise LaunchError(f"--auth {path}: cannot read it ({err.strerror or err})") from None
    else:
        lines = [value]
    pairs = []
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user.strip() or not password:
            where = f"--auth {path}, line {number}" if is_file else "--auth"
            raise LaunchError(f"{where}: expected user:password")
        pairs.append((user.strip(), password))
    if not pairs:
        raise LaunchError(f"--auth {value}: the file holds no user:password line")
    return pairs


def check_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise LaunchError(f"--port {port}: a port is a number from 1 to 65535")


def check_host(host: str) -> None:
    """The address must be one this machine can listen on (checked before the model loads)."""
    import socket

    if not host.strip():
        raise LaunchError("--host is empty; give an address such as 127.0.0.1 (this machine only)")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as err:
        raise LaunchError(f"--host {host}: not an address or a name this machine resolves ({err})") from None
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((address[0], 0))
            return
        except OSError:
            continue
    raise LaunchError(f"--host {host}: not an address of this machine (use 127.0.0.1, or 0.0.0.0 for every "
                      "network)")


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(ctx, host: str = "127.0.0.1", port: int | None = None, share: bool = False,
          auth: list[tuple[str, str]] | None = None, inbrowser: bool = False, quiet: bool = True,
          policy: AccessPolicy | None = None, api=None):
    """Build the page for ``ctx`` and start serving it, with the API (an `ApiConfig`; default: no key) at /v1
    (returns at once; `demo.close()` stops it). Every request passes `GuardMiddleware` (Host, Origin, login
    rate); the share link's host is allowed once the tunnel is up. A shared app without an API key is refused."""
    from starlette.middleware import Middleware
    from starlette.routing import Mount

    from flash_dllm.app.api import ApiConfig, build_api
    from flash_dllm.app.ui import build_ui, page_css

    api = api or ApiConfig()
    if share and not api.key:
        raise LaunchError("a shared app needs an API key (see api_keys.api_key_for)")
    policy = policy or AccessPolicy.for_address(host)
    demo = build_ui(ctx)
    demo.launch(server_name=host, server_port=port, share=share, auth=auth, inbrowser=inbrowser,
                prevent_thread_lock=True, quiet=quiet, css=page_css(), show_error=True,
                app_kwargs={"middleware": [Middleware(GuardMiddleware, policy=policy)],
                            "routes": [Mount("/v1", app=build_api(ctx.host, api))]},
                auth_message="flash-dllm-chat: this app is password-protected." if auth else None)
    policy.add_host(getattr(demo, "share_url", None))
    demo.access_policy = policy
    return demo


def share_note(share_url: str | None, auth: bool) -> str:
    if share_url is None:
        return ("The public share link could not be made (no network, or the tunnel is blocked); "
                "the app runs on this machine only.")
    login = (" Login required; each login sees only the chats it made." if auth
             else " No login: start with --auth to require one.")
    return f"Shared publicly at {share_url}. {SHARE_WARNING}{login}"


def load_startup_engine(prog: str, args):
    """The model the app or `serve` starts with (--model, else the last one used, else the bundled one):
    (engine, name, options), or None after one line on stderr saying why it could not be loaded."""
    from flash_dllm.app.cli import error_line
    from flash_dllm.app.models import LoadOptions, startup_model
    from flash_dllm.engine import Engine

    name, why = startup_model(args.model)
    if name is None:
        print(f"{prog}: {why}", file=sys.stderr)
        return None
    print(f"Loading {name} ({why})…", flush=True)
    options = LoadOptions(device=args.device, dtype=args.dtype, kernels=args.kernels, graphs=not args.no_graphs)
    try:
        engine = Engine.load(name, **asdict(options))
    except Exception as err:  # HubError, SettingsError, WeightsError, ...: one line, no traceback
        print(f"{prog}: cannot load {name} ({why}): {error_line(err)}", file=sys.stderr)
        return None
    return engine, name, options


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from flash_dllm.app import paths
    from flash_dllm.app.api import ApiConfig
    from flash_dllm.app.api_keys import ApiKeyError, api_key_for
    from flash_dllm.app.chats import ChatStore
    from flash_dllm.app.cli import error_line
    from flash_dllm.app.models import ModelHost
    from flash_dllm.app.turns import AppContext
    from flash_dllm.engine import SettingsError, pick_device

    chats_folder = paths.data_dir(create=False) / "chats"
    try:  # every flag and the chats folder before the model loads: a mistake costs no load, and no download
        auth = parse_auth(getattr(args, "auth", None))
        check_port(args.port)
        check_host(args.host)
        pick_device(args.device)
        paths.check_writable(chats_folder)
        api_key, generated_key = api_key_for(getattr(args, "api_key", None),
                                             shared=args.share or not is_loopback(args.host))
    except (LaunchError, SettingsError, ApiKeyError, OSError) as err:
        print(f"flash-dllm-chat: {error_line(err)}", file=sys.stderr)
        return 2
    loaded = load_startup_engine("flash-dllm-chat", args)
    if loaded is None:
        return 2
    engine, name, options = loaded
    try:
        paths.remember_model(name)
    except OSError as err:  # the app still runs; only the 'last model' memory is lost
        print(f"flash-dllm-chat: could not save the last model used ({err})", file=sys.stderr)
    info = engine.describe()
    print(f"Loaded {info['model']} on {info['device']} ({info['dtype']}, kernels: {info['kernels']}).", flush=True)
    shared = args.share or not is_loopback(args.host)  # others reach it: the model shelf only, no server paths
    ctx = AppContext(ModelHost(engine, options, name, shelf_only=shared), ChatStore(chats_folder))
    if not is_loopback(args.host):
        print(f"Listening on {args.host}: other machines on the network can reach the app"
              + ("." if auth else "; add --auth user:password to require a login."), flush=True)
    if args.share:
        print(f"Asking Gradio for a public share link. {SHARE_WARNING}", flush=True)
    demo = serve(ctx, args.host, args.port, share=args.share, auth=auth, inbrowser=not args.no_browser, quiet=True,
                 api=ApiConfig(key=api_key))
    if args.share:
        ctx.share_note = share_note(getattr(demo, "share_url", None), bool(auth))
        print(ctx.share_note, flush=True)
    print(f"flash-dllm-chat is running at {demo.local_url}" + (" (login required)" if auth else "")
          + "  (Ctrl-C stops it; chats are saved in " + str(chats_folder) + ")", flush=True)
    api_urls = [url.rstrip("/") + "/v1" for url in (demo.local_url, getattr(demo, "share_url", None)) if url]
    print("OpenAI-compatible API at " + " and ".join(api_urls)
          + (f"; API key (generated, since others can reach the app; choose one with --api-key): {api_key}"
             if generated_key else "; API key required" if api_key else ""), flush=True)
    shutdown.watch_interrupts(20.0)  # from Ctrl-C on, the app has 20 s to end, whatever hangs
    code = 0
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        pass
    except Exception:  # shown, then the same bounded exit as Ctrl-C
        traceback.print_exc()
        code = 1
    # run() is the CLI's body and the process ends here: Gradio's block_thread already spent up to 5 s
    # joining its server; closing gets 8 s more, then the process leaves without interpreter shutdown
    close_within(demo, 8.0)
    shutdown.exit_process(code, 12.0)


def close_within(demo, seconds: float):
    """Stop the server, but never let a stuck connection keep Ctrl-C from ending the app (chats are already
    saved after every turn, so nothing is lost by not waiting longer)."""
    closer = threading.Thread(target=demo.close, name="close-server", daemon=True)
    closer.start()
    closer.join(seconds)
    if closer.is_alive():
        print(f"flash-dllm-chat: the server did not stop within {seconds:.0f} s; exiting anyway", flush=True)
