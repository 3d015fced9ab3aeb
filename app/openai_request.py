"""An OpenAI chat-completions (or text-completions) request body, checked and turned into what the engine takes.

`parse_chat_request(body, defaults)` returns a `ChatRequest` (the messages as {"role", "content"} text, the
`GenerationSettings`, the stop strings and how to answer) or raises `ApiError` with the status, the OpenAI error
``type``/``code`` and the ``param`` at fault. `parse_text_request` does the same for /v1/completions: one prompt
(text or token ids) in place of the messages, and settings that skip the chat template. The engine's `validate` stays the judge of which values are legal;
this module only says which request field a refused setting came from.

Decisions a client should know (README, "OpenAI-compatible API"):
- ``max_tokens`` (or ``max_completion_tokens``) is the answer length exactly: the diffusion canvas has that many
  cells. When ``block_length`` is not given it is chosen to divide ``max_tokens`` (`block_length_for`); an
  explicit ``block_length`` that does not divide it is refused with the lengths that would work. A block-diffusion
  model (LLaDA2) decodes in its own block size: ``max_tokens`` must be a multiple of it.
- ``temperature`` defaults to 0 (greedy), the engine's default, not OpenAI's 1; with a temperature and no
  ``seed`` a random seed is drawn, so repeated sampled requests differ as they do with OpenAI.
- ``n``: up to MAX_CHOICES choices (app/openai_call.py says how they are decoded).
- OpenAI fields the engine cannot honour are refused when set to anything but their neutral value (penalties 0,
  no tools, no logprobs); unknown fields are refused by name (a misspelt engine knob would otherwise be ignored
  silently). ``top_p`` filters method dream's sampling (Dream's published default is 0.95); with
  another method only 1 passes, as the engine refuses a filter that method would ignore.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

from flash_dllm.engine import GenerationSettings, SettingsError, block_length_for, validate

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_CHOICES = 8  # n: choices of one request (each a request of the engine's batch when sampled)
# The engine's own knobs, accepted as extra body fields, and OpenAI's top_p (a knob of method dream), with the
# JSON type each must have.
ENGINE_FIELDS = {"method": str, "threshold": float, "gamma": float, "block_length": int, "window": int,
                 "lookahead": int, "track": int, "steps": int, "max_candidates": int, "cfg_scale": float,
                 "acceptance": str, "cache_mode": str, "end_rule": str, "alg": str, "alg_temp": float, "top_k": int,
                 "top_p": float}
# OpenAI fields the engine has no use for, accepted only at their neutral values (None is always neutral).
NEUTRAL_VALUES = {"presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0),
                  "logit_bias": ({},), "logprobs": (False,), "top_logprobs": (0,), "tools": ([],),
                  "tool_choice": ("none",), "functions": ([],), "response_format": ({"type": "text"},)}
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "safety_identifier",
                  "prompt_cache_key", "reasoning_effort")
OPENAI_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "seed", "stop",
                 "stream", "stream_options", "n")
# /v1/completions (a raw prompt, no chat template): its own fields, and the legacy ones it has no use for
TEXT_FIELDS = ("model", "prompt", "max_tokens", "temperature", "seed", "stop", "stream", "stream_options", "n")
TEXT_NEUTRAL_VALUES = {"best_of": (1,), "echo": (False,), "suffix": ("",), "logprobs": (0,),
                       "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},)}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ApiError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}`` with a status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


@dataclass
class ChatRequest:
    """A chat completion (``messages``), or a text completion (``prompt``, fed without the chat template)."""

    model: str
    messages: list[dict] | None
    settings: GenerationSettings
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    prompt: str | list[int] | None = None  # a text completion's prompt: its text or its token ids
    n: int = 1  # choices


def neighbours(max_tokens: int, block_length: int) -> str:
    below = max_tokens // block_length * block_length
    above = below + block_length
    return f"{below} or {above}" if below else f"{above}"


def typed(name: str, value, kind: type):
    """``value`` if it has the JSON type ``kind`` wants (an int is a float; a bool is neither)."""
    if kind is str:
        ok = isinstance(value, str)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        wanted = {str: "a string", int: "an integer", float: "a finite number"}[kind]
        raise invalid(f"{name} must be {wanted} (got {str(value)[:40]!r})", name)
    return value


def utf8(text: str, where: str) -> str:
    """``text`` if it is valid Unicode: JSON can carry lone surrogates ("\\ud800"), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"{where} holds a lone surrogate (invalid Unicode)", where) from None
    return text


