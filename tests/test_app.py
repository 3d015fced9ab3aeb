"""The chat app served in-process on 127.0.0.1 with a tiny model, driven through gradio_client."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client
from process_testing import interruptible

from flash_dllm.app.chats import ChatStore
from flash_dllm.app.launch import parse_auth, serve, share_note, LaunchError
from flash_dllm.app.models import LoadOptions, ModelHost
from flash_dllm.app.turns import OUTPUTS, AppContext
from flash_dllm.engine import Engine, hub
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from app_testing import free_port  # noqa: E402

API_OUTPUTS = [name for name in OUTPUTS if not name.startswith("rec_")]  # gr.State never reaches clients
LONG = dict(method="llada", gen_length=384, block_length=64, steps=0)  # ~2 s on one CPU core
SHORT = dict(gen_length=32, block_length=16)


def named(outputs) -> dict:
    return dict(zip(API_OUTPUTS, outputs, strict=True))


def value(update):
    """A component value from an output that may be a gr.update dict."""
    return update.get("value") if isinstance(update, dict) else update


def texts(chatbot) -> list[tuple[str, str]]:
    out = []
    for message in chatbot:
        content = message["content"]
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        out.append((message["role"], content))
    return out



@pytest.fixture(scope="module")
def app(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    saved_home, saved_threads = os.environ.get("FLASH_DLLM_HOME"), torch.get_num_threads()
    os.environ["FLASH_DLLM_HOME"] = str(home)
    torch.set_num_threads(1)  # a tiny model on a shared 2-core machine decodes far faster on one thread
    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada", TinySpec("llada"))
    engine = Engine.load(str(folder), device="cpu")
    ctx = AppContext(ModelHost(engine, LoadOptions(device="cpu"), name=str(folder)), ChatStore(home / "chats"))
    demo = serve(ctx, port=free_port())
    try:
        yield SimpleNamespace(ctx=ctx, url=demo.local_url, home=home, folder=folder,
                              models=tmp_path_factory.mktemp("more-models"))
    finally:
        demo.close()
        torch.set_num_threads(saved_threads)
        if saved_home is None:
            os.environ.pop("FLASH_DLLM_HOME", None)
        else:
            os.environ["FLASH_DLLM_HOME"] = saved_home


@pytest.fixture()
def client(app):
    return Client(app.url, verbose=False)


def wait_for(job, predicate, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        outputs = job.outputs()
        if outputs and predicate(named(outputs[-1])):
            return named(outputs[-1])
        if job.done():
            break
        time.sleep(0.02)
    raise AssertionError(f"condition not reached; last outputs: {job.outputs()[-1:]}")


def masked(canvas_html) -> int:
    return int(re.search(r'data-masked="(\d+)"', value(canvas_html)).group(1))


def test_a_chat_turn_streams_canvas_updates_before_the_final_answer(app, client):
    job = client.submit(message="Hello there", method="flash-verify", gen_length=64, block_length=16, api_name="/chat")
    updates = [named(outputs) for outputs in job]
    final = named(job.outputs()[-1])
    canvases = [u["canvas_a"] for u in updates if isinstance(u["canvas_a"], str) and "data-masked" in u["canvas_a"]]
    assert len(set(canvases)) >= 3, f"only {len(set(canvases))} distinct canvas frames"
    counts = [masked(c) for c in canvases]
    assert counts[0] > counts[-1] == 0 and counts == sorted(counts, reverse=True)
    assert "Done." in final["status"]
    conversation = texts(final["chatbot"])
    assert conversation[0] == ("user", "Hello there") and conversation[1][0] == "assistant"
    assert "tokens/s" in final["stats_a"] and "forward passes" in final["stats_a"] and "kernels" in final["stats_a"]
    assert 'class="k c' in final["canvas_a"]  # committed cells, coloured


def test_stop_mid_generation_then_a_new_turn_succeeds(app, client):
    job = client.submit(message="Count slowly", **LONG, api_name="/chat")
    wait_for(job, lambda u: isinstance(u["canvas_a"], str) and "data-masked" in u["canvas_a"]
             and masked(u["canvas_a"]) < 380)
    assert "Stopping" in client.predict(api_name="/stop")
    final = named(job.result())
    assert "Stopped" in final["status"]
    assert masked(final["canvas_a"]) > 0 and "stopped" in final["canvas_a"]
    chat_id = value(final["chats"])
    after = named(client.predict(message="And now?", chat_id=chat_id, **SHORT, api_name="/chat"))
    assert "Done." in after["status"]
    roles = [role for role, _ in texts(after["chatbot"])]
    assert roles[-2:] == ["user", "assistant"] and roles.count("user") == 2
    assert "Nothing is being generated" in client.predict(api_name="/stop")


def test_two_clients_at_once_both_finish(app):
    first, second = Client(app.url, verbose=False), Client(app.url, verbose=False)
    job_a = first.submit(message="first client", method="flash-cache", **SHORT, api_name="/chat")
    job_b = second.submit(message="second client", method="fast-dllm", **SHORT, api_name="/chat")
    result_a, result_b = named(job_a.result(timeout=120)), named(job_b.result(timeout=120))
    assert "Done." in result_a["status"] and "Done." in result_b["status"]
    assert value(result_a["chats"]) != value(result_b["chats"])
    assert texts(result_a["chatbot"])[0] == ("user", "first client")
    assert texts(result_b["chatbot"])[0] == ("user", "second client")


def test_a_message_sent_during_a_generation_is_queued_not_lost(app, client):
    first = named(client.predict(message="one", **SHORT, api_name="/chat"))
    chat_id = value(first["chats"])
    long_job = client.submit(message="two", chat_id=chat_id, **LONG, api_name="/chat")
    wait_for(long_job, lambda u: isinstance(u["canvas_a"], str) and "data-masked" in u["canvas_a"])
    app.ctx.sessions.queue(chat_id, client.session_hash, "three")  # what the page does when Enter is pressed
    queued = client.submit(message="three", chat_id=chat_id, **SHORT, api_name="/chat")
    shown = wait_for(long_job, lambda u: ("user", "three") in texts(u["chatbot"]))
    assert texts(shown["chatbot"])[-1][1].startswith("⏳ queued")  # visible while it waits
    assert not queued.done() and not long_job.done()  # waits for the engine, one generation at a time
    assert "Done." in named(long_job.result(timeout=120))["status"]
    final = named(queued.result(timeout=120))
    assert app.ctx.sessions.queued(chat_id) == []
    assert "Done." in final["status"]
    assert [t for r, t in texts(final["chatbot"]) if r == "user"] == ["one", "two", "three"]
    assert [r for r, _ in texts(final["chatbot"])] == ["user", "assistant"] * 3


def test_bad_input_gets_a_visible_message_and_the_engine_stays_usable(app, client):
    bad = named(client.predict(message="hi", gen_length=100, block_length=32, api_name="/chat"))
    assert "Setting not accepted" in bad["status"] and "multiple of block length 32" in bad["status"]
    assert value(bad["message"]) == "hi"  # the message goes back to the box
    empty = named(client.predict(message="   ", api_name="/chat"))
    assert "Type a message first" in empty["status"]
    huge = named(client.predict(message="x" * 3000, **SHORT, api_name="/chat"))
    assert "exceeds the model" in huge["status"] and "ready for the next message" in huge["status"]
    assert value(huge["message"]) == "x" * 3000
    assert all(role != "user" or text != "x" * 3000 for role, text in texts(huge["chatbot"]))
    ok = named(client.predict(message="fine now", **SHORT, api_name="/chat"))
    assert "Done." in ok["status"]


def test_replay_and_export_after_an_answer(app, client):
    final = named(client.predict(message="replay me", method="flash-verify", **SHORT, api_name="/chat"))
    steps = value(final["replay"])
    assert steps >= 2
    canvas_a, _ = client.predict(2, api_name="/replay")
    assert 'data-step="2"' in canvas_a
    canvas_0, _ = client.predict(0, api_name="/replay")
    assert masked(canvas_0) == 32
    html_files = value(client.predict(api_name="/export_html"))
    page = Path(html_files[0]).read_text(encoding="utf-8")
    assert "fd-data" in page and "flash-verify" in page
    gif_files = value(client.predict(api_name="/export_gif"))
    assert Path(gif_files[0]).read_bytes()[:6] in (b"GIF87a", b"GIF89a")


def test_side_by_side_runs_two_methods_each_with_canvas_and_stats(app, client):
    final = named(client.predict(message="compare", method="flash-cache", side_by_side=True, method_b="llada",
                                 **SHORT, api_name="/chat"))
    assert "A:" in final["status"] and "B:" in final["status"]
    assert "<b>flash-cache</b>" in final["canvas_a"] and "<b>llada</b>" in final["canvas_b"]
    assert "tokens/s" in final["stats_a"] and "tokens/s" in final["stats_b"]
    assert isinstance(value(final["answer_b"]), str)
    assert len(texts(final["chatbot"])) == 2  # the conversation continues with A's answer


def test_chats_persist_and_can_be_renamed_regenerated_exported_and_deleted(app, client):
    final = named(client.predict(message="keep me", **SHORT, api_name="/chat"))
    chat_id = value(final["chats"])
    saved = ChatStore(app.home / "chats").get(chat_id)  # a fresh store: what a restarted app reads
    assert [m["role"] for m in saved.messages] == ["user", "assistant"]
    assert saved.messages[1]["meta"]["method"] and saved.messages[1]["meta"]["tokens_per_s"] > 0
    again = named(client.predict(chat_id=chat_id, gen_length=32, block_length=16, temperature=1.0, seed=7,
                                 api_name="/regenerate"))
    assert "Done." in again["status"] and len(texts(again["chatbot"])) == 2
    chats, _, status = client.predict(chat_id, "Renamed chat", api_name="/rename_chat")
    assert "Renamed" in status and ChatStore(app.home / "chats").get(chat_id).title == "Renamed chat"
    exported, _ = client.predict(chat_id, "md", api_name="/export_chat")
    assert "# Renamed chat" in Path(value(exported)).read_text(encoding="utf-8")
    chatbot, _, _ = client.predict(chat_id, api_name="/open_chat")
    assert texts(chatbot)[0] == ("user", "keep me")
    _, _, status = client.predict(chat_id, api_name="/delete_chat")
    assert "Deleted" in status
    with pytest.raises(KeyError):
        ChatStore(app.home / "chats").get(chat_id)


def test_presets_set_the_raw_knobs(app, client):
    fast = client.predict("fast", 128, api_name="/preset")
    quality = client.predict("quality", 128, api_name="/preset")
    assert fast[2] < quality[2]  # threshold
    assert fast[1] == 64 and quality[1] == 0  # llada steps: half for fast, one token per step otherwise


def test_switching_models_checks_the_fit_first(app, client, monkeypatch):
    dream = write_tiny_model(app.models / "tiny-dream", TinySpec("dream", n_kv_heads=2))
    refusal = "does not fit: needs about 99.0 GiB; RAM has 1.0 GiB available"
    monkeypatch.setattr(hub, "fit_check", lambda size, device, dtype=None: (False, refusal))
    note, _, _, _ = client.predict(str(dream), api_name="/load_model")
    assert "does not fit" in note and "99.0 GiB" in note
    assert app.ctx.host.name == str(app.folder)  # the previous model is back
    monkeypatch.undo()
    note, info, _, _ = client.predict(str(dream), api_name="/load_model")
    assert "Loaded" in note and "dream" in app.ctx.host.engine.describe()["family"]
    final = named(client.predict(message="hi dream", **SHORT, api_name="/chat"))
    assert "Done." in final["status"]
    note, _, _, _ = client.predict(str(app.folder), api_name="/load_model")
    assert "Loaded" in note and app.ctx.host.engine.describe()["family"] == "llada"


def test_download_without_network_says_what_to_do(app, client, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    note, _, _, _ = client.predict("someorg/some-model", api_name="/download_model")
    assert "fd-error" in note and "someorg/some-model" in note and "cache" in note
    note, _, _, _ = client.predict("not a repo id", api_name="/download_model")
    assert "repo id" in note


def test_the_engine_gets_plain_string_messages_from_a_chat():
    """Gradio 6 content parts are flattened by the app; the engine accepts only plain strings."""
    from flash_dllm.app.chats import Chat

    chat = Chat("0" * 32, system="Be brief.", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
        {"role": "assistant", "content": "Hi", "meta": {"method": "llada"}}])
    assert chat.conversation() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"},
                                   {"role": "assistant", "content": "Hi"}]


def test_a_model_switch_loads_with_the_launch_options(tiny_dream):
    """The launcher's --device/--dtype/--kernels/--no-graphs reach every model the page loads."""
    host = ModelHost(options=LoadOptions(device="cpu", dtype="fp32", kernels="torch", graphs=False))
    engine = host.switch(str(tiny_dream))
    assert engine.graphs is False and engine.describe()["dtype"] == "float32" and engine.kernels == "torch"


