"""`flash-dllm-chat serve`: the OpenAI-compatible API alone, without the page, for scripts.

The same routes as the app's /v1 (app/api.py), behind the same Host/Origin guard (app/guard.py). The port is
bound before the model loads, so a port in use costs no load; the model is chosen as the app chooses it
(--model, else the last one used, ...). Ctrl-C stops it: streams still open get a few seconds to finish.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

DEFAULT_PORT = 8000
DEFAULT_MAX_IN_FLIGHT = 64  # ApiConfig's default, here too so that --help imports no server code
GRACE_S = 5.0  # after Ctrl-C, streams in flight get this long before they are cut


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    from flash_dllm.app.cli import add_load_arguments

    add_load_arguments(p, subcommand=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (default: $FLASH_DLLM_API_KEY; generated and printed when "
                        "listening beyond this machine)")
    p.add_argument("--max-in-flight", type=int, default=DEFAULT_MAX_IN_FLIGHT,
                   help=f"API requests in flight at once; more are answered 503 (default {DEFAULT_MAX_IN_FLIGHT})")


def api_only_app(host, config, policy):
    """The /v1 routes with the guard in front; every other path is an OpenAI-shaped 404."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.routing import Mount

    from flash_dllm.app.api import build_api, route_error
    from flash_dllm.app.guard import GuardMiddleware

    return Starlette(routes=[Mount("/v1", app=build_api(host, config))],
                     middleware=[Middleware(GuardMiddleware, policy=policy)],
                     exception_handlers={HTTPException: route_error})


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) and listening; LaunchError when the port is taken."""
    from flash_dllm.app.launch import LaunchError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise LaunchError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror or err}); is another "
                          "server using it? Choose another with --port") from None
    sock.listen(128)
    return sock


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from flash_dllm.app.api import ApiConfig
    from flash_dllm.app.api_keys import ApiKeyError, api_key_for
    from flash_dllm.app.cli import error_line
    from flash_dllm.app.guard import AccessPolicy
    from flash_dllm.app.launch import LaunchError, check_host, check_port, is_loopback, load_startup_engine
    from flash_dllm.app.models import ModelHost, model_id
    from flash_dllm.engine import SettingsError, pick_device

    try:  # every flag before the model loads: a mistake costs no load
        check_port(args.port)
        check_host(args.host)
        pick_device(args.device)
        if args.max_in_flight < 1:
            raise LaunchError(f"--max-in-flight {args.max_in_flight}: give at least 1")
        key, generated = api_key_for(args.api_key, shared=not is_loopback(args.host))
        sock = listening_socket(args.host, args.port)
    except (LaunchError, SettingsError, ApiKeyError, OSError) as err:
        print(f"flash-dllm-chat serve: {error_line(err)}", file=sys.stderr)
        return 2
    loaded = load_startup_engine("flash-dllm-chat serve", args)
    if loaded is None:
        return 2
    engine, name, options = loaded
    host = ModelHost(engine, options, name)
    app = api_only_app(host, ApiConfig(key=key, max_in_flight=args.max_in_flight), AccessPolicy.for_address(args.host))
    info = engine.describe()
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    if generated:
        print(f"API key (generated, since others can reach this address; choose one with --api-key): {key}",
              flush=True)
    elif key:
        print("API key required: Authorization: Bearer <the key given>", flush=True)
    print(f"Serving {model_id(name, engine.folder)} ({info['device']}, {info['dtype']}, kernels: {info['kernels']}) at "
          f"http://{shown_host}:{args.port}/v1  (POST /v1/chat/completions, POST /v1/completions, GET /v1/models; Ctrl-C stops it)",
          flush=True)
    return serve_forever(app, sock)


def serve_forever(app, sock: socket.socket) -> int:
    import uvicorn

    from flash_dllm.app import shutdown

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=GRACE_S,
                                           access_log=False))
    code = 0
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    except Exception as err:  # noqa: BLE001 - shown, then the same bounded exit as Ctrl-C
        print(f"flash-dllm-chat serve: the server stopped: {type(err).__name__}: {err}", file=sys.stderr)
        code = 1
    # the engine's worker threads are daemons; leave without interpreter finalisation, which a stuck
    # connection's thread could otherwise hold up
    shutdown.exit_process(code, GRACE_S + 5.0)
