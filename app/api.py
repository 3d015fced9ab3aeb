"""`POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`, OpenAI-compatible, in front of the
engine's requests.

`build_api(host, config)` is a Starlette app: app/launch.py mounts it at /v1 beside the page, app/serve.py
serves it alone (`flash-dllm-chat serve`). Each choice of a completion is an `Engine.submit` request
(app/openai_call.py); app/openai_stream.py turns its events into text, app/openai_bodies.py into OpenAI's bodies.

- One model per process: a request must name the loaded model (its id in /v1/models, the name it was loaded
  by, or for a bundled model a name the CLI takes for it: `bundled`, `tiny-chat`; `model_names`); another name
  gets 404 model_not_found naming the loaded one. A bundled model's id is its own name (`tiny-chat`) whichever
  of those loaded it (`model_id`).
- A request that names no ``method`` gets the loaded model's default (`Engine.default_method`: a block-diffusion
  model's block method); /v1/models entries carry ``family``, ``default_method`` and ``methods`` beside OpenAI's.
- Every error is OpenAI-shaped (`ApiError`): 400 for the request, 401 for the key, 404/405 for routes and
  models, 413 for a body over `ApiConfig.max_body_bytes`, 503 when `max_in_flight` requests are already in
  flight or no model is loaded (a switch is under way), 500 with one line when the engine fails.
- A client that goes away cancels its engine request: a stream when its connection closes (the response's
  own close, `CancellingStream`), a plain request when the wait notices the disconnect.
- /v1/completions takes one raw prompt (text or token ids) and decodes it without the chat template; its answers
  come from the same loop as a chat's, only wrapped as OpenAI's text_completion.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from flash_dllm.app.api_keys import BearerKey
from flash_dllm.app.model_settings import methods_for
from flash_dllm.app.models import Lease, ModelBusy, ModelHost, history_exchanges, model_id, model_names
from flash_dllm.app.openai_bodies import Choice, CompletionMeta, piece, response, usage
from flash_dllm.app.openai_call import EngineCall, Outcome, choice_answers, choice_settings, one_line
from flash_dllm.app.openai_request import ApiError, ChatRequest, invalid, parse_chat_request, parse_text_request
from flash_dllm.app.openai_stream import KEEP_ALIVE, sse
from flash_dllm.engine import GenerationSettings


@dataclass
class ApiConfig:
    key: str | None = None  # when set, every /v1 route wants "Authorization: Bearer <key>"
    max_in_flight: int = 64  # API requests decoding or waiting at once; one more gets 503
    max_body_bytes: int = 4 << 20
    poll_s: float = 0.05  # how long a request's wait sleeps between looks at its engine request
    keep_alive_s: float = 10.0  # an SSE comment after this long without text (a closed connection then shows)
    defaults: GenerationSettings = field(default_factory=GenerationSettings)


class CancellingStream(StreamingResponse):
    """A streaming response that runs ``on_close`` however it ends (finished, client gone, server stopping)."""

    def __init__(self, content, on_close, headers: dict[str, str] | None = None):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def read_json(request: Request, limit: int):
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is {int(length)} bytes; the limit is {limit}", code="body_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise invalid(f"the request body is not valid JSON ({one_line(err)})", None, "invalid_json") from None


class ChatApi:
    """The routes, the loaded model's names, and the count of API requests in flight."""

    def __init__(self, host: ModelHost, config: ApiConfig):
        self.host = host
        self.config = config
        self.created = int(time.time())
        self._in_flight = 0
        self._count_lock = threading.Lock()

    # ------------------------------------------------------------------ the loaded model
    def model_object(self, engine, name: str) -> dict:
        info = engine.describe()
        return {"id": model_id(name, engine.folder), "object": "model", "created": self.created,
                "owned_by": "flash-dllm-chat",
                "family": info.get("family"), "max_context": info.get("max_context"), "device": info.get("device"),
                "default_method": info.get("default_method"), "methods": list(methods_for(engine.model.config)),
                "history_exchanges": history_exchanges(name)}

    def request_defaults(self) -> tuple[GenerationSettings, int | None]:
        """The settings a request starts from, for the model loaded now: a request that names no method gets
        the engine's default for it (a block-diffusion model's block method), and such a model's block size."""
        engine, defaults = self.host.engine, self.config.defaults
        if engine is None:
            return defaults, None
        block = engine.model.config.block_size
        return (defaults.with_overrides(method=engine.default_method) if block else defaults), block

    async def models(self, request: Request) -> Response:
        engine, name = self.host.engine, self.host.name
        data = [self.model_object(engine, name)] if engine is not None and name else []
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        engine, name, asked = self.host.engine, self.host.name, request.path_params["model"]
        if engine is None or asked not in model_names(name, engine.folder):
            raise self.not_this_model(asked, name, engine.folder if engine is not None else None)
        return JSONResponse(self.model_object(engine, name))

    def not_this_model(self, asked: str, loaded: str | None, folder=None) -> ApiError:
        here = f"this server runs one model, '{model_id(loaded, folder)}'" if loaded else "no model is loaded"
        return ApiError(404, f"The model '{asked}' does not exist here: {here} (GET /v1/models lists it).",
                        "invalid_request_error", "model", "model_not_found")

    def lease_for(self, model: str) -> Lease:
        try:
            lease = self.host.lease()
        except ModelBusy as err:
            raise ApiError(503, str(err), "server_error", None, "model_unavailable", {"Retry-After": "5"}) from None
        if model not in model_names(lease.name, lease.engine.folder):
            lease.release()
            raise self.not_this_model(model, lease.name, lease.engine.folder)
        return lease

    # ------------------------------------------------------------------ completions
    def _admit(self) -> None:
        with self._count_lock:
            if self._in_flight >= self.config.max_in_flight:
                raise ApiError(503, f"the server has {self._in_flight} API requests in flight, its limit; try again "
                                    "shortly", "server_error", None, "engine_overloaded", {"Retry-After": "1"})
            self._in_flight += 1

    def _leave(self) -> None:
        with self._count_lock:
            self._in_flight -= 1

    async def chat_completions(self, request: Request) -> Response:
        body = await read_json(request, self.config.max_body_bytes)
        return await self.serve(parse_chat_request(body, *self.request_defaults()), request)

    async def text_completions(self, request: Request) -> Response:
        body = await read_json(request, self.config.max_body_bytes)
        return await self.serve(parse_text_request(body, *self.request_defaults()), request)

    async def serve(self, chat: ChatRequest, request: Request) -> Response:
        self._admit()
        lease, calls = None, []
        try:
            lease = self.lease_for(chat.model)
            loop = asyncio.get_running_loop()
            for settings in choice_settings(chat):
                calls.append(EngineCall(lease, chat, loop, settings))
                self.host.label(calls[-1].request.id, "API")
        except BaseException:
            for call in calls:
                call.close()
            if lease is not None:
                lease.release()
            self._leave()
            raise
        name = model_id(lease.name, lease.engine.folder)
        meta = CompletionMeta.for_text(name) if chat.messages is None else CompletionMeta(name)
        decode = lease.engine.tokenizer.decode
        finished = threading.Event()

        def close() -> None:
            if not finished.is_set():
                finished.set()
                for call in calls:
                    call.close()
                lease.release()
                self._leave()

        if chat.stream:
            return CancellingStream(self.stream(calls, chat, meta, decode), close, calls[0].history_headers())
        try:
            return await self.complete(calls, chat, meta, decode, request)
        finally:
            close()

    async def complete(self, calls, chat, meta, decode, request: Request) -> Response:
        parts, outcomes, checked = [[] for _ in range(chat.n)], [None] * chat.n, time.monotonic()
        async for index, item in choice_answers(calls, chat, decode, self.config.poll_s):
            if isinstance(item, Outcome):
                outcomes[index] = item
            elif item:
                parts[index].append(item)
            if time.monotonic() - checked > 0.5:  # a client that went away stops its request
                checked = time.monotonic()
                if await request.is_disconnected():
                    return Response(status_code=499)  # the caller's close cancels the engine requests
        choices = [Choice("".join(p), o.finish_reason) for p, o in zip(parts, outcomes)]
        return JSONResponse(response(meta, choices, total_usage(outcomes), numbers(calls, outcomes)),
                            headers=calls[0].history_headers())

    async def stream(self, calls, chat, meta, decode) -> AsyncIterator[bytes]:
        if not meta.text:  # each chat choice opens with the assistant's role
            for index in range(chat.n):
                yield sse(piece(meta, index, role=True))
        sent, outcomes = time.monotonic(), [None] * chat.n
        try:
            async for index, item in choice_answers(calls, chat, decode, self.config.poll_s):
                if isinstance(item, Outcome):
                    outcomes[index] = item
                    if chat.include_usage:  # else the finishing chunks wait: the last one carries the usage
                        yield sse(piece(meta, index, "", item.finish_reason))
                elif item:
                    yield sse(piece(meta, index, item))
                    sent = time.monotonic()
                elif time.monotonic() - sent > self.config.keep_alive_s:
                    yield KEEP_ALIVE
                    sent = time.monotonic()
        except ApiError as err:  # after the 200 is sent an error can only travel in the stream
            yield sse(err.body())
            return
        counts, engine_fields = total_usage(outcomes), numbers(calls, outcomes)
        # usage and the engine's numbers ride on OpenAI's separate usage chunk when the client asked for it, else
        # on the last finishing chunk (so every chunk has a choice, as clients that never ask for usage expect)
        if chat.include_usage:
            yield sse(piece(meta, None, usage_=counts, engine=engine_fields))
        else:
            for index in range(chat.n - 1):
                yield sse(piece(meta, index, "", outcomes[index].finish_reason))
            yield sse(piece(meta, chat.n - 1, "", outcomes[-1].finish_reason, counts, engine_fields))
        yield sse("[DONE]")


