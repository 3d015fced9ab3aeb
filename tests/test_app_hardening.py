"""Issue 20 through the app's API (gradio_client) and its parts: nothing typed is lost, nothing hangs, a shared
app loads only from its shelf, state that outlives its cause is cleaned up. Then the page's own events: a page
load reopens a chat, Delete, Rename and Export are usable only while a chat is chosen."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client

from flash_dllm.app import handlers
from flash_dllm.app.canvas import empty_canvas_html
from flash_dllm.app.chats import ChatStore
from flash_dllm.app.launch import serve
from flash_dllm.app.models import LoadOptions, ModelError, ModelHost
from flash_dllm.app.sessions import Sessions
from flash_dllm.app.turns import OUTPUTS, AppContext
from flash_dllm.app.ui import build_ui
from flash_dllm.engine import Engine
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from app_testing import free_port  # noqa: E402

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
API_OUTPUTS = [name for name in OUTPUTS if not name.startswith("rec_")]
SHORT = dict(gen_length=32, block_length=16)


def named(outputs) -> dict:
    return dict(zip(API_OUTPUTS, outputs, strict=True))


def value(update):
    return update.get("value") if isinstance(update, dict) else update



@pytest.fixture(scope="module")
def app(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada", TinySpec("llada"))
    chats = tmp_path_factory.mktemp("home") / "chats"
    ctx = AppContext(ModelHost(Engine.load(str(folder), device="cpu"), LoadOptions(device="cpu"), name=str(folder)),
                     ChatStore(chats))
    demo = serve(ctx, port=free_port())
    try:
        yield SimpleNamespace(ctx=ctx, url=demo.local_url, folder=folder, chats=chats)
    finally:
        demo.close()
        torch.set_num_threads(threads)


@pytest.fixture()
def client(app):
    return Client(app.url, verbose=False)


def test_regenerate_with_an_unknown_chat_creates_nothing(app, client):
    before = {c.id for c in app.ctx.store.list()}
    for chat_id in ("0" * 32, "not-an-id", ""):
        out = named(client.predict(chat_id=chat_id, **SHORT, api_name="/regenerate"))
        assert "Nothing to regenerate" in out["status"]
        # no chat chosen yet (a fresh page) is told what to do; a chat that is gone is said to be gone
        assert ("send a message first" if not chat_id else "does not exist") in out["status"]
    assert {c.id for c in app.ctx.store.list()} == before


def test_bad_api_values_are_refused_by_name(app, client):
    before = len(app.ctx.store.list())
    cases = [(dict(temperature=1e-9), "temperature must be 0 (greedy) or at least"),
             (dict(seed=1.5), "seed must be a whole number"),
             (dict(gen_length=48, block_length=32), "multiple of block length")]
    for knobs, needle in cases:
        out = named(client.predict(message="hi", **{**SHORT, **knobs}, api_name="/chat"))
        assert "Setting not accepted" in out["status"] and needle in out["status"], (knobs, out["status"])
        assert value(out["message"]) == "hi"  # back in the box
    assert len(app.ctx.store.list()) == before  # no empty chat left behind


def test_knob_values_of_any_type_become_named_setting_errors():
    from flash_dllm.app.presets import build_settings
    from flash_dllm.engine import SettingsError

    for knobs, needle in ((dict(gen_length="abc"), "gen length must be a number"),
                          (dict(gen_length=[32]), "gen length must be a number"),
                          (dict(window=float("inf")), "window must be a finite number"),
                          (dict(temperature=float("nan")), "temperature must be a finite number"),
                          (dict(threshold=True), "threshold must be a number"),
                          (dict(seed=""), None)):
        if needle is None:
            build_settings("llada", **knobs)  # an empty seed box means the default seed
            continue
        with pytest.raises(SettingsError, match=needle):
            build_settings("llada", **knobs)
    with pytest.raises(SettingsError, match="method"):
        build_settings(["llada"])


def test_a_lone_surrogate_is_kept_as_a_replacement_character(app):
    # a browser can send one (JSON "\\ud800"); gradio_client cannot encode it, so the handler is called as Gradio
    # would call it (the real page: tests/test_browser_hardening.py)
    *_, last = handlers.chat(app.ctx, "caf\ud800 ok", None, "", **SHORT)
    out = dict(zip(OUTPUTS, last))
    assert "Done." in out["status"]
    saved = app.ctx.store.get(value(out["chats"]))
    assert saved.messages[0]["content"] == "caf\ufffd ok"


def test_temp_files_are_no_chats_and_stale_ones_are_removed(app, tmp_path):
    store = ChatStore(tmp_path / "chats")
    chat = store.create()
    store.add_message(chat.id, "user", "hello")
    copy = tmp_path / "chats" / ".tmp-abc123.json"
    copy.write_text((tmp_path / "chats" / f"{chat.id}.json").read_text())
    fresh = tmp_path / "chats" / ".tmp-fresh.json"
    fresh.write_text("{}")
    os.utime(copy, (time.time() - 3600, time.time() - 3600))
    assert [c.id for c in store.list()] == [chat.id]
    ChatStore(tmp_path / "chats")  # a restart
    assert not copy.exists() and fresh.exists()  # a write in progress (seconds old) is left alone


def test_an_unwritable_chats_folder_is_reported_in_one_line_and_the_message_kept(app, client, tmp_path):
    chats = app.chats
    moved = chats.with_name("chats-away")
    chats.rename(moved)
    chats.write_text("")  # a file where the folder was: nothing can be written there, even by root
    try:
        out = named(client.predict(message="will it save?", **SHORT, api_name="/chat"))
        assert "cannot save chats in" in out["status"] and str(chats) in out["status"]
        assert "Errno" not in out["status"] and value(out["message"]) == "will it save?"
    finally:
        chats.unlink()
        moved.rename(chats)


def test_a_queued_message_outlives_its_page(app):
    """The page that queued it went away (reload): the message is saved as the chat's next question once the
    turn decoding that chat ends, and opening the chat says it has no answer yet."""
    ctx = app.ctx
    chat = ctx.store.create()
    ctx.store.add_message(chat.id, "user", "first")
    turn = ctx.sessions.begin("page-1", chat.id)  # a turn is decoding this chat
    ctx.sessions.queue(chat.id, "page-1", "second, typed while it decoded")
    handlers.on_unload(ctx, SimpleNamespace(session_hash="page-1"))
    assert [m["content"] for m in ctx.store.get(chat.id).messages] == ["first"]  # not before the answer
    assert ctx.sessions.queued(chat.id) == ["second, typed while it decoded"]  # still shown
    ctx.store.put_answer(chat.id, "answer one")
    ctx.sessions.end("page-1", turn, chat.id)
    handlers.save_orphans(ctx, chat.id)
    assert [m["content"] for m in ctx.store.get(chat.id).messages] == ["first", "answer one",
                                                                       "second, typed while it decoded"]
    _, _, status = handlers.open_chat(ctx, chat.id)
    assert "no answer yet" in status and "Regenerate" in status


def test_messages_sent_before_the_page_knows_its_new_chat_go_into_that_chat(app):
    """A fresh page (no chat chosen) sends two messages in quick succession: both accepts arrive with no chat id,
    concurrently. They belong to the one chat the first started; once that chat is answered (or deleted), a
    message with no chat chosen starts a new one."""
    ctx, page = app.ctx, SimpleNamespace(session_hash="fresh-page")
    before = {c.id for c in ctx.store.list()}
    barrier = threading.Barrier(2)

    def send(text):
        barrier.wait()
        return handlers.accept(ctx, text, None, page)

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(send, ["first question", "second question"]))
    started = {c.id for c in ctx.store.list()} - before
    assert len(started) == 1
    (chat_id,) = started
    assert [o[1]["value"] for o in outcomes] == [chat_id, chat_id]
    assert sorted(ctx.sessions.queued(chat_id)) == ["first question", "second question"]
    for text in ("first question", "second question"):
        ctx.sessions.unqueue(chat_id, "fresh-page", text)
    ctx.store.add_message(chat_id, "user", "first question")
    ctx.store.put_answer(chat_id, "an answer")
    later = handlers.accept(ctx, "a new topic", None, page)
    assert later[1]["value"] != chat_id  # answered: no chat chosen means a new chat again
    ctx.sessions.unqueue(later[1]["value"], "fresh-page", "a new topic")


def test_a_turn_whose_page_goes_away_finishes_and_saves_its_answer(app):
    """Gradio closes a turn's generator when its page goes away (a reload): the answer is still decoded and
    saved (not cancelled), and a later turn on that chat waits for it, so the chat keeps its order."""
    ctx = app.ctx
    turn = handlers.chat(ctx, "finish me without a page", None, "", **SHORT)
    for output in turn:  # up to the first decoding frame
        if "Decoding" in str(dict(zip(OUTPUTS, output))["status"]):
            break
    chat_id = value(dict(zip(OUTPUTS, output))["chats"])
    turn.close()  # what Gradio does to the generator of a page that went away
    later = list(handlers.chat(ctx, "asked right after", chat_id, "", **SHORT))  # waits for the first answer
    assert "Done." in dict(zip(OUTPUTS, later[-1]))["status"]
    texts = [m["content"] for m in ctx.store.get(chat_id).messages]
    assert texts[0] == "finish me without a page" and texts[2] == "asked right after" and len(texts) == 4, texts
    assert texts[1] and ctx.store.get(chat_id).messages[1]["role"] == "assistant"
    assert not ctx.sessions.is_busy(chat_id)


def test_stop_ends_a_waiting_turn_of_its_page_only():
    """A turn waiting for its chat (not decoding yet) is stopped by its own page's Stop, not by another page's;
    a page that goes away leaves its waiting message to go on (as its running turns do)."""
    sessions = Sessions()
    mine, theirs = sessions.begin_waiting("mine"), sessions.begin_waiting("theirs")
    assert sessions.stop("mine") == 1 and mine.stopped.is_set() and not theirs.stopped.is_set()
    sessions.end_waiting("mine", mine)
    assert sessions.stop("mine") == 0
    sessions.drop_session("theirs")
    assert sessions.stop("theirs") == 0 and sessions.stop_unattended(None) == 0 and not theirs.stopped.is_set()


def test_sessions_hand_back_orphans_only_when_the_chat_is_idle():
    sessions = Sessions()
    turn = sessions.begin("s", "c")
    sessions.queue("c", "s", "x")
    sessions.queue("c", "other", "y")
    sessions.drop_session("s")
    assert sessions.take_orphans("c") == []  # busy
    sessions.end("s", turn, "c")
    assert sessions.take_orphans("c") == ["x"] and sessions.queued("c") == ["y"]


def test_only_the_same_login_stops_a_turn_whose_page_went_away():
    sessions = Sessions()
    alice, bob = sessions.begin("page-a", "chat-a"), sessions.begin("page-b", "chat-b")
    sessions.drop_session("page-a", "alice")  # both pages went away; their turns go on
    sessions.drop_session("page-b", "bob")
    assert sessions.stop_unattended("carol") == 0 and sessions.stop_unattended(None) == 0
    assert sessions.stop_unattended("alice") == 1
    assert alice.stopped.is_set() and not bob.stopped.is_set()
    sessions.end("page-a", alice, "chat-a")  # the stopped turn ends: nothing left to stop
    assert sessions.stop_unattended("alice") == 0 and list(sessions.unattended) == [bob]


def test_a_shared_app_loads_only_from_its_shelf_and_reveals_no_paths(app, tmp_path):
    host = ModelHost(app.ctx.host.engine, LoadOptions(device="cpu"), name=str(app.folder), shelf_only=True)
    secret = tmp_path / "private-folder"
    secret.mkdir()
    answers = set()
    for name in (str(secret), str(tmp_path / "missing"), "/etc", str(app.folder / "config.json"), "../..", "~"):
        with pytest.raises(ModelError) as refused:
            host.switch(name)
        answers.add(str(refused.value))
    assert answers == {"on a shared app only the models listed under Model can be loaded"}
    with pytest.raises(ModelError, match="repo id"):
        host.fetch("/etc", download=True)
    assert host.switch(str(app.folder)) is host.engine  # the loaded model is on the shelf


def test_a_stalled_hub_never_holds_up_a_chat(app, client, fake_hub, tiny_dream, monkeypatch):
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "2")
    fake_hub.add_repo("tiny/stalled", tiny_dream)
    fake_hub.stall()
    started = time.monotonic()
    for api_name, argument in (("/load_model", "tiny/stalled"), ("/download_model", "tiny/stalled")):
        job = Client(app.url, verbose=False).submit(argument, api_name=api_name)
        time.sleep(0.5)  # the switch is waiting on the Hub now
        chat = named(client.predict(message="still there?", **SHORT, api_name="/chat"))
        assert "Done." in chat["status"] and not job.done()  # the chat did not wait behind the Hub
        notes = [outputs[0] for outputs in job]
        assert "did not answer within 2 s" in notes[-1] and "tiny/stalled" in notes[-1], notes[-1]
    assert time.monotonic() - started < 90
    assert app.ctx.host.name == str(app.folder)


def test_the_canvas_follows_the_chosen_chat(app, client):
    first = named(client.predict(message="canvas one", **SHORT, api_name="/chat"))
    first_id = value(first["chats"])
    second = named(client.predict(message="canvas two", chat_id="", **SHORT, api_name="/chat"))
    assert value(second["chats"]) != first_id
    session = client.session_hash
    shown = handlers.chat_canvas(app.ctx, first_id, SimpleNamespace(session_hash=session))
    assert shown[0] == first["canvas_a"] and shown[6] is not None  # canvas_a and rec_a of chat one
    empty = handlers.chat_canvas(app.ctx, "f" * 32, SimpleNamespace(session_hash=session))
    assert "data-masked" not in empty[0] and empty[6] is None
    client.predict(first_id, api_name="/delete_chat")
    gone = handlers.chat_canvas(app.ctx, first_id, SimpleNamespace(session_hash=session))
    assert gone[6] is None


def test_a_reloaded_page_gets_the_chats_canvas_back_but_not_another_login(app, client):
    """The canvas of a chat's last answer is kept per chat: a reloaded page (a new session) or another tab that
    opens the chat shows it, a login that may not open the chat does not."""
    out = named(client.predict(message="canvas for later", **SHORT, api_name="/chat"))
    chat_id = value(out["chats"])
    reloaded = handlers.chat_canvas(app.ctx, chat_id, SimpleNamespace(session_hash="a-new-page", username=None))
    assert reloaded[0] == out["canvas_a"] and reloaded[6] is not None
    stranger = handlers.chat_canvas(app.ctx, chat_id, SimpleNamespace(session_hash="elsewhere", username="mallory"))
    assert "data-masked" not in stranger[0] and stranger[6] is None


def test_the_canvas_prompt_tail_is_the_users_words(app, client):
    out = named(client.predict(message="tell me about owls please", **SHORT, api_name="/chat"))
    tail = out["canvas_a"].split('class="fd-prompt"', 1)[1].split("</span>", 1)[0]
    assert "owls please" in tail and "start_header_id" not in tail and "eot_id" not in tail


def test_a_page_load_reopens_the_remembered_chat_and_nothing_else(tmp_path):
    """`reopen_chat` (the page's load event, after a reload or in a new tab): the chat the tab remembers, as
    choosing it shows it (`open_chat`; the canvas column as `chat_canvas` gives it to this new page); a stale or
    unreadable memory, or none (a new tab), opens no chat, so a first message there starts a new one; a page
    that has chosen a chat already, or no chats at all, is left as it is."""
    ctx = AppContext(ModelHost(), ChatStore(tmp_path / "chats"))
    page = SimpleNamespace(session_hash="reloaded-page")
    untouched = (handlers.gr.skip(),) * (4 + len(handlers.CANVAS_OUTPUTS))
    assert handlers.reopen_chat(ctx, "", None, page) == untouched  # no chats: the empty page, as before
    older = ctx.store.create(system="Be brief.")
    ctx.store.add_message(older.id, "user", "older question")
    ctx.store.put_answer(older.id, "older answer")
    latest = ctx.store.create()
    ctx.store.add_message(latest.id, "user", "latest question")
    outputs = handlers.reopen_chat(ctx, older.id, "", page)
    assert len(outputs) == 4 + len(handlers.CANVAS_OUTPUTS)
    chats, chatbot, system, status = outputs[:4]
    assert chats["value"] == older.id and [v for _, v in chats["choices"]] == [latest.id, older.id]
    assert (chatbot, system, status) == handlers.open_chat(ctx, older.id, page)
    assert [m["content"] for m in chatbot] == ["older question", "older answer"] and system == "Be brief."
    canvas = dict(zip(handlers.CANVAS_OUTPUTS, outputs[4:]))
    assert canvas["canvas_a"] == empty_canvas_html() and canvas["rec_a"] is None  # nothing decoded on this page
    for remembered in ("", None, "f" * 32, "not an id", "older question"):  # ids only: the tab keeps no titles
        assert handlers.reopen_chat(ctx, remembered, None, page) == untouched
    assert "no answer yet" in handlers.reopen_chat(ctx, latest.id, None, page)[3]
    assert handlers.reopen_chat(ctx, older.id, latest.id, page) == untouched  # the page chose already
    assert handlers.reopen_chat(ctx, older.id, "latest question", page) == untouched  # chosen, shown by title


def test_delete_rename_and_export_are_usable_only_while_a_chat_is_chosen(tmp_path):
    """One event sets all of them from the Chats value; Rename's box is inert with its button."""
    ctx = AppContext(ModelHost(), ChatStore(tmp_path / "chats"))
    demo = build_ui(ctx)
    by_id = {block.elem_id: block for block in demo.blocks.values() if getattr(block, "elem_id", None)}
    delete, box, rename, export = (by_id[name] for name in ("delete-chat", "rename-box", "rename-chat", "export-chat"))
    assert delete.value == "Delete" and delete.interactive is False and delete.variant != "stop"  # no chat yet
    assert (box.label, rename.value, export.value) == ("Rename chat to", "Rename", "Export")
    assert box.interactive is False and rename.interactive is False and export.interactive is False
    chats = next(block for block in demo.blocks.values() if getattr(block, "label", None) == "Chats")
    follows = [fn for fn in demo.fns.values() if fn.name == "chat_controls"]
    assert len(follows) == 1 and [t[1] for t in follows[0].targets] == ["change"]
    assert [block._id for block in follows[0].inputs] == [chats._id]
    assert [block._id for block in follows[0].outputs] == [delete._id, box._id, rename._id, export._id]
    chat = ctx.store.create()
    inert, usable = handlers.gr.update(interactive=False), handlers.gr.update(interactive=True)
    for nothing in (None, "", "  ", "a title no chat has"):
        assert handlers.chat_controls(ctx, nothing) == (
            handlers.gr.update(interactive=False, variant="secondary"), inert, inert, inert)
    assert handlers.chat_controls(ctx, chat.id) == (handlers.gr.update(interactive=True, variant="stop"),
                                                    usable, usable, usable)
    assert all(update["interactive"] for update in handlers.chat_controls(ctx, chat.title))  # title shown


def test_rename_and_export_without_a_chat_still_warn_an_api_caller(tmp_path):
    """The page never lets them be clicked with no chat chosen; a client of the API still gets the warning."""
    ctx = AppContext(ModelHost(), ChatStore(tmp_path / "chats"))
    for nothing in (None, ""):
        chats, box, status = handlers.rename_chat(ctx, nothing, "a new title")
        assert chats == box == handlers.gr.skip() and "error" in status
        exported, status = handlers.export_chat(ctx, nothing, "md")
        assert exported is None and "Choose a chat to export." in status
