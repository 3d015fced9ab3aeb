"""Many requests at once on the bundled model: 16 API requests (streamed and not, different lengths and
methods) and the page's `chat` endpoint, all together, each return exactly the greedy answer the engine gives
the same request decoded alone. Holds however the engine schedules them (one at a time or batched)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from api_testing import openai_client, served_app

from flash_dllm.app.openai_request import block_length_for
from flash_dllm.app.presets import build_settings, default_knobs
from flash_dllm.engine import GenerationSettings, hub

pytest.importorskip("openai")  # the dev extra; an image without it skips these tests

N_API = 16
METHODS = ("flash-cache", "flash-verify", "fast-dllm", "flash-cache")
LENGTHS = (32, 48, 16, 64)
PAGE_PROMPT = "Hello! Who are you?"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    bundled = hub.bundled_model_path()
    assert bundled is not None, "the bundled model is missing from the package"
    with served_app(bundled, tmp_path_factory.mktemp("home")) as served:
        yield served


def api_request(i: int) -> dict:
    return {"prompt": f"What is {i} + {i + 3}?" if i % 2 else f"Reverse the list: {i} {i + 1} {i + 2}",
            "max_tokens": LENGTHS[i % len(LENGTHS)], "method": METHODS[(i // 4) % len(METHODS)], "stream": i % 3 == 0}


def solo_text(engine, prompt: str, settings: GenerationSettings) -> str:
    return engine.generate([[{"role": "user", "content": prompt}]], settings)[0].text


def page_settings() -> GenerationSettings:
    knobs = {**default_knobs(), "gen_length": 32, "block_length": 32}
    return build_settings(GenerationSettings().method, **knobs)


def ask_api(app, spec: dict) -> str:
    client = openai_client(app.base_url)
    answer = client.chat.completions.create(model=app.model, messages=[{"role": "user", "content": spec["prompt"]}],
                                            max_tokens=spec["max_tokens"], temperature=0, stream=spec["stream"],
                                            extra_body={"method": spec["method"]})
    if spec["stream"]:
        return "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    return answer.choices[0].message.content


def ask_page(app) -> str:
    from gradio_client import Client

    outputs = Client(app.url, verbose=False).predict(message=PAGE_PROMPT, gen_length=32, block_length=32,
                                                     api_name="/chat")
    assert "Done." in outputs[7], outputs[7]
    chat = next(c for c in app.ctx.store.list() if c.messages and c.messages[0]["content"] == PAGE_PROMPT)
    return chat.messages[-1]["content"]


def test_16_api_requests_and_a_page_chat_at_once_equal_their_solo_answers(app):
    specs = [api_request(i) for i in range(N_API)]
    expected = []
    for spec in specs:  # one after another, before anything else runs
        settings = GenerationSettings(gen_length=spec["max_tokens"], method=spec["method"],
                                      block_length=block_length_for(spec["max_tokens"], 32))
        expected.append(solo_text(app.engine, spec["prompt"], settings))
    expected_page = solo_text(app.engine, PAGE_PROMPT, page_settings())
    assert len(set(expected)) > 4  # different prompts, different answers: a mix-up would show
    with ThreadPoolExecutor(N_API + 1) as pool:
        page = pool.submit(ask_page, app)
        answers = list(pool.map(lambda spec: ask_api(app, spec), specs))
        page_answer = page.result(timeout=300)
    mismatches = [(i, a, e) for i, (a, e) in enumerate(zip(answers, expected)) if a != e]
    assert not mismatches, mismatches
    assert page_answer == expected_page
    assert app.engine.requests_in_flight() == []


def test_the_bundled_model_ends_its_answer_with_stop(app):
    client = openai_client(app.base_url)
    answer = client.chat.completions.create(model=app.model, messages=[{"role": "user", "content": "hello"}],
                                            max_tokens=64)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and answer.usage.completion_tokens < 64 and choice.message.content
