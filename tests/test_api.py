"""The OpenAI-compatible API served beside the page (tiny random LLaDA model), through the official `openai`
client and raw HTTP: answers equal the engine's, streams carry committed text in order, errors are OpenAI's."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from api_testing import SubmitSpy, error_of, openai_client, served_api, served_tiny_llada

from flash_dllm.app.api import ApiConfig
from flash_dllm.app.models import ModelHost, display_name
from flash_dllm.engine import Engine, GenerationSettings, hub

openai = pytest.importorskip("openai")  # the dev extra; an image without it skips these tests

SHORT = dict(max_tokens=32)
# ~2 s on one CPU core: a request still decoding when the test acts on it
LONG = dict(max_tokens=384, extra_body={"method": "llada", "block_length": 64})


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with served_tiny_llada(tmp_path_factory) as served:
        yield served


@pytest.fixture()
def client(app):
    return openai_client(app.base_url)


def solo(app, text: str, **settings) -> object:
    """The engine's own answer to one user message, decoded alone."""
    values = {"gen_length": 32, "block_length": 32, **settings}
    return app.engine.generate([[{"role": "user", "content": text}]], GenerationSettings(**values))[0]


def messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_lists_the_loaded_model(app, client):
    assert [m.id for m in client.models.list().data] == [app.model]
    assert client.models.retrieve(app.model).id == app.model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_a_completion_is_the_engines_answer(app, client):
    reference = solo(app, "Hello there")
    answer = client.chat.completions.create(model=app.model, messages=messages("Hello there"), **SHORT)
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == reference.text
    assert choice.finish_reason == ("stop" if reference.finish_reason == "eos" else "length")
    assert answer.usage.prompt_tokens == reference.prompt_tokens
    assert answer.usage.completion_tokens == len(reference.token_ids) == 32
    assert answer.usage.total_tokens == reference.prompt_tokens + 32
    assert answer.model == app.model and answer.id.startswith("chatcmpl-")
    assert answer.model_extra["flash_dllm"]["forward_passes"] == reference.forward_passes


def test_the_model_may_be_named_by_the_name_it_was_loaded_by(app, client):
    answer = client.chat.completions.create(model=app.ctx.host.name, messages=messages("hi"), max_tokens=8)
    assert answer.choices[0].message.content == solo(app, "hi", gen_length=8, block_length=8).text


