"""What the page says back when a turn does not run as asked: a refused message leaves no queued bubble (and no
empty chat it started), a cancelled Delete says the chat was kept, and a Regenerate clicked while the chat's
answer is decoded says that it waits for that answer."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import json
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client

from flash_dllm.app import handlers, ui
from flash_dllm.app.chats import ChatStore
from flash_dllm.app.launch import serve
from flash_dllm.app.models import LoadOptions, ModelHost
from flash_dllm.app.turns import OUTPUTS, AppContext
from flash_dllm.engine import Engine
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from app_testing import free_port  # noqa: E402

API_OUTPUTS = [name for name in OUTPUTS if not name.startswith("rec_")]
SHORT = dict(gen_length=32, block_length=16)
LONG = dict(method="llada", gen_length=384, block_length=64, steps=0)
REFUSED = [(dict(gen_length=100, block_length=32), "gen length 100 must be a positive multiple of block length 32"),
           (dict(method="llada", steps=1), "steps 1 must be a multiple of the number of blocks")]


def value(update):
    return update.get("value") if isinstance(update, dict) else update


def texts(chatbot) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in chatbot]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada", TinySpec("llada"))
    ctx = AppContext(ModelHost(Engine.load(str(folder), device="cpu"), LoadOptions(device="cpu"), name=str(folder)),
                     ChatStore(tmp_path_factory.mktemp("home") / "chats"))
    demo = serve(ctx, port=free_port())
    try:
        yield SimpleNamespace(ctx=ctx, url=demo.local_url)
    finally:
        demo.close()
        torch.set_num_threads(threads)


def send(ctx, page, text, chat_id, **knobs):
    """What the page does on Enter: `accept` (the message shown queued), then the streamed `chat` turn; returns
    what accept showed and the turn's last output by name."""
    _, chats, shown, turn_msg = handlers.accept(ctx, text, chat_id, page)
    *_, last = handlers.chat(ctx, turn_msg, value(chats), "", request=page, **knobs)
    return value(chats), shown, dict(zip(OUTPUTS, last))


def test_a_refused_message_leaves_no_queued_bubble_in_an_open_chat(app):
    ctx, page = app.ctx, SimpleNamespace(session_hash="page-refused-open")
    chat = ctx.store.create()
    ctx.store.add_message(chat.id, "user", "earlier question")
    ctx.store.put_answer(chat.id, "earlier answer")
    for knobs, needle in REFUSED:
        chat_id, shown, out = send(ctx, page, "What is 1 + 1?", chat.id, **knobs)
        assert chat_id == chat.id and texts(shown)[-1][1].startswith("⏳ queued")  # as the page showed it
        assert "Setting not accepted" in out["status"] and needle in out["status"]
        assert out["message"] == "What is 1 + 1?"  # back in the box
        assert texts(out["chatbot"]) == [("user", "earlier question"), ("assistant", "earlier answer")]
        assert ctx.sessions.queued(chat.id) == []
    assert [m["content"] for m in ctx.store.get(chat.id).messages] == ["earlier question", "earlier answer"]


def test_a_refused_message_shows_what_is_still_queued(app):
    ctx, page = app.ctx, SimpleNamespace(session_hash="page-refused-queued")
    chat = ctx.store.create()
    ctx.store.add_message(chat.id, "user", "earlier question")
    ctx.store.put_answer(chat.id, "earlier answer")
    handlers.accept(ctx, "What is 1 + 1?", chat.id, page)
    handlers.accept(ctx, "a later message", chat.id, page)  # waits behind the refused one
    *_, last = handlers.chat(ctx, "a later message", chat.id, "", request=page, gen_length=100, block_length=32)
    out = dict(zip(OUTPUTS, last))
    assert out["message"] == "What is 1 + 1?"
    assert texts(out["chatbot"])[-2:] == [("user", "a later message"), ("assistant",
                                                                       "⏳ queued: waits for the answer being decoded")]
    *_, last = handlers.chat(ctx, "a later message", chat.id, "", request=page, gen_length=100, block_length=32)
    assert dict(zip(OUTPUTS, last))["message"] == "a later message" and ctx.sessions.queued(chat.id) == []


