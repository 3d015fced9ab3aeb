"""`POST /v1/chat/completions`, `POST /v1/completions` and `GET /v1/models`, OpenAI-compatible, in front of the
engine's requests.

`build_api(host, config)` is a Starlette app: app/launch.py mounts it at /v1 beside the page, app/serve.py
serves it alone (`flash-dllm-chat serve`). Each completion is one `Engine.submit` request; its events come from
the engine's thread onto an asyncio queue (the callback only schedules a put) and app/openai_stream.py turns
them into text. The API never assumes how the engine schedules requests (one at a time or batched).

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
from flash_dllm.app.openai_request import (ApiError, ChatRequest, invalid, param_of, parse_chat_request,
                                           parse_text_request)
from flash_dllm.app.openai_stream import (KEEP_ALIVE, CommittedPrefix, CompletionMeta, TextStream, chat_piece,
                                          chunk, completion, engine_numbers, returned_tokens, sse, step_numbers,
                                          text_chunk, text_completion, text_meta, usage)
from flash_dllm.engine import (CanvasStart, EngineError, GenerationSettings, PromptError, SettingsError, StepEvent,
                               keep_last_exchanges, validate)


@dataclass
class ApiConfig:
    key: str | None = None  # when set, every /v1 route wants "Authorization: Bearer <key>"
    max_in_flight: int = 64  # API requests decoding or waiting at once; one more gets 503
    max_body_bytes: int = 4 << 20
    poll_s: float = 0.05  # how long a request's wait sleeps between looks at its engine request
    keep_alive_s: float = 10.0  # an SSE comment after this long without text (a closed connection then shows)
    defaults: GenerationSettings = field(default_factory=GenerationSettings)


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


@dataclass
class Outcome:
    """How a completion ended: the finish reason, the token counts and the engine's numbers."""

    finish_reason: str  # "stop" (end token or stop string) | "length" (the answer filled max_tokens)
    prompt_tokens: int
    completion_tokens: int  # the returned text's tokens: a stop string's cut drops it and what follows
    engine: dict