def total_usage(outcomes: list[Outcome]) -> dict:
    """OpenAI's usage of n choices: the prompt once, every choice's completion tokens."""
    return usage(outcomes[0].prompt_tokens, sum(o.completion_tokens for o in outcomes))


def numbers(calls: list[EngineCall], outcomes: list[Outcome]) -> dict:
    """``flash_dllm``: the first choice's numbers, and with several choices each one's under ``choices``."""
    first = calls[0].numbers(outcomes[0])
    if len(outcomes) == 1:
        return first
    return {**first, "choices": [calls[min(i, len(calls) - 1)].numbers(o) for i, o in enumerate(outcomes)]}


# ---------------------------------------------------------------------------- errors and the app
async def api_error(request: Request, err: ApiError) -> Response:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def route_error(request: Request, err: HTTPException) -> Response:
    if err.status_code == 405:
        message, code = f"{request.method} is not allowed on {request.url.path}", "method_not_allowed"
    elif err.status_code == 404:
        message = (f"unknown route {request.method} {request.url.path}; this server answers "
                   "POST /v1/chat/completions, POST /v1/completions and GET /v1/models")
        code = "unknown_url"
    else:
        message, code = str(err.detail), None
    return JSONResponse(ApiError(err.status_code, message, code=code).body(), status_code=err.status_code,
                        headers=getattr(err, "headers", None))


async def server_error(request: Request, err: Exception) -> Response:
    body = ApiError(500, f"internal error: {type(err).__name__}: {one_line(err)}", "server_error").body()
    return JSONResponse(body, status_code=500)


ERROR_HANDLERS = {ApiError: api_error, HTTPException: route_error, Exception: server_error}


def build_api(host: ModelHost, config: ApiConfig | None = None) -> Starlette:
    """The /v1 routes as an app of their own (mount it at /v1)."""
    api = ChatApi(host, config or ApiConfig())
    routes = [Route("/models", api.models, methods=["GET"]),
              Route("/models/{model:path}", api.model, methods=["GET"]),
              Route("/chat/completions", api.chat_completions, methods=["POST"]),
              Route("/completions", api.text_completions, methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers=ERROR_HANDLERS,
                    middleware=[Middleware(BearerKey, key=api.config.key)])
    app.state.chat_api = api
    return app