def test_a_refused_first_message_leaves_no_empty_chat(app):
    """In a page with no chat chosen, `accept` starts a chat before the turn checks the settings: refused, that
    chat is removed again (as an API call, refused before any chat is made, leaves none), unless something else
    waits in it; a chat the user chose (New chat) is kept."""
    ctx, page = app.ctx, SimpleNamespace(session_hash="page-refused-first")
    before = {c.id for c in ctx.store.list()}
    for knobs, needle in REFUSED:
        chat_id, shown, out = send(ctx, page, "What is 1 + 1?", None, **knobs)
        assert chat_id not in before and texts(shown)[-1][1].startswith("⏳ queued")
        assert needle in out["status"] and out["message"] == "What is 1 + 1?"
        assert out["chatbot"] == [] and out["chats"]["value"] is None
        assert chat_id not in [v for _, v in out["chats"]["choices"]]
        assert {c.id for c in ctx.store.list()} == before
    # two messages sent at once from a fresh page: the chat stays while the second waits in it
    _, chats, _, first = handlers.accept(ctx, "first", None, page)
    _, again, _, second = handlers.accept(ctx, "second", None, page)
    chat_id = value(chats)
    assert value(again) == chat_id
    *_, last = handlers.chat(ctx, first, chat_id, "", request=page, gen_length=100, block_length=32)
    out = dict(zip(OUTPUTS, last))
    assert texts(out["chatbot"]) == [("user", "second"), ("assistant", "⏳ queued: waits for the answer being decoded")]
    assert chat_id in {c.id for c in ctx.store.list()}
    *_, last = handlers.chat(ctx, second, chat_id, "", request=page, gen_length=100, block_length=32)
    assert dict(zip(OUTPUTS, last))["chatbot"] == [] and {c.id for c in ctx.store.list()} == before
    # a chat the user made (New chat) is theirs: it stays, empty
    made, _, _ = handlers.new_chat(ctx, "", page)
    chat_id, _, out = send(ctx, page, "What is 1 + 1?", made["value"], gen_length=100, block_length=32)
    assert chat_id == made["value"] and out["chatbot"] == [] and ctx.store.get(chat_id).messages == []
    ctx.store.delete(chat_id)


def test_an_accepted_message_after_a_refused_one_starts_a_chat_and_is_answered(app):
    ctx, page = app.ctx, SimpleNamespace(session_hash="page-refused-then-ok")
    refused_id, _, _ = send(ctx, page, "What is 1 + 1?", None, gen_length=100, block_length=32)
    chat_id, _, out = send(ctx, page, "What is 1 + 1?", None, **SHORT)
    assert chat_id != refused_id and "Done." in out["status"]
    assert [r for r, _ in texts(out["chatbot"])] == ["user", "assistant"]


def test_cancelling_delete_says_the_chat_was_kept(app):
    ctx = app.ctx
    chat = ctx.store.create(title="Keep me")
    chats, chatbot, status = handlers.delete_chat(ctx, handlers.KEEP_CHAT + chat.id)
    assert chats == chatbot == handlers.gr.skip()
    assert "Kept “Keep me”" in status and "Choose a chat" not in status
    assert ctx.store.get(chat.id).title == "Keep me"
    assert "Choose a chat to delete." in handlers.delete_chat(ctx, None)[2]  # no chat chosen (an API caller)
    assert "Nothing was deleted" in handlers.delete_chat(ctx, handlers.KEEP_CHAT + "0" * 32)[2]
    assert "Deleted “Keep me”" in handlers.delete_chat(ctx, chat.id)[2]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_delete_confirmation_sends_the_kept_chat_when_cancelled(tmp_path):
    """The page's Delete script, run with the confirmation answered yes and no, and with no chat chosen."""
    script = (f"const run = (answer, id) => {{ globalThis.confirm = () => answer; return ({ui.CONFIRM_DELETE})(id); }};"
              f"console.log(JSON.stringify([run(true, 'abc'), run(false, 'abc'), run(true, null), run(true, '')]));")
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(out) == ["abc", handlers.KEEP_CHAT + "abc", None, None]
    demo = ui.build_ui(AppContext(ModelHost(), ChatStore(tmp_path / "chats")))
    delete = next(fn for fn in demo.fns.values() if fn.api_name == "delete_chat")
    assert delete.js == ui.CONFIRM_DELETE  # the script the page runs


def click_regenerate(ctx, page, chat_id, **knobs):
    """What the page does on Regenerate: `regenerate_requested` (its status now), then a generator of the
    queued `regenerate` turn's outputs by name (started when iterated)."""
    said = handlers.regenerate_requested(ctx, chat_id, page)
    return said, (dict(zip(OUTPUTS, output)) for output in handlers.regenerate(ctx, chat_id, request=page, **knobs))