def test_auth_and_share_messages(tmp_path):
    assert parse_auth("ann:secret") == [("ann", "secret")]
    users = tmp_path / "users.txt"
    users.write_text("# logins\nann:one\nbob:two:with-colon\n")
    assert parse_auth(str(users)) == [("ann", "one"), ("bob", "two:with-colon")]
    with pytest.raises(LaunchError):
        parse_auth("no-colon")
    assert "could not be made" in share_note(None, False)
    public = share_note("https://abc.gradio.live", False)
    assert "Anyone with the public link can use this machine" in public and "--auth" in public
    assert "each login sees only the chats it made" in share_note("https://abc.gradio.live", True)


def test_startup_model_prefers_flag_then_last_used_then_bundled(app, monkeypatch, tmp_path):
    from flash_dllm.app.models import startup_model
    from flash_dllm.app import paths

    monkeypatch.setenv("FLASH_DLLM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert startup_model("org/model") == ("org/model", "from --model")
    name, why = startup_model(None)
    bundled = hub.bundled_model_path()
    if bundled is None:
        assert name is None and "--model" in why
    else:
        assert name == str(bundled) and "bundled" in why
    paths.remember_model(str(app.folder))
    assert startup_model(None) == (str(app.folder), "the last model used")
    paths.remember_model(str(tmp_path / "gone"))  # deleted since: not used
    assert startup_model(None)[0] != str(tmp_path / "gone")


def test_the_command_serves_the_page_behind_a_login(app, tmp_path):
    import signal
    import subprocess
    import sys
    import urllib.error
    import urllib.parse
    import urllib.request

    port = free_port()
    env = dict(os.environ, FLASH_DLLM_HOME=str(tmp_path / "home"))
    command = [sys.executable, "-c", "from flash_dllm.app.cli import main; raise SystemExit(main())",
               "--model", str(app.folder), "--no-browser", "--port", str(port), "--auth", "ann:secret"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=interruptible)
    lines = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "is running at" in line:
                break
        assert any("is running at" in line and "login required" in line for line in lines), "".join(lines)
        base = f"http://127.0.0.1:{port}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/config", timeout=10)
        assert refused.value.code == 401
        login = urllib.parse.urlencode({"username": "ann", "password": "secret"}).encode()
        with urllib.request.urlopen(urllib.request.Request(base + "/login", data=login), timeout=10) as answer:
            assert answer.status == 200
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGUSR1)  # the app dumps every thread's stack (app/shutdown.py)
            time.sleep(2)
            process.kill()
            pytest.fail("still running 30 s after Ctrl-C; its output and stacks:\n" + "".join(lines)
                        + process.stdout.read())
        assert code == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    settings = (tmp_path / "home" / "config" / "settings.json").read_text()
    assert str(app.folder) in settings  # the next start uses this model again


def test_download_shows_progress_then_loads_the_model(app, client, fake_hub, tiny_dream):
    fake_hub.add_repo("tiny/dream-chat", tiny_dream)
    job = client.submit("tiny/dream-chat", api_name="/download_model")
    notes = [outputs[0] for outputs in job]
    try:
        assert any("fd-progress" in n and "(100%)" in n for n in notes), notes
        assert "Loaded tiny/dream-chat" in notes[-1]
        assert app.ctx.host.name == "tiny/dream-chat" and app.ctx.host.engine.describe()["family"] == "dream"
        final = named(client.predict(message="hello hub", **SHORT, api_name="/chat"))
        assert "Done." in final["status"]
    finally:
        note, _, _, _ = client.predict(str(app.folder), api_name="/load_model")
    assert "Loaded" in note
