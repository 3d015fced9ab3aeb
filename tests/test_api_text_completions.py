"""POST /v1/completions (tiny random LLaDA model): one raw prompt, text or token ids, decoded without the chat
template, through the official `openai` client and raw HTTP; the answer, the stream and the errors are those of a
chat completion in OpenAI's text_completion shape."""
from __future__ import annotations

import json

import httpx
import pytest
from api_testing import error_of, openai_client, post, served_tiny_llada

from flash_dllm.engine import GenerationSettings

openai = pytest.importorskip("openai")  # the dev extra; an image without it skips these tests


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with served_tiny_llada(tmp_path_factory) as served:
        yield served


@pytest.fixture()
def client(app):
    return openai_client(app.base_url)


def raw(app, prompt, **settings):
    """The engine's own answer to ``prompt`` as given (no chat template)."""
    values = {"gen_length": 32, "block_length": 32, "use_chat_template": False, **settings}
    return app.engine.generate([prompt], GenerationSettings(**values))[0]


def test_a_text_completion_is_the_engines_answer_to_the_raw_prompt(app, client):
    reference = raw(app, "Once upon a time")
    templated = app.engine.generate([[{"role": "user", "content": "Once upon a time"}]],
                                    GenerationSettings(gen_length=32, block_length=32))[0]
    assert reference.prompt_tokens < templated.prompt_tokens  # the chat template is not applied
    answer = client.completions.create(model=app.model, prompt="Once upon a time", max_tokens=32)
    assert answer.object == "text_completion" and answer.id.startswith("cmpl-") and answer.model == app.model
    choice = answer.choices[0]
    assert choice.text == reference.text and choice.index == 0
    assert choice.finish_reason == ("stop" if reference.finish_reason == "eos" else "length")
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (reference.prompt_tokens, 32)
    assert answer.model_extra["flash_dllm"]["forward_passes"] == reference.forward_passes


@pytest.mark.parametrize("as_list", [False, True])
def test_token_ids_are_a_prompt_too(app, client, as_list):
    ids = [3, 14, 15, 9, 26]
    reference = raw(app, ids, gen_length=16, block_length=16)
    answer = client.completions.create(model=app.model, prompt=[ids] if as_list else ids, max_tokens=16)
    assert answer.choices[0].text == reference.text and answer.usage.prompt_tokens == len(ids)


def test_a_text_stream_carries_the_committed_text_in_order(app, client):
    reference = raw(app, "Stream a story", gen_length=64)
    chunks = list(client.completions.create(model=app.model, prompt="Stream a story", max_tokens=64, stream=True,
                                            stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks) and len({c.id for c in chunks}) == 1
    texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert "".join(texts) == reference.text and len(texts) >= 3, texts
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 64
    assert chunks[-1].model_extra["flash_dllm"]["steps"] == reference.steps


def test_raw_text_sse_ends_with_finish_usage_and_done(app):
    body = {"model": app.model, "prompt": "order", "max_tokens": 32, "stream": True, "stop": ["zzzz"]}
    with httpx.stream("POST", app.base_url + "/completions", json=body, timeout=120) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    data = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(d["object"] == "text_completion" and set(d["choices"][0]) == {"text", "index", "logprobs",
                                                                              "finish_reason"} for d in data)
    assert data[-1]["choices"][0]["finish_reason"] == "length" and data[-1]["usage"]["completion_tokens"] == 32
    assert "".join(d["choices"][0]["text"] for d in data) == raw(app, "order").text


def test_a_stop_string_cuts_a_text_completion(app, client):
    text = raw(app, "stop here", gen_length=64).text
    stop = text[20:23]
    answer = client.completions.create(model=app.model, prompt="stop here", max_tokens=64, stop=stop)
    assert answer.choices[0].text == text[:text.index(stop)] and answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("fields, param, words", [
    (dict(prompt=None), "prompt", "prompt is required"),
    (dict(prompt=["a", "b"]), "prompt", "one prompt per request (got 2)"),
    (dict(prompt=""), "prompt", "empty"),
    (dict(prompt=[1, 2, 10**9]), "prompt", "token ids must lie in"),
    (dict(prompt=[1.5]), "prompt", "a string, a list of token ids"),
    (dict(echo=True), "echo", "not supported"),
    (dict(best_of=3), "best_of", "not supported"),
    (dict(messages=[{"role": "user", "content": "hi"}]), "messages", "Unrecognized"),
    (dict(max_tokens=0), "max_tokens", "at least 1"),
    (dict(top_p=0.5), "top_p", "filters method dream"),
])
def test_bad_text_requests_are_refused_by_name(app, fields, param, words):
    body = {k: v for k, v in {"model": app.model, "prompt": "hi", **fields}.items() if v is not None}
    response = post(app.base_url, "/completions", json=body)
    error = error_of(response)
    assert response.status_code == 400 and error["param"] == param and words in error["message"], error
    assert error["code"] != "context_length_exceeded"  # a malformed prompt is not a long one


def test_an_unknown_route_names_both_completions(app):
    error = error_of(post(app.base_url, "/embeddings", json={}))
    assert "POST /v1/completions" in error["message"] and "POST /v1/chat/completions" in error["message"]