class EngineCall:
    """One engine request seen from the event loop: its events land on an asyncio queue."""

    def __init__(self, lease: Lease, chat: ChatRequest, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.kernels = lease.engine.kernels  # the engine's kernel backend, for the numbers of a cut answer
        try:  # the request was parsed for the model loaded then: the leased one (a switch may be between) judges
            validate(chat.settings, model_config=lease.engine.model.config)
        except SettingsError as err:  # a method (or block length) this model cannot decode with
            raise invalid(str(err), param_of(str(err), "max_tokens") or "method") from None
        self.param = "prompt" if chat.messages is None else "messages"  # what a refused input came from
        if chat.messages is None:  # a text completion: the prompt as given
            self.window, self.left_out, prompt = None, 0, chat.prompt
        else:
            # A model trained on short chats only (the bundled one) reads the last few exchanges, as on the page;
            # the response says so (history_headers), since a client sent the rest.
            self.window = history_exchanges(lease.name)
            prompt, self.left_out = keep_last_exchanges(chat.messages, self.window)
        try:
            self.request = lease.engine.submit(prompt, chat.settings, on_event=self._on_event)
        except SettingsError as err:  # settings were validated already: what is left is the context check
            raise invalid(str(err), self.param, "context_length_exceeded") from None
        except (PromptError, ValueError) as err:  # a conversation the tokenizer cannot take
            raise invalid(one_line(err), self.param) from None
        except EngineError as err:  # the engine cannot take the request now
            raise ApiError(503, one_line(err), "server_error", None, "engine_overloaded", {"Retry-After": "1"}) from None

    def history_headers(self) -> dict[str, str]:
        """What the model read of the conversation, for a model that reads only its last exchanges."""
        if self.window is None:
            return {}
        return {"X-Flash-Dllm-History-Window": str(self.window), "X-Flash-Dllm-Messages-Left-Out": str(self.left_out)}

    def numbers(self, outcome: Outcome) -> dict:
        """The response's ``flash_dllm``: the engine's numbers, and what the model read of the conversation."""
        if self.window is None:
            return outcome.engine
        return {**outcome.engine, "history_window": self.window, "messages_left_out": self.left_out}

    def _on_event(self, event) -> None:
        """On the engine's thread: schedule the put and return at once."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the loop is closed (the server stops): the request is cancelled with it
            pass

    async def next_event(self, timeout: float):
        try:
            return await asyncio.wait_for(self.events.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def close(self) -> None:
        if not self.request.done:
            self.request.cancel()

    def result(self):
        """The finished request's GenerationResult, or ApiError with what went wrong."""
        try:
            result = self.request.result(0)
        except (SettingsError, PromptError) as err:
            raise invalid(str(err), self.param) from None
        except EngineError as err:
            raise ApiError(500, one_line(err), "server_error", None, "engine_error") from None
        except Exception as err:  # noqa: BLE001 - a bug in the engine: one line to the client, never a traceback
            raise ApiError(500, f"{type(err).__name__}: {one_line(err)}", "server_error", None, "engine_error") from None
        if result.finish_reason == "cancelled":
            raise ApiError(503, "the server cancelled this request before it finished; try again", "server_error",
                           None, "cancelled")
        return result


async def answer(call: EngineCall, chat: ChatRequest, decode, poll_s: float) -> AsyncIterator:
    """The answer's new text as it commits (str; "" when nothing happened for ``poll_s``), then its Outcome.
    A stop string cancels the engine request at once: the text before it is final, and its tokens are the
    completion tokens (`returned_tokens`), streamed or not."""
    prefix = CommittedPrefix(chat.settings.gen_length)
    text = TextStream(chat.stop)
    while not call.request.done or not call.events.empty():
        event = await call.next_event(poll_s)
        if event is None:
            yield ""
            continue
        if isinstance(event, CanvasStart) and event.seq == 0:
            prefix.end_tokens = frozenset(event.end_tokens)
        if not isinstance(event, StepEvent) or event.seq != 0:
            continue
        if prefix.apply(event.committed, event.tokens, event.padding_from):
            delta = text.update(decode(prefix.token_ids()))
            if delta:
                yield delta
            if text.stopped:
                call.close()
                tokens = returned_tokens(prefix.token_ids(), text.sent, decode)
                yield Outcome("stop", call.request.prompt_tokens, tokens,
                              step_numbers(event, tokens, chat.settings.method, call.kernels))
                return
    result = call.result()
    delta = text.update(result.text, final=True)
    if delta:
        yield delta
    reason = "stop" if text.stopped or result.finish_reason == "eos" else "length"
    tokens = returned_tokens(result.token_ids, text.sent, decode) if text.stopped else len(result.token_ids)
    yield Outcome(reason, result.prompt_tokens or call.request.prompt_tokens, tokens, engine_numbers(result, tokens))


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
        lease = call = None
        try:
            lease = self.lease_for(chat.model)
            call = EngineCall(lease, chat, asyncio.get_running_loop())
            self.host.label(call.request.id, "API")
        except BaseException:
            if lease is not None:
                lease.release()
            self._leave()
            raise
        name = model_id(lease.name, lease.engine.folder)
        meta = text_meta(name) if chat.messages is None else CompletionMeta(model=name)
        decode = lease.engine.tokenizer.decode
        finished = threading.Event()

        def close() -> None:
            if not finished.is_set():
                finished.set()
                call.close()
                lease.release()
                self._leave()

        if chat.stream:
            return CancellingStream(self.stream(call, chat, meta, decode), close, call.history_headers())
        try:
            return await self.complete(call, chat, meta, decode, request)
        finally:
            close()

    async def complete(self, call, chat, meta, decode, request: Request) -> Response:
        parts, outcome, checked = [], None, time.monotonic()
        async for item in answer(call, chat, decode, self.config.poll_s):
            if isinstance(item, Outcome):
                outcome = item
            elif item:
                parts.append(item)
            if time.monotonic() - checked > 0.5:  # a client that went away stops its request
                checked = time.monotonic()
                if await request.is_disconnected():
                    call.close()
                    return Response(status_code=499)
        wrap = text_completion if chat.messages is None else completion
        return JSONResponse(wrap(meta, "".join(parts), outcome.finish_reason,
                                 usage(outcome.prompt_tokens, outcome.completion_tokens), call.numbers(outcome)),
                            headers=call.history_headers())

    async def stream(self, call, chat, meta, decode) -> AsyncIterator[bytes]:
        piece = text_chunk if chat.messages is None else chat_piece
        if chat.messages is not None:  # a chat stream opens with the assistant's role
            yield sse(chunk(meta, {"role": "assistant", "content": ""}))
        sent, outcome = time.monotonic(), None
        try:
            async for item in answer(call, chat, decode, self.config.poll_s):
                if isinstance(item, Outcome):
                    outcome = item
                elif item:
                    yield sse(piece(meta, item))
                    sent = time.monotonic()
                elif time.monotonic() - sent > self.config.keep_alive_s:
                    yield KEEP_ALIVE
                    sent = time.monotonic()
        except ApiError as err:  # after the 200 is sent an error can only travel in the stream
            yield sse(err.body())
            return
        counts, engine_fields = usage(outcome.prompt_tokens, outcome.completion_tokens), call.numbers(outcome)
        # usage and the engine's numbers ride on the finishing chunk unless the client asked for OpenAI's
        # separate usage chunk
        if chat.include_usage:
            yield sse(piece(meta, "", outcome.finish_reason))
            yield sse(piece(meta, None, None, counts, engine_fields))
        else:
            yield sse(piece(meta, "", outcome.finish_reason, counts, engine_fields))
        yield sse("[DONE]")


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