def test_regenerate_while_decoding_says_it_waits_for_the_answer(app):
    """Regenerate clicked while the chat's answer is decoded: the regenerate event waits in the "gpu" queue, then
    decodes that answer again (replacing it). The click's status says so, and so does the decoding turn's, until
    the regenerate starts; a click while nothing decodes says nothing (the regenerate starts at once)."""
    ctx, page = app.ctx, SimpleNamespace(session_hash="page-regenerate")
    chat_id, _, _ = send(ctx, page, "one", None, **SHORT)
    said, regen = click_regenerate(ctx, page, chat_id, **SHORT)
    assert said == handlers.gr.skip() and "Done." in list(regen)[-1]["status"]  # idle: nothing to wait for
    handlers.accept(ctx, "two", chat_id, page)
    turn = handlers.chat(ctx, "two", chat_id, "", request=page, **LONG)
    for output in turn:
        if "Decoding" in str(dict(zip(OUTPUTS, output))["status"]):
            break
    said, regen = click_regenerate(ctx, page, chat_id, **SHORT)
    assert "Regenerate waits for the answer being decoded" in said
    assert handlers.regenerate_requested(ctx, chat_id, SimpleNamespace(session_hash="other")) != handlers.gr.skip()
    statuses = [str(dict(zip(OUTPUTS, output))["status"]) for output in turn]
    decoding = [s for s in statuses if "Decoding" in s]
    assert decoding and all("Regenerate waits" in s for s in decoding)
    assert "Done." in statuses[-1]
    regen = list(regen)
    assert not any("Regenerate waits" in str(out["status"]) for out in regen)  # it started: nothing waits
    assert "Done." in regen[-1]["status"]
    assert [r for r, _ in texts(regen[-1]["chatbot"])] == ["user", "assistant"] * 2  # the answer replaced
    assert not ctx.regenerations.waiting(page.session_hash, chat_id)
    handlers.on_unload(ctx, SimpleNamespace(session_hash="other"))
    assert not ctx.regenerations.waiting("other", chat_id)


def test_regenerate_while_another_chat_decodes_says_it_waits(app):
    """Turns decode one at a time for every page: a Regenerate of an idle chat while another chat's answer (here
    another user's) is decoded says it waits for that one; once nothing decodes it says nothing."""
    ctx, page, other = app.ctx, SimpleNamespace(session_hash="page-idle"), SimpleNamespace(session_hash="page-busy")
    chat_id, _, _ = send(ctx, page, "one", None, **SHORT)
    turn = handlers.chat(ctx, "long one", None, "", request=other, **LONG)
    for output in turn:
        if "Decoding" in str(dict(zip(OUTPUTS, output))["status"]):
            break
    try:
        said, regen = click_regenerate(ctx, page, chat_id, **SHORT)
    finally:
        list(turn)  # the long turn runs to its end however the check goes
    assert "Regenerate waits: another chat" in said and "is being decoded (one at a time)" in said
    assert not ctx.regenerations.waiting(page.session_hash, chat_id)  # nothing for that turn to repeat
    assert "Done." in list(regen)[-1]["status"]
    said, regen = click_regenerate(ctx, page, chat_id, **SHORT)
    assert said == handlers.gr.skip() and "Done." in list(regen)[-1]["status"]


def test_a_click_while_the_page_regenerates_the_chat_asks_nothing(app):
    """A second Regenerate click while the page's regenerate of the chat is in flight (a double click) is a
    repeat: it asks nothing, so the running one's status must not say that one waits, and its turn changes
    nothing."""
    ctx, page = app.ctx, SimpleNamespace(session_hash="page-regenerate-twice")
    chat_id, _, _ = send(ctx, page, "one", None, **SHORT)
    _, regen = click_regenerate(ctx, page, chat_id, **LONG)
    for output in regen:
        if "Decoding" in str(output["status"]):
            break
    said, repeat = click_regenerate(ctx, page, chat_id, **LONG)
    assert said == handlers.gr.skip()
    statuses = [str(output["status"]) for output in regen]
    assert "Done." in statuses[-1] and not any("Regenerate waits" in s for s in statuses)
    answer = ctx.store.get(chat_id).messages[-1]
    assert list(repeat) == [dict.fromkeys(OUTPUTS, handlers.gr.skip())]  # the repeat's turn changes nothing
    assert ctx.store.get(chat_id).messages[-1] == answer


def test_a_regenerate_sent_while_decoding_waits_then_replaces_that_answer(app):
    """Through the API as the page's events run: the regenerate waits for the answer being decoded, then
    decodes it again; the chat has one answer to its last question."""
    client = Client(app.url, verbose=False)
    first = dict(zip(API_OUTPUTS, client.predict(message="one", **SHORT, api_name="/chat")))
    chat_id = value(first["chats"])
    long_job = client.submit(message="two", chat_id=chat_id, **LONG, api_name="/chat")
    while not any("Decoding" in str(dict(zip(API_OUTPUTS, o))["status"]) for o in long_job.outputs()):
        assert not long_job.done()
    regen = client.submit(chat_id=chat_id, **SHORT, api_name="/regenerate")
    assert "Done." in dict(zip(API_OUTPUTS, long_job.result(timeout=120)))["status"]
    answered = [m["content"] for m in app.ctx.store.get(chat_id).messages]
    final = dict(zip(API_OUTPUTS, regen.result(timeout=120)))
    assert "Done." in final["status"]
    assert [r for r, _ in texts(final["chatbot"])] == ["user", "assistant"] * 2
    assert [m["content"] for m in app.ctx.store.get(chat_id).messages][:3] == answered[:3]
