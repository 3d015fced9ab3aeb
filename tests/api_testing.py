"""Helpers for the API tests: the app (page + /v1) served in-process, the API alone under uvicorn, clients."""
from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import torch

from flash_dllm.app.api import ApiConfig
from flash_dllm.app.chats import ChatStore
from flash_dllm.app.guard import AccessPolicy
from flash_dllm.app.launch import serve
from flash_dllm.app.models import LoadOptions, ModelHost, display_name
from flash_dllm.app.serve import api_only_app
from flash_dllm.app.turns import AppContext
from flash_dllm.engine import Engine
from app_testing import free_port  # noqa: E402



def chat_api_of(app):
    """The ChatApi behind a served app: its config can be changed while the server runs."""
    for route in app.routes:
        if getattr(route, "path", None) == "/v1":
            return route.app.state.chat_api
    raise LookupError("no /v1 mount")


@contextlib.contextmanager
def served_app(folder: Path, home: Path, api: ApiConfig | None = None):
    """The chat app (page and API) for the model in ``folder``, on a free port of 127.0.0.1."""
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared 2-core machine decode far faster on one thread
    engine = Engine.load(str(folder), device="cpu")
    ctx = AppContext(ModelHost(engine, LoadOptions(device="cpu"), name=str(folder)), ChatStore(home / "chats"))
    demo = serve(ctx, port=free_port(), api=api)
    try:
        yield SimpleNamespace(ctx=ctx, demo=demo, url=demo.local_url, base_url=demo.local_url.rstrip("/") + "/v1",
                              engine=engine, model=display_name(str(folder)), chat_api=chat_api_of(demo.app))
    finally:
        demo.close()
        torch.set_num_threads(saved_threads)


@contextlib.contextmanager
def served_tiny_llada(tmp_path_factory):
    """`served_app` for a tiny random-weight LLaDA model written afresh (the API test modules' usual app)."""
    from flash_dllm.engine.tiny import TinySpec, write_tiny_model

    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada", TinySpec("llada"))
    with served_app(folder, tmp_path_factory.mktemp("home")) as served:
        yield served


@contextlib.contextmanager
def served_api(host: ModelHost, config: ApiConfig):
    """The API alone (as `flash-dllm-chat serve` runs it) under uvicorn on a thread; yields its /v1 URL."""
    import uvicorn

    port = free_port()
    app = api_only_app(host, config, AccessPolicy.for_address("127.0.0.1"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-api-server", daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)


def openai_client(base_url: str, key: str = "no-key"):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)


def post(base_url: str, path: str, **kwargs) -> httpx.Response:
    return httpx.post(base_url + path, timeout=120, **kwargs)


def error_of(response: httpx.Response) -> dict:
    """The OpenAI error object of a response, checked for its shape."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert "Traceback" not in body["error"]["message"] and "\n" not in body["error"]["message"]
    return body["error"]


class SubmitSpy:
    """Wraps `engine.submit` to keep every Request it returns (the tests look at how each one ended)."""

    def __init__(self, engine, monkeypatch):
        self.requests = []
        submit = engine.submit

        def spy(*args, **kwargs):
            request = submit(*args, **kwargs)
            self.requests.append(request)
            return request
        monkeypatch.setattr(engine, "submit", spy)