def text_of(content, index: int) -> str:
    """A message's content: a string, or a list of text parts joined by newlines."""
    where = f"messages[{index}].content"
    if isinstance(content, str):
        return utf8(content, where)
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise invalid(f"{where}: only text parts are supported (got {kind!r})", where)
            texts.append(utf8(part["text"], where))
        return "\n".join(texts)
    raise invalid(f"{where} must be a string or a list of text parts", where)


def parse_messages(messages) -> list[dict]:
    if messages is None:
        raise invalid("messages is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid(f"messages[{index}] must be an object with role and content", f"messages[{index}]")
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"messages[{index}].role {str(role)[:40]!r} is not supported; use system, developer, "
                          "user or assistant (tool calls are not supported)", f"messages[{index}].role")
        if "content" not in message or message["content"] is None:
            raise invalid(f"messages[{index}].content is required (tool calls are not supported)",
                          f"messages[{index}].content", "missing_required_parameter")
        out.append({"role": ROLES[role], "content": text_of(message["content"], index)})
    return out


def parse_stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid(f"stop takes at most {MAX_STOP_STRINGS} strings (got {len(stops)})", "stop")
    if any(not s for s in stops):
        raise invalid("stop strings must not be empty", "stop")
    return [utf8(s, "stop") for s in stops]


def shown(value) -> str:
    """A request value as an error message quotes it: whole when short, else what it is."""
    text = str(value)
    if len(text) <= 40:
        return text
    if isinstance(value, (list, dict)):
        return f"(a {type(value).__name__} of {len(value)})"
    return text[:37] + "..."


