"""``n`` choices through the API (tiny random LLaDA model): at temperature 0 one engine request answers every
choice; sampled, each choice is its own request seeded seed + i and equals that request decoded alone; streams
interleave the choices by index; usage counts the prompt once and every choice's tokens."""
from __future__ import annotations

import json

import httpx
import pytest
from api_testing import SubmitSpy, openai_client, served_tiny_llada

from flash_dllm.engine import GenerationSettings

openai = pytest.importorskip("openai")  # the dev extra; an image without it skips these tests


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with served_tiny_llada(tmp_path_factory) as served:
        yield served


def alone(app, prompt, **settings):
    values = {"gen_length": 16, "block_length": 16, **settings}
    return app.engine.generate([prompt], GenerationSettings(**values))[0]


def test_greedy_choices_are_one_engine_request(app, monkeypatch):
    spy = SubmitSpy(app.engine, monkeypatch)
    user = [{"role": "user", "content": "same thrice"}]
    answer = openai_client(app.base_url).chat.completions.create(model=app.model, messages=user, max_tokens=16, n=3)
    reference = alone(app, user)
    assert [c.index for c in answer.choices] == [0, 1, 2] and len(spy.requests) == 1
    assert all(c.message.content == reference.text for c in answer.choices)
    assert answer.usage.prompt_tokens == reference.prompt_tokens and answer.usage.completion_tokens == 3 * 16
    per_choice = answer.model_extra["flash_dllm"]["choices"]
    assert len(per_choice) == 3 and per_choice[0]["forward_passes"] == reference.forward_passes


def test_sampled_choices_follow_the_seed_and_each_equals_its_request_alone(app, monkeypatch):
    spy = SubmitSpy(app.engine, monkeypatch)
    user = [{"role": "user", "content": "sample me"}]
    answer = openai_client(app.base_url).chat.completions.create(model=app.model, messages=user, max_tokens=16, n=3,
                                                                  temperature=0.9, seed=5)
    references = [alone(app, user, temperature=0.9, seed=5 + i) for i in range(3)]
    assert len(spy.requests) == 3
    assert [c.message.content for c in answer.choices] == [r.text for r in references]
    assert len({r.text for r in references}) > 1  # the seeds differ, so do the answers (the test means something)
    assert answer.usage.completion_tokens == sum(len(r.token_ids) for r in references)


def test_a_stream_of_choices_interleaves_them_by_index(app):
    body = {"model": app.model, "messages": [{"role": "user", "content": "stream two"}], "max_tokens": 32, "n": 2,
            "temperature": 0.9, "seed": 11, "stream": True}
    with httpx.stream("POST", app.base_url + "/chat/completions", json=body, timeout=120) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    data = [json.loads(line[6:]) for line in lines[:-1]]
    *chunks, last = data
    assert all(d["choices"] for d in data)  # no usage-only chunk unless asked for: usage rides on the last finish
    assert last["choices"][0]["index"] == 1 and last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 64 and len(last["flash_dllm"]["choices"]) == 2
    chunks.append({**last, "usage": None})
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        reference = alone(app, [{"role": "user", "content": "stream two"}], gen_length=32, block_length=32,
                          temperature=0.9, seed=11 + index)
        assert "".join(c["delta"].get("content", "") for c in mine) == reference.text
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]


def test_asked_for_usage_a_stream_of_choices_ends_with_the_usage_chunk(app):
    chunks = list(openai_client(app.base_url).chat.completions.create(
        model=app.model, messages=[{"role": "user", "content": "usage"}], max_tokens=16, n=2, temperature=0.9,
        seed=1, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 32
    finishes = sorted(c.choices[0].index for c in chunks[:-1] if c.choices[0].finish_reason)
    assert finishes == [0, 1] and all(c.usage is None for c in chunks[:-1])


def test_text_completions_take_n_too(app):
    client = openai_client(app.base_url)
    answer = client.completions.create(model=app.model, prompt="two stories", max_tokens=16, n=2, temperature=0.9,
                                       seed=3)
    references = [alone(app, "two stories", temperature=0.9, seed=3 + i, use_chat_template=False) for i in range(2)]
    assert [c.text for c in answer.choices] == [r.text for r in references] and [c.index for c in answer.choices] == [0, 1]