def test_a_stream_carries_the_committed_prefix_in_order_then_finish_and_usage(app, client):
    reference = solo(app, "Stream this please", gen_length=64)
    chunks = list(client.chat.completions.create(model=app.model, messages=messages("Stream this please"),
                                                 max_tokens=64, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == reference.text
    assert len(texts) >= 3, texts  # the text arrives as it commits, not at the end
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 64
    assert chunks[-1].usage.prompt_tokens == reference.prompt_tokens
    # the engine's numbers ride on the usage chunk, as a completion's flash_dllm
    numbers = chunks[-1].model_extra["flash_dllm"]
    assert numbers["forward_passes"] == reference.forward_passes and numbers["steps"] == reference.steps
    assert all("flash_dllm" not in (c.model_extra or {}) for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_raw_sse_chunks_end_with_finish_usage_and_done(app, monkeypatch):
    spy = SubmitSpy(app.engine, monkeypatch)
    body = {"model": app.model, "messages": messages("order matters"), "max_tokens": 64, "stream": True}
    with httpx.stream("POST", app.base_url + "/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    data = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(d["object"] == "chat.completion.chunk" and len(d["choices"]) == 1 for d in data)
    # without stream_options.include_usage the usage rides on the one finishing chunk
    assert [d["choices"][0]["finish_reason"] for d in data] == [None] * (len(data) - 1) + ["length"]
    assert data[-1]["usage"]["completion_tokens"] == 64 and all("usage" not in d for d in data[:-1])
    assert data[-1]["flash_dllm"]["forward_passes"] == spy.requests[0].result(10).forward_passes
    assert all("flash_dllm" not in d for d in data[:-1])
    sent = "".join(d["choices"][0]["delta"].get("content", "") for d in data)
    assert sent == spy.requests[0].result(10).text


def test_max_tokens_is_the_answer_length_exactly(app, client):
    for n in (1, 7, 50):  # 7 and 50 do not divide the default block length: the block length follows them
        answer = client.chat.completions.create(model=app.model, messages=messages("count"), max_tokens=n)
        assert answer.usage.completion_tokens == n and answer.choices[0].finish_reason == "length"
        assert answer.choices[0].message.content == solo(app, "count", gen_length=n, block_length=n).text


def test_engine_knobs_travel_as_extra_body_fields(app, client):
    knobs = dict(method="fast-dllm", threshold=0.5, block_length=16)
    answer = client.chat.completions.create(model=app.model, messages=messages("knobs"), max_tokens=32,
                                            extra_body=knobs)
    reference = solo(app, "knobs", **knobs)
    assert answer.choices[0].message.content == reference.text
    assert answer.model_extra["flash_dllm"]["method"] == "fast-dllm"
    assert answer.model_extra["flash_dllm"]["steps"] == reference.steps


def assert_engine_numbers(numbers: dict, like: dict, completion_tokens: int) -> None:
    """``flash_dllm`` has the keys (and value types) of ``like`` (a finished answer's) and sane values."""
    assert set(numbers) == set(like) and all(type(numbers[k]) is type(like[k]) for k in like), (numbers, like)
    assert numbers["steps"] >= 1 and numbers["forward_passes"] >= 1 and numbers["elapsed_s"] > 0
    assert isinstance(numbers["kernels"], str) and numbers["kernels"] == like["kernels"]
    assert numbers["tokens_per_forward"] == round(completion_tokens / numbers["forward_passes"], 3)
    if completion_tokens:
        assert numbers["tokens_per_forward"] > 0 and numbers["tokens_per_s"] > 0


def test_a_stop_string_cuts_the_answer_and_finishes_with_stop(app, client):
    text = solo(app, "stop me", gen_length=64).text
    stop = text[20:23]
    expected = text[:text.index(stop)]
    full = client.chat.completions.create(model=app.model, messages=messages("stop me"), max_tokens=64)
    assert full.choices[0].message.content == text  # the same request without a stop string: the whole answer
    whole = full.model_extra["flash_dllm"]
    for stream in (False, True):
        answer = client.chat.completions.create(model=app.model, messages=messages("stop me"), max_tokens=64,
                                                stop=[stop, "never there"], stream=stream)
        if stream:
            chunks = list(answer)
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            usage, numbers = chunks[-1].usage, chunks[-1].model_extra["flash_dllm"]
            assert all("flash_dllm" not in (c.model_extra or {}) for c in chunks[:-1])
        else:
            content, reason, usage = answer.choices[0].message.content, [answer.choices[0].finish_reason], answer.usage
            numbers = answer.model_extra["flash_dllm"]
        assert content == expected and reason == ["stop"] and usage.completion_tokens < 64
        # the engine's numbers, as a finished answer carries them: from the steps decoded before the cut
        assert_engine_numbers(numbers, whole, usage.completion_tokens)
        assert numbers["steps"] <= whole["steps"] and numbers["forward_passes"] <= whole["forward_passes"]


def cut_at_a_token(ids: list[int], decode) -> tuple[int, str]:
    """(k, stop): a stop string made of whole tokens ids[k:k+n] that first shows up in the answer right after
    its first k tokens (whose last one has text of its own), so the answer returned is exactly those k."""
    text = decode(ids)
    for k in range(12, len(ids) - 3):
        before = decode(ids[:k])
        for n in range(3, 9):
            stop = decode(ids[k:k + n])
            if (len(stop) == n and "\ufffd" not in stop and text.startswith(before + stop)
                    and text.index(stop) == len(before) and decode(ids[:k - 1]) != before):
                return k, stop
    raise AssertionError(f"no stop string to cut {text!r} at")


@pytest.mark.parametrize("settings", [{}, {"method": "llada", "block_length": 64}], ids=["default", "llada"])
def test_a_cut_answer_counts_the_tokens_returned_streamed_or_not(app, client, settings):
    # diffusion commits out of order: when the stop string shows up, cells after it are often committed already;
    # completion_tokens (and the rates beside it) count the k tokens returned only, not the stop string's
    reference = solo(app, "count my tokens", gen_length=64, **settings)
    k, stop = cut_at_a_token(reference.token_ids, app.engine.tokenizer.decode)
    expected = app.engine.tokenizer.decode(reference.token_ids[:k])
    extra = {"extra_body": settings} if settings else {}
    ask = dict(model=app.model, messages=messages("count my tokens"), max_tokens=64, stop=[stop], **extra)
    plain = client.chat.completions.create(**ask)
    answers = [(plain.choices[0].message.content, plain.usage, plain.model_extra["flash_dllm"])]
    for include_usage in (False, True):
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": include_usage},
                                                     **ask))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        answers.append((content, chunks[-1].usage, chunks[-1].model_extra["flash_dllm"]))
    for content, usage, numbers in answers:
        assert content == expected and usage.completion_tokens == k, (k, usage, content)
        assert usage.total_tokens == usage.prompt_tokens + k == reference.prompt_tokens + k
        assert numbers["tokens_per_forward"] == round(k / numbers["forward_passes"], 3)
        assert numbers["tokens_per_s"] == pytest.approx(k / numbers["elapsed_s"], rel=0.01)


def test_sampling_follows_temperature_and_seed(app, client):
    def ask(**fields):
        return client.chat.completions.create(model=app.model, messages=messages("sample"), max_tokens=32,
                                              **fields).choices[0].message.content
    assert ask(temperature=1.0, seed=3) == ask(temperature=1.0, seed=3) == solo(app, "sample", temperature=1.0,
                                                                                   seed=3).text
    assert ask(temperature=1.0, seed=3) != ask(temperature=1.0, seed=4)


def test_a_closed_stream_cancels_its_engine_request(app, monkeypatch):
    spy = SubmitSpy(app.engine, monkeypatch)
    body = {"model": app.model, "messages": messages("a long answer"), "max_tokens": 384, "method": "llada",
            "block_length": 64, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", app.base_url + "/chat/completions", json=body) as response:
            first = next(response.iter_lines())
            assert first.startswith("data: ")
            deadline = time.time() + 30
            while spy.requests[0].generated_tokens == 0 and time.time() < deadline:
                time.sleep(0.01)  # decoding has begun
    result = spy.requests[0].result(30)  # the client closed the connection above
    assert result.finish_reason == "cancelled" and len(result.token_ids) < 384
    assert app.engine.requests_in_flight() == []


def test_a_client_that_leaves_a_plain_request_cancels_it(app, monkeypatch):
    spy = SubmitSpy(app.engine, monkeypatch)
    body = {"model": app.model, "messages": messages("gone"), "max_tokens": 384, "method": "llada",
            "block_length": 64}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(app.base_url + "/chat/completions", json=body, timeout=0.8)
    assert spy.requests[0].result(30).finish_reason == "cancelled"


def test_the_page_lists_api_requests_in_flight(app, monkeypatch):
    from flash_dllm.app.inflight import inflight_html

    spy = SubmitSpy(app.engine, monkeypatch)
    client = openai_client(app.base_url)

    def ask():
        with pytest.raises(openai.InternalServerError, match="cancelled"):  # 503: cancelled below
            client.chat.completions.create(model=app.model, messages=messages("listed"), **LONG)
    worker = threading.Thread(target=ask)
    worker.start()
    try:
        deadline = time.time() + 30
        while not spy.requests and time.time() < deadline:
            time.sleep(0.01)
        table = inflight_html(app.ctx)
        assert f"<td>{spy.requests[0].id}</td><td>API</td>" in table and "/ 384" in table
    finally:
        spy.requests[0].cancel()
        worker.join(30)
    assert "None: the engine is idle" in inflight_html(app.ctx)


def test_an_api_request_beside_the_page(app):
    """The page's chat and the API use one engine: a page chat still answers, and its row is labelled."""
    from gradio_client import Client

    page = Client(app.url, verbose=False)
    outputs = page.predict(message="from the page", gen_length=32, block_length=32, api_name="/chat")
    assert "Done." in outputs[7]
    assert set(app.ctx.host.request_labels.values()) <= {"page", "API"}


def test_the_key_is_enforced_when_set(app):
    host = ModelHost(app.engine, name=app.ctx.host.name)
    with served_api(host, ApiConfig(key="sekrit-key")) as base_url:
        missing = httpx.get(base_url + "/models", timeout=30)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert "no API key" in error_of(missing)["message"]
        wrong = httpx.get(base_url + "/models", headers={"Authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 401 and error_of(wrong)["code"] == "invalid_api_key"
        assert "nope" not in wrong.text
        unknown_route = httpx.get(base_url + "/secret-route", timeout=30)
        assert unknown_route.status_code == 401  # nothing, not even which routes exist, without the key
        with pytest.raises(openai.AuthenticationError):
            openai_client(base_url, "wrong").chat.completions.create(model=app.model, messages=messages("x"))
        answer = openai_client(base_url, "sekrit-key").chat.completions.create(
            model=app.model, messages=messages("Hello there"), **SHORT)
        assert answer.choices[0].message.content == solo(app, "Hello there").text


@pytest.mark.parametrize("loaded_by", ["folder", "bundled", "tiny-chat"])
def test_the_bundled_model_answers_to_the_names_the_cli_takes_for_it(loaded_by):
    """`flash-dllm-chat --model bundled` (or tiny-chat, or no --model: its folder) serves tiny-chat; /v1/models
    and the answers name it tiny-chat whichever name loaded it, and a client may name it by that id or by any of
    those names. Another model (or the other bundled model's name) still gets model_not_found."""
    folder = hub.bundled_model_path()
    assert folder is not None and folder.name == "tiny-chat", "the bundled model is missing from the package"
    name = str(folder) if loaded_by == "folder" else loaded_by
    host = ModelHost(Engine.load(name, device="cpu"), name=name)
    with served_api(host, ApiConfig()) as base_url:
        listed = httpx.get(base_url + "/models", timeout=30).json()["data"]
        assert [entry["id"] for entry in listed] == ["tiny-chat"]
        assert listed[0]["history_exchanges"] == 3  # tiny-chat's short-history rule, whichever name loaded it
        for model in (display_name(name), name, "bundled", "tiny-chat", str(folder)):
            if "/" not in model:  # a folder is no URL segment; the body may name it
                assert httpx.get(f"{base_url}/models/{model}", timeout=30).json()["id"] == "tiny-chat"
            answer = httpx.post(base_url + "/chat/completions", timeout=120,
                                json={"model": model, "messages": messages("What is 2 + 3?"), "max_tokens": 8})
            assert answer.status_code == 200, (model, answer.text)
            assert answer.json()["model"] == "tiny-chat"
        for model in ("gpt-4o", "tiny-cpu", "Bundled"):
            refused = httpx.post(base_url + "/chat/completions", timeout=30,
                                 json={"model": model, "messages": messages("hi"), "max_tokens": 8})
            error = error_of(refused)
            assert (refused.status_code, error["code"], error["param"]) == (404, "model_not_found", "model"), error
            assert "'tiny-chat'" in error["message"]
            assert httpx.get(f"{base_url}/models/{model}", timeout=30).status_code == 404


def test_bundled_names_only_the_default_bundled_model(app):
    """`bundled` is tiny-chat's alias: the other bundled model (tiny-cpu) and any other model do not take it;
    tiny-cpu loaded by its name answers to its folder too, as the CLI (and `flash-dllm-chat models`) names it."""
    tiny_cpu = hub.bundled_model_path().parent / "tiny-cpu"
    for host in (ModelHost(Engine.load(str(tiny_cpu), device="cpu"), name=str(tiny_cpu)),
                 ModelHost(app.engine, name=app.ctx.host.name)):
        with served_api(host, ApiConfig()) as base_url:
            refused = httpx.post(base_url + "/chat/completions", timeout=30,
                                 json={"model": "bundled", "messages": messages("hi"), "max_tokens": 8})
            assert refused.status_code == 404 and error_of(refused)["code"] == "model_not_found"
    tiny_cpu_host = ModelHost(Engine.load("tiny-cpu", device="cpu"), name="tiny-cpu")
    with served_api(tiny_cpu_host, ApiConfig()) as base_url:
        answer = httpx.post(base_url + "/chat/completions", timeout=120,
                            json={"model": str(tiny_cpu), "messages": messages("hi"), "max_tokens": 8})
        assert answer.status_code == 200, answer.text
