"""Bad requests to the API each get an OpenAI-shaped error body and the right status code; the engine's
failures become one line, never a traceback; a model switch waits for API requests, which wait for it."""
from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from api_testing import error_of, openai_client, post, served_tiny_llada

from flash_dllm.app.models import ModelBusy, ModelHost
from flash_dllm.engine import Engine

openai = pytest.importorskip("openai")  # the dev extra; an image without it skips these tests


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with served_tiny_llada(tmp_path_factory) as served:
        yield served


def ask(app, **fields) -> dict:
    return {"model": app.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **fields}


def raw(app, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """A request as any HTTP client may send it (no JSON encoding of ours, any Host/Origin)."""
    port = int(app.base_url.rsplit(":", 1)[1].split("/")[0])
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read() or b"null")
    finally:
        connection.close()


# (name, request, status, error code, param, words in the message)
CASES = [
    ("bad JSON", dict(content=b"{not json"), 400, "invalid_json", None, "not valid JSON"),
    ("a list for a body", dict(json=[1, 2]), 400, "invalid_json", None, "JSON object"),
    ("no messages", dict(json={"model": "MODEL"}), 400, "missing_required_parameter", "messages", "required"),
    ("empty messages", dict(json={"model": "MODEL", "messages": []}), 400, "invalid_value", "messages", "non-empty"),
    ("empty prompt", dict(json={"model": "MODEL", "messages": [{"role": "user", "content": "  "}]}), 400,
     "invalid_value", "messages", "empty"),
    ("unknown method", dict(fields={"method": "beam-search"}), 400, "invalid_value", "method", "flash-cache"),
    ("threshold out of range", dict(fields={"threshold": 1.5}), 400, "invalid_value", "threshold", "(0, 1]"),
    ("misspelt knob", dict(fields={"treshold": 0.5}), 400, "unknown_parameter", "treshold", "treshold"),
    ("n over the limit", dict(fields={"n": 9}), 400, "invalid_value", "n", "n must be between 1 and 8 (got 9)"),
    ("block length that does not divide", dict(fields={"max_tokens": 30, "block_length": 16}), 400,
     "invalid_value", "max_tokens", "16 or 32"),
    ("prompt over the context", dict(json={"model": "MODEL", "messages": [{"role": "user", "content": "x" * 3000}]}),
     400, "context_length_exceeded", "messages", "context of 512"),
    ("answer over the context", dict(fields={"max_tokens": 600}), 400, "context_length_exceeded", "messages",
     "exceeds"),
    ("another model", dict(fields={"model": "gpt-4o"}), 404, "model_not_found", "model", "'MODEL'"),
    ("lone surrogate", dict(content=b'{"model": "MODEL", "messages": [{"role": "user", "content": "\\ud800"}]}'),
     400, "invalid_value", "messages[0].content", "surrogate"),
]


@pytest.mark.parametrize("name, request_, status, code, param, words", CASES, ids=[c[0] for c in CASES])
def test_bad_requests_get_openai_errors(app, name, request_, status, code, param, words):
    if "fields" in request_:
        kwargs = {"json": ask(app, **request_["fields"])}
    elif "json" in request_:
        kwargs = {"json": json.loads(json.dumps(request_["json"]).replace("MODEL", app.model))}
    else:
        kwargs = {"content": request_["content"].replace(b"MODEL", app.model.encode()),
                  "headers": {"content-type": "application/json"}}
    response = post(app.base_url, "/chat/completions", **kwargs)
    error = error_of(response)
    assert (response.status_code, error["code"], error["param"]) == (status, code, param), error
    assert words.replace("MODEL", app.model) in error["message"], error
    assert app.engine.requests_in_flight() == []  # nothing was queued


def test_routes_methods_and_the_guard_answer_in_openai_shape(app):
    status, _, body = raw(app, "GET", "/v1/chat/completions")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    status, _, body = raw(app, "POST", "/v1/embeddings", b"{}")
    assert status == 404 and body["error"]["code"] == "unknown_url" and "/v1/chat/completions" in body["error"]["message"]
    status, _, body = raw(app, "GET", "/v1/models", headers={"Host": "evil.example"})
    assert status == 421 and body["error"]["code"] == "host_not_allowed"  # DNS rebinding
    status, _, body = raw(app, "POST", "/v1/chat/completions", json.dumps(ask(app)).encode(),
                          {"Origin": "http://localhost:3000", "Content-Type": "application/json"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"  # another local page's script
    status, _, body = raw(app, "GET", "/v1/models", headers={"Host": "localhost"})
    assert status == 200 and body["data"][0]["id"] == app.model  # scripts on this machine


def test_a_body_over_the_limit_is_413(app, monkeypatch):
    monkeypatch.setattr(app.chat_api.config, "max_body_bytes", 1000)
    response = post(app.base_url, "/chat/completions", json=ask(app, user="x" * 2000))
    assert response.status_code == 413 and error_of(response)["code"] == "body_too_large"


def test_a_full_engine_answers_503_with_retry_after(app, monkeypatch):
    monkeypatch.setattr(app.chat_api.config, "max_in_flight", 0)
    response = post(app.base_url, "/chat/completions", json=ask(app))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert error_of(response)["code"] == "engine_overloaded"
    with pytest.raises(openai.InternalServerError):
        openai_client(app.base_url).chat.completions.create(**ask(app))


def test_an_engine_failure_is_a_500_of_one_line(app, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("kernel exploded\n  at line 3")
    import flash_dllm.engine.decode_loop as decode_loop

    monkeypatch.setattr(decode_loop, "forward_cached", explode)  # inside the scheduler's step
    response = post(app.base_url, "/chat/completions", json=ask(app))
    error = error_of(response)
    assert response.status_code == 500 and error["message"] == "RuntimeError: kernel exploded at line 3"
    with pytest.raises(openai.APIError, match="kernel exploded"):  # in a stream: an error event, then the end
        list(openai_client(app.base_url).chat.completions.create(**ask(app), stream=True))
    monkeypatch.undo()
    assert post(app.base_url, "/chat/completions", json=ask(app)).status_code == 200  # the engine recovered


def test_the_model_is_named_in_the_404(app):
    with pytest.raises(openai.NotFoundError) as refused:
        openai_client(app.base_url).chat.completions.create(**ask(app, model="llama3"))
    assert f"'{app.model}'" in str(refused.value) and "'llama3'" in str(refused.value)


def test_a_switch_waits_for_api_requests_and_refuses_new_ones_meanwhile(app, tiny_dream):
    host = ModelHost(Engine.load(str(app.ctx.host.name), device="cpu"), name="first")
    lease = host.lease()
    switch = threading.Thread(target=host.load_folder, args=(tiny_dream, "second"))
    switch.start()
    time.sleep(0.5)
    try:
        assert switch.is_alive() and host.name == "first"  # the lent engine is still in use
        with pytest.raises(ModelBusy, match="being switched"):
            host.lease()
    finally:
        lease.release()
        lease.release()  # idempotent
    switch.join(60)
    assert host.name == "second" and host.lease().engine.describe()["family"] == "dream"
