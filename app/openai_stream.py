"""From a diffusion request's step events to OpenAI's completion text, chunk by chunk.

Cells of a diffusion answer commit out of order, so a stream cannot send tokens as they arrive. It sends the
text of the longest fully committed prefix of the answer, each chunk the part that is new (`CommittedPrefix`,
`TextStream`). A committed cell never changes, and an end token can only land on a masked cell, so that prefix is
final: what was sent is never taken back. The text is held back while it ends in an incomplete UTF-8 character
(the tokenizer decodes it as U+FFFD until the next byte arrives) or in what may become a stop string, and cut at
the first stop string. The streamed chunks joined are exactly the non-streamed answer: both come from here.

A cut answer's ``completion_tokens`` are the tokens of the text returned (`returned_tokens`), never the cells
committed after the cut: a diffusion model commits later cells before earlier ones, so when a stop string shows
up much of what follows it may be committed already, and none of that is the client's answer. The rates under
``flash_dllm`` (`engine_numbers`, `step_numbers`) are of the same tokens, so they agree with ``usage``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from flash_dllm.engine import StepEvent, tokens_per_forward, tokens_per_second

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


def returned_tokens(ids: list[int], text: str, decode) -> int:
    """How many of the answer's first tokens ``ids`` the returned ``text`` is made of: the fewest whose decoding
    begins with it. So the stop string's own tokens are not counted (OpenAI does not return the stop string),
    but a token the cut splits is (part of its text was returned). Binary search (a dozen decodes, once per
    answer): as the prefix of tokens grows, whether its text begins with ``text`` turns from no to yes once."""
    if not decode(ids).startswith(text):  # a decoding that disagrees with what was sent: no fewer to be sure of
        return len(ids)
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high) // 2
        if decode(ids[:middle]).startswith(text):
            high = middle
        else:
            low = middle + 1
    return low


# ---------------------------------------------------------------------------- the engine's numbers
def numbers(method: str, steps: int, forward_passes: int, per_forward: float, per_s: float, elapsed_s: float,
            kernels: str) -> dict:
    """The engine's numbers under ``flash_dllm``: one shape whether the engine finished or a stop string cut."""
    return {"method": method, "steps": int(steps), "forward_passes": int(forward_passes),
            "tokens_per_forward": float(per_forward), "tokens_per_s": float(per_s), "elapsed_s": float(elapsed_s),
            "kernels": kernels}


def engine_numbers(result, tokens: int) -> dict:
    """A finished request's numbers, from its GenerationResult. The engine's rates are of all its tokens; for
    an answer a stop string cut after it finished they are redone over ``tokens``, the completion tokens its
    usage reports, rounded as the engine rounds them."""
    if tokens == len(result.token_ids):
        per_forward, per_s = result.tokens_per_forward, result.tokens_per_s
    else:
        per_forward, per_s = rates(tokens, result.forward_passes, result.elapsed_s)
    return numbers(result.method, result.steps, result.forward_passes, per_forward, per_s, result.elapsed_s,
                   result.kernels)


def step_numbers(last: StepEvent, tokens: int, method: str, kernels: str) -> dict:
    """The numbers of an answer a stop string cut (its request cancelled, so no result): from its last step
    event's cumulative counters, with ``tokens`` the completion tokens its usage reports (not the cells
    committed by then, which run past the cut); rounded as the engine rounds a result's."""
    return numbers(method, last.step + 1, last.forward_passes, *rates(tokens, last.forward_passes, last.elapsed_s),
                   round(last.elapsed_s, 4), kernels)


def rates(tokens: int, forward_passes: int, elapsed_s: float) -> tuple[float, float]:
    """(tokens per forward pass, tokens per second), rounded as the engine rounds a result's."""
    return round(tokens_per_forward(tokens, forward_passes), 3), round(tokens_per_second(tokens, elapsed_s), 3)


def sse(data) -> bytes:
    """One server-sent event; ``data`` a JSON-ready object or the closing "[DONE]"."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it; a closed connection shows up when it is sent
