"""The commands that serve the API, run as a user runs them: `flash-dllm-chat serve` (API only) and the app
(page + API), each with a key from the environment or generated because others can reach it."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from api_testing import free_port, openai_client
from process_testing import interruptible

from flash_dllm.app.launch import LaunchError, serve

pytest.importorskip("openai")  # the dev extra; an image without it skips these tests


def start(argv: list[str], env: dict, ready: str, timeout: float = 120.0):
    """The command as a child process, and its output up to the line containing ``ready``."""
    command = [sys.executable, "-c", "from flash_dllm.app.cli import main; raise SystemExit(main())", *argv]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=interruptible)
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if ready in line:
            break
    return process, "".join(lines)


def stop(process: subprocess.Popen, output: str) -> int:
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("still running 30 s after Ctrl-C:\n" + output + process.stdout.read())


def environment(tmp_path, **extra) -> dict:
    env = dict(os.environ, FLASH_DLLM_HOME=str(tmp_path / "home"), **extra)
    env.pop("FLASH_DLLM_API_KEY", None)
    env.update(extra)
    return env


def test_serve_answers_with_the_key_from_the_environment(tiny_llada, tmp_path):
    port = free_port()
    env = environment(tmp_path, FLASH_DLLM_API_KEY="env-key-123")
    process, output = start(["serve", "--model", str(tiny_llada), "--port", str(port), "--device", "cpu"], env,
                            "Serving")
    try:
        assert f"at http://127.0.0.1:{port}/v1" in output and "API key required" in output, output
        assert "env-key-123" not in output  # a key that was given is never printed
        base = f"http://127.0.0.1:{port}/v1"
        assert httpx.get(base + "/models", timeout=30).status_code == 401
        client = openai_client(base, "env-key-123")
        model = client.models.list().data[0].id
        assert model == tiny_llada.name
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=16)
        assert answer.usage.completion_tokens == 16 and answer.choices[0].finish_reason == "length"
        streamed = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=16, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
            answer.choices[0].message.content
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code in (401, 404)  # no page here
    finally:
        code = stop(process, output)
    assert code == 0


def test_the_app_reachable_from_the_network_generates_and_prints_a_key(tiny_llada, tmp_path):
    port = free_port()
    process, output = start(["--model", str(tiny_llada), "--no-browser", "--host", "0.0.0.0", "--port", str(port)],
                            environment(tmp_path), "OpenAI-compatible API at")
    try:
        found = re.search(r"API key \(generated[^)]*\): (\S+)", output)
        assert found, output
        key = found.group(1)
        base = f"http://127.0.0.1:{port}/v1"
        refused = httpx.get(base + "/models", timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["message"].startswith("no API key")
        assert httpx.get(base + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=30).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200  # the page itself
    finally:
        code = stop(process, output)
    assert code == 0


def test_a_shared_app_without_a_key_is_refused_before_it_serves():
    with pytest.raises(LaunchError, match="API key"):
        serve(ctx=None, share=True)
