"""From a diffusion request's step events to OpenAI's completion text, chunk by chunk.

Cells of a diffusion answer commit out of order, so a stream cannot send tokens as they arrive. It sends the
text of the longest fully committed prefix of the answer, each chunk the part that is new (`CommittedPrefix`,
`TextStream`). A committed cell never changes, and an end token can only land on a masked cell, so that prefix is
final: what was sent is never taken back. The text is held back while it ends in an incomplete UTF-8 character
(the tokenizer decodes it as U+FFFD until the next byte arrives) or in what may become a stop string, and cut at
the first stop string. The streamed chunks joined are exactly the non-streamed answer: both come from here.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"


class CommittedPrefix:
    """The answer's cells as steps commit them, and how many of the first cells are all committed."""

    def __init__(self, gen_length: int, end_tokens: frozenset = frozenset()):
        self.cells: list[int | None] = [None] * gen_length
        self.end = gen_length  # the end token's cell once one is committed: the answer stops before it
        self.length = 0
        # CanvasStart.end_tokens: under the official end rule no padding follows the end token and the cells
        # after it decode on, so the end is where the first of these commits
        self.end_tokens = end_tokens

    def apply(self, committed: list[int], tokens: list[int], padding_from: int | None) -> bool:
        """Fold one StepEvent's commits in; True when the committed prefix grew."""
        for cell, token in zip(committed, tokens):
            if 0 <= cell < len(self.cells):
                self.cells[cell] = token
                if token in self.end_tokens:
                    self.end = min(self.end, cell)
        if padding_from is not None:
            self.end = min(self.end, padding_from - 1)
        grown = self.length
        while grown < self.end and self.cells[grown] is not None:
            grown += 1
        changed, self.length = grown > self.length, grown
        return changed

    @property
    def complete(self) -> bool:
        return self.length == self.end

    def token_ids(self) -> list[int]:
        return [t for t in self.cells[:self.length] if t is not None]


def stop_at(text: str, stops: list[str]) -> int | None:
    """Where the first stop string starts in ``text``, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def partial_stop(text: str, stops: list[str]) -> int:
    """The length of the longest end of ``text`` that is the beginning of a stop string (it may grow into one)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


@dataclass
class TextStream:
    """The text sent so far; `update` takes the committed prefix's text and returns what is new and safe."""

    stops: list[str] = field(default_factory=list)
    sent: str = ""
    stopped: bool = False  # a stop string was found: the text ends before it

    def update(self, text: str, final: bool = False) -> str:
        if self.stopped:
            return ""
        cut = stop_at(text, self.stops)
        if cut is not None:
            text, final, self.stopped = text[:cut], True, True
        if not final:
            text = text.rstrip(REPLACEMENT)
            text = text[:len(text) - partial_stop(text, self.stops)]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""  # nothing new (or a decoding that disagrees with what was sent, which cannot be taken back)
        delta, self.sent = text[len(self.sent):], text
        return delta


# ---------------------------------------------------------------------------- response bodies
@dataclass(frozen=True)
class CompletionMeta:
    """What every chunk and the response of one completion share."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk(meta: CompletionMeta, delta: dict | None, finish_reason: str | None = None,
          usage_: dict | None = None, engine: dict | None = None) -> dict:
    """A chat.completion.chunk; ``delta`` None makes the usage-only chunk (no choices) OpenAI ends with;
    ``engine`` (the engine's numbers, as a completion's ``flash_dllm``) rides on the chunk that carries usage."""
    body = {"id": meta.id, "object": "chat.completion.chunk", "created": meta.created, "model": meta.model,
            "system_fingerprint": None,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                                  "finish_reason": finish_reason}]}
    if usage_ is not None:
        body["usage"] = usage_
    if engine is not None:
        body["flash_dllm"] = engine
    return body


def completion(meta: CompletionMeta, text: str, finish_reason: str, usage_: dict, engine: dict) -> dict:
    """A chat.completion; ``engine`` (steps, forward passes, speed) rides along under ``flash_dllm``."""
    return {"id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": finish_reason}],
            "usage": usage_, "flash_dllm": engine}


def sse(data) -> bytes:
    """One server-sent event; ``data`` a JSON-ready object or the closing "[DONE]"."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it; a closed connection shows up when it is sent