def check_fields(body: dict, fields=OPENAI_FIELDS, neutral=NEUTRAL_VALUES) -> None:
    known = set(fields) | set(ENGINE_FIELDS) | set(neutral) | set(IGNORED_FIELDS)
    for name, value in body.items():
        if name not in known:
            raise invalid(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
        if name in neutral and value is not None and value not in neutral[name]:
            raise invalid(f"{name} {shown(value)} is not supported by this server (diffusion decoding); leave "
                          f"it out or set it to {neutral[name][0]!r}", name, "unsupported_parameter")


def answer_length(body: dict, default: int) -> tuple[int, str]:
    """(max_tokens, the field it came from)."""
    given = {name: body[name] for name in ("max_tokens", "max_completion_tokens") if body.get(name) is not None}
    if len(set(given.values())) > 1:
        raise invalid("max_tokens and max_completion_tokens differ; give one", "max_completion_tokens")
    if not given:
        return default, "max_tokens"
    name, value = next(iter(given.items()))
    if typed(name, value, int) < 1:
        raise invalid(f"{name} must be at least 1 (got {value})", name)
    return value, name


def param_of(message: str, length_field: str) -> str | None:
    """The request field behind an engine SettingsError (whose message starts with the setting's name)."""
    setting = message.removeprefix("unknown ")
    names = {name.replace("_", " "): name for name in GenerationSettings.__dataclass_fields__}
    for spaced in sorted(names, key=len, reverse=True):
        if setting.startswith(spaced + " "):
            return length_field if names[spaced] == "gen_length" else names[spaced]
    return None


def build_settings(body: dict, defaults: GenerationSettings, block_size: int | None = None) -> GenerationSettings:
    max_tokens, length_field = answer_length(body, defaults.gen_length)
    knobs = {name: typed(name, body[name], kind) for name, kind in ENGINE_FIELDS.items() if body.get(name) is not None}
    if knobs.get("top_p") == 1:
        knobs["top_p"] = None  # OpenAI's neutral value: no filter, with any method
    if body.get("temperature") is not None:
        knobs["temperature"] = typed("temperature", body["temperature"], float)
    if body.get("seed") is not None:
        knobs["seed"] = typed("seed", body["seed"], int)
    elif knobs.get("temperature", defaults.temperature) > 0:
        knobs["seed"] = secrets.randbelow(2**31)  # sampled requests without a seed differ, as with OpenAI
    block = knobs.get("block_length")
    if block is None and block_size:  # a block-diffusion model decodes in its own block size only
        if max_tokens % block_size:
            raise invalid(f"{length_field} {max_tokens} is not a multiple of the model's block size {block_size}: "
                          f"use {length_field} {neighbours(max_tokens, block_size)}", length_field)
        knobs["block_length"] = block_size
    elif block is None:
        knobs["block_length"] = block_length_for(max_tokens, defaults.block_length)
    elif block >= 1 and max_tokens % block:
        raise invalid(f"{length_field} {max_tokens} is not a multiple of block_length {block}: with that block "
                      f"length use {length_field} {neighbours(max_tokens, block)}, or leave block_length out and "
                      f"one that divides {length_field} is chosen", length_field)
    settings = defaults.with_overrides(gen_length=max_tokens, **knobs)
    try:
        validate(settings)
    except SettingsError as err:
        raise invalid(str(err), param_of(str(err), length_field)) from None
    return settings


def parse_chat_request(body, defaults: GenerationSettings = GenerationSettings(),
                       block_size: int | None = None) -> ChatRequest:
    """The request as the engine takes it; ApiError (400) for the first field at fault. ``block_size``: the
    loaded model's, when it is a block-diffusion model (block_length defaults to it)."""
    model = check_body(body, OPENAI_FIELDS, NEUTRAL_VALUES)
    messages = parse_messages(body.get("messages"))
    settings, stop, stream, include_usage, n = streamed_settings(body, defaults, block_size)
    return ChatRequest(model, messages, settings, stop, stream, include_usage, n=n)


def parse_text_request(body, defaults: GenerationSettings = GenerationSettings(),
                       block_size: int | None = None) -> ChatRequest:
    """A /v1/completions request: one prompt, decoded as given (no chat template)."""
    model = check_body(body, TEXT_FIELDS, TEXT_NEUTRAL_VALUES)
    prompt = parse_prompt(body.get("prompt"))
    settings, stop, stream, include_usage, n = streamed_settings(body, defaults, block_size)
    return ChatRequest(model, None, settings.with_overrides(use_chat_template=False), stop, stream, include_usage,
                       prompt, n)


def check_body(body, fields, neutral) -> str:
    """The body's model, once its fields are known and its unsupported ones neutral."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", None, "invalid_json")
    check_fields(body, fields, neutral)
    model = body.get("model")
    if model is None:
        raise invalid("model is required (GET /v1/models names the loaded one)", "model", "missing_required_parameter")
    return typed("model", model, str)


def parse_prompt(prompt) -> str | list[int]:
    """A text completion's prompt: a string or its token ids, alone or as the one item of a list."""
    if prompt is None:
        raise invalid("prompt is required", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return utf8(prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise invalid(f"one prompt per request (got {len(prompt)}); send each as its own request", "prompt")
    raise invalid("prompt must be a string, a list of token ids, or a list holding one of them", "prompt")


def streamed_settings(body: dict, defaults: GenerationSettings, block_size: int | None) -> tuple:
    """(settings, stop strings, stream, include_usage, n) of a chat or text completion."""
    n = 1 if body.get("n") is None else typed("n", body["n"], int)
    if not 1 <= n <= MAX_CHOICES:
        raise invalid(f"n must be between 1 and {MAX_CHOICES} (got {n})", "n")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise invalid("stream_options is only allowed when stream is true", "stream_options")
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise invalid("stream_options must be an object such as {\"include_usage\": true}", "stream_options")
    stop = parse_stop(body.get("stop"))
    settings = build_settings(body, defaults, block_size)
    return settings, stop, bool(stream), bool((options or {}).get("include_usage")), n
