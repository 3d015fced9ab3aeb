"""A completion's engine side: each choice one `Engine.submit` request whose events land on an asyncio queue
(`EngineCall`), its committed text as it grows (`answer`), and the ``n`` choices of one request interleaved
(`choice_answers`). The API never assumes how the engine schedules requests (one at a time or batched).

``n`` choices: with temperature 0 the engine's answer is determined by the request, so one engine request is
decoded and its answer is every choice's; with a temperature each choice is its own request, seeded ``seed + i``
(`choice_settings`), and the engine decodes them as one batch.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

from flash_dllm.app.models import Lease, history_exchanges
from flash_dllm.app.openai_request import ApiError, ChatRequest, invalid, param_of
from flash_dllm.app.openai_stream import CommittedPrefix, TextStream, engine_numbers, returned_tokens, step_numbers
from flash_dllm.engine import (CanvasStart, EngineError, GenerationSettings, PromptError, SettingsError, StepEvent,
                               keep_last_exchanges, validate)


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

    def __init__(self, lease: Lease, chat: ChatRequest, loop: asyncio.AbstractEventLoop,
                 settings: GenerationSettings | None = None):
        settings = settings or chat.settings  # a choice's own (its seed), else the request's
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.kernels = lease.engine.kernels  # the engine's kernel backend, for the numbers of a cut answer
        try:  # the request was parsed for the model loaded then: the leased one (a switch may be between) judges
            validate(settings, model_config=lease.engine.model.config)
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
            self.request = lease.engine.submit(prompt, settings, on_event=self._on_event)
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


def choice_settings(chat: ChatRequest) -> list[GenerationSettings]:
    """The engine requests behind a request's ``n`` choices: one when the answer is determined (temperature 0),
    else one per choice, the seeds following the request's."""
    settings = chat.settings
    if chat.n == 1 or settings.temperature == 0:
        return [settings]
    return [settings.with_overrides(seed=(settings.seed + i) % 2**64) for i in range(chat.n)]


async def choice_answers(calls: list[EngineCall], chat: ChatRequest, decode, poll_s: float) -> AsyncIterator:
    """(choice index, item) for every item `answer` yields of each call, interleaved as they come; a single
    call (a determined answer) speaks for every one of the ``chat.n`` choices. The first error ends it all."""
    copies = chat.n if len(calls) == 1 else 1
    if len(calls) == 1:
        async for item in answer(calls[0], chat, decode, poll_s):
            for index in range(copies):
                yield index, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    ended = object()

    async def pump(index: int, call: EngineCall) -> None:
        try:
            async for item in answer(call, chat, decode, poll_s):
                await queue.put((index, item))
        except Exception as err:  # noqa: BLE001 - handed to the reader, who raises it
            await queue.put((index, err))
        finally:
            await queue.put((index, ended))

    tasks = [asyncio.create_task(pump(index, call)) for index, call in enumerate(calls)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is ended:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
