"""OpenAI's response bodies: a chat.completion or a text_completion, whole or as the chunks of a stream, with
one choice or ``n`` of them. ``flash_dllm`` (the engine's numbers) rides on the body that carries ``usage``."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CompletionMeta:
    """What every chunk and the response of one completion share; ``text``: a /v1/completions answer."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))
    text: bool = False

    @classmethod
    def for_text(cls, model: str) -> "CompletionMeta":
        return cls(model, f"cmpl-{uuid.uuid4().hex[:24]}", text=True)  # OpenAI numbers those "cmpl-"


@dataclass(frozen=True)
class Choice:
    """One finished choice of a plain (not streamed) response."""

    text: str
    finish_reason: str


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _head(meta: CompletionMeta, chunked: bool) -> dict:
    kind = "text_completion" if meta.text else "chat.completion.chunk" if chunked else "chat.completion"
    return {"id": meta.id, "object": kind, "created": meta.created, "model": meta.model, "system_fingerprint": None}


def response(meta: CompletionMeta, choices: list[Choice], usage_: dict, engine: dict) -> dict:
    """A chat.completion (``message``) or a text_completion (``text``)."""
    if meta.text:
        items = [{"text": c.text, "index": i, "logprobs": None, "finish_reason": c.finish_reason}
                 for i, c in enumerate(choices)]
    else:
        items = [{"index": i, "message": {"role": "assistant", "content": c.text, "refusal": None},
                  "logprobs": None, "finish_reason": c.finish_reason} for i, c in enumerate(choices)]
    return {**_head(meta, False), "choices": items, "usage": usage_, "flash_dllm": engine}


def piece(meta: CompletionMeta, index: int | None, text: str = "", finish_reason: str | None = None,
          usage_: dict | None = None, engine: dict | None = None, role: bool = False) -> dict:
    """One stream chunk of choice ``index``: its new ``text`` ("" with a finish reason: the finishing chunk;
    ``role``: a chat choice's opening chunk), or with ``index`` None the usage-only chunk OpenAI ends with."""
    if index is None:
        choices = []
    elif meta.text:
        choices = [{"text": text, "index": index, "logprobs": None, "finish_reason": finish_reason}]
    else:
        delta = {"role": "assistant", "content": ""} if role else {"content": text} if text else {}
        choices = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    body = {**_head(meta, True), "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    if engine is not None:
        body["flash_dllm"] = engine
    return body
