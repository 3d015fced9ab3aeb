"""A long chat with the bundled model: the page sends only the last exchanges it was trained to read (issue #22),
says so in the status, and keeps the whole chat on screen and on disk. Other models read all that fits."""
from __future__ import annotations

import pytest
import torch

from flash_dllm.app import handlers
from flash_dllm.app.chats import ChatStore
from flash_dllm.app.models import BUNDLED_HISTORY, LoadOptions, ModelHost, history_exchanges
from flash_dllm.app.turns import OUTPUTS, AppContext, left_out_note
from flash_dllm.engine import Engine, GenerationSettings, SettingsError, hub


def conversation(exchanges: int, system: bool = True) -> list[dict]:
    messages = [{"role": "system", "content": "Be brief."}] if system else []
    for turn in range(exchanges):
        messages += [{"role": "user", "content": f"What is {turn} + 1?"},
                     {"role": "assistant", "content": f"{turn} + 1 = {turn + 1}."}]
    return messages + [{"role": "user", "content": "What is 7 + 8?"}]


@pytest.fixture(scope="module")
def tiny_engine(tiny_llada):
    return Engine.load(str(tiny_llada), device="cpu")


@pytest.fixture
def bundled(tmp_path, monkeypatch):
    """(folder, engine) of the bundled model, on one CPU thread (its answers are checked token for token)."""
    monkeypatch.setenv("FLASH_DLLM_HOME", str(tmp_path / "home"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = str(hub.bundled_model_path())
    yield folder, Engine.load(folder, device="cpu")
    torch.set_num_threads(threads)


@pytest.mark.parametrize("keep", [0, 1, 3])
def test_the_oldest_exchanges_beyond_the_window_are_left_out(tiny_engine, keep):
    chat = conversation(6)
    settings = GenerationSettings(gen_length=32, block_length=32)
    fitted, dropped = tiny_engine.fit_conversation(chat, settings, max_exchanges=keep)
    assert dropped == 2 * (6 - keep)  # whole exchanges: a user message and its answer
    assert fitted == [chat[0]] + chat[1 + dropped:]
    assert fitted[1]["role"] == "user" and sum(m["role"] == "user" for m in fitted) == keep + 1
    no_system = conversation(6, system=False)
    assert tiny_engine.fit_conversation(no_system, settings, max_exchanges=keep)[0] == no_system[dropped:]


def test_a_chat_within_the_window_or_without_one_is_untouched(tiny_engine):
    settings = GenerationSettings(gen_length=32, block_length=32)
    for chat in (conversation(3), conversation(0), conversation(2, system=False)):
        assert tiny_engine.fit_conversation(chat, settings, max_exchanges=3) == (chat, 0)
    long = conversation(6)
    assert tiny_engine.fit_conversation(long, settings) == (long, 0)  # fits the context: all of it
    with pytest.raises(SettingsError, match="at least 0"):
        tiny_engine.fit_conversation(long, settings, max_exchanges=-1)


def test_only_the_bundled_model_has_a_window(tmp_path):
    bundled = hub.bundled_model_path()
    assert bundled is not None and history_exchanges(str(bundled)) == BUNDLED_HISTORY["tiny-chat"] == 3
    assert history_exchanges("tiny-chat") == 3
    impostor = tmp_path / "tiny-chat"
    impostor.mkdir()
    for other in (str(impostor), "GSAI-ML/LLaDA-8B-Instruct", "", None):
        assert history_exchanges(other) is None
    assert left_out_note(0, 3) == left_out_note(0, None) == ""
    assert "reads the last 3 exchanges" in left_out_note(4, 3)
    assert "to fit the model's context" in left_out_note(4, None)


def test_a_long_chat_with_the_bundled_model_is_answered_from_its_last_exchanges(tmp_path, bundled):
    folder, engine = bundled
    ctx = AppContext(ModelHost(engine, LoadOptions(device="cpu"), name=folder), ChatStore(tmp_path / "chats"))
    earlier = conversation(5, system=False)[:-1]
    chat = ctx.store.get_or_create(None, "")
    for message in earlier:
        ctx.store.add_message(chat.id, message["role"], message["content"])
    *_, last = handlers.chat(ctx, "What is 7 + 8?", chat_id=chat.id, method="flash-cache", gen_length=32,
                             block_length=32)
    final = dict(zip(OUTPUTS, last, strict=True))
    assert "the 4 oldest messages were left out (this model reads the last 3 exchanges)" in final["status"]
    kept = ctx.store.get(chat.id).messages
    assert kept[:len(earlier)] == earlier and len(kept) == len(earlier) + 2  # the whole chat stays
    settings = GenerationSettings(method="flash-cache", gen_length=32, block_length=32)
    expected = engine.generate([earlier[4:] + [{"role": "user", "content": "What is 7 + 8?"}]], settings)[0]
    assert kept[-1]["content"] == expected.text  # the answer of the last three exchanges and the question


def test_the_api_applies_the_bundled_models_window_and_says_so(bundled, tiny_engine):
    """An API client sends its whole history; the bundled model reads the last 3 exchanges of it, as on the page,
    and the response says what it left out (headers, and `flash_dllm` of a plain response). A model without a
    window reads everything and the response carries none of this."""
    import httpx

    from flash_dllm.app.api import ApiConfig
    from api_testing import served_api

    folder, engine = bundled
    body = {"model": "tiny-chat", "max_tokens": 32, "method": "flash-cache",
            "messages": conversation(5, system=True)}
    with served_api(ModelHost(engine, name=folder), ApiConfig()) as base_url:
        listed = httpx.get(f"{base_url}/models").json()["data"][0]
        assert listed["history_exchanges"] == 3
        whole = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120)
        assert whole.status_code == 200, whole.text
        assert whole.headers["x-flash-dllm-history-window"] == "3"
        assert whole.headers["x-flash-dllm-messages-left-out"] == "4"
        numbers = whole.json()["flash_dllm"]
        assert numbers["history_window"] == 3 and numbers["messages_left_out"] == 4
        windowed = dict(body, messages=[body["messages"][0]] + body["messages"][5:])
        alone = httpx.post(f"{base_url}/chat/completions", json=windowed, timeout=120)
        assert alone.headers["x-flash-dllm-messages-left-out"] == "0"
        answer = whole.json()["choices"][0]["message"]["content"]
        assert answer == alone.json()["choices"][0]["message"]["content"]
        assert whole.json()["usage"]["prompt_tokens"] == alone.json()["usage"]["prompt_tokens"]
        with httpx.stream("POST", f"{base_url}/chat/completions", json=dict(body, stream=True),
                          timeout=120) as streamed:
            assert streamed.headers["x-flash-dllm-messages-left-out"] == "4"
            assert "[DONE]" in "".join(streamed.iter_text())
    with served_api(ModelHost(tiny_engine, name=tiny_engine.name), ApiConfig()) as base_url:
        other = httpx.post(f"{base_url}/chat/completions", timeout=120,
                           json=dict(body, model=tiny_engine.name, max_tokens=16))
        assert other.status_code == 200, other.text
        assert "x-flash-dllm-history-window" not in other.headers
        assert "messages_left_out" not in other.json()["flash_dllm"]
        assert httpx.get(f"{base_url}/models").json()["data"][0]["history_exchanges"] is None
