"""Each turn of a page is the one its click asked for: messages sent in quick succession each decode their own
text into their own chat (refused ones each get their own refusal), Regenerate clicks never leave Stop armed,
and Stop takes back a regenerate still waiting in the queue. The handlers are called in the order Gradio runs
them for the page: every click's handler at once (`accept`, `regenerate_requested`), its queued turn later."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from types import SimpleNamespace

import pytest
import torch

from flash_dllm.app import handlers, ui
from flash_dllm.app.chats import ChatStore
from flash_dllm.app.models import LoadOptions, ModelHost
from flash_dllm.app.page_turns import PageTurn, PageTurns
from flash_dllm.app.turns import OUTPUTS, AppContext
from flash_dllm.engine import Engine
from flash_dllm.engine.tiny import TinySpec, write_tiny_model

SHORT = dict(gen_length=32, block_length=16)
LONG = dict(method="llada", gen_length=384, block_length=64, steps=0)
REFUSED = dict(gen_length=100, block_length=32)  # a setting the turn refuses before it decodes


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada", TinySpec("llada"))
    try:
        yield AppContext(ModelHost(Engine.load(str(folder), device="cpu"), LoadOptions(device="cpu"),
                                   name=str(folder)), ChatStore(tmp_path_factory.mktemp("home") / "chats"))
    finally:
        torch.set_num_threads(threads)


def last(outputs) -> dict:
    *_, final = outputs
    return dict(zip(OUTPUTS, final))


def contents(ctx, chat_id) -> list[str]:
    return [m["content"] for m in ctx.store.get(chat_id).messages]


def test_two_messages_sent_before_either_turn_starts_each_decode_their_own(ctx):
    """Two messages into two chats, both accepted before the first turn starts: by then the page's hidden box
    holds the second text and Chats the second chat, which is what both queued events read. Each turn still
    answers its own text in its own chat, in the order they were sent."""
    page = SimpleNamespace(session_hash="page-two-chats")
    first, second = ctx.store.create(), ctx.store.create()
    handlers.accept(ctx, "first question", first.id, page)
    *_, box = handlers.accept(ctx, "second question", second.id, page)
    shown = [last(handlers.chat(ctx, box, second.id, "", request=page, **SHORT)) for _ in range(2)]
    assert all("Done." in out["status"] for out in shown)
    assert [out["chats"]["value"] for out in shown] == [first.id, second.id]
    assert contents(ctx, first.id)[0] == "first question" and len(contents(ctx, first.id)) == 2
    assert contents(ctx, second.id)[0] == "second question" and len(contents(ctx, second.id)) == 2


def test_refused_messages_sent_in_quick_succession_each_get_their_own_refusal(ctx):
    """What was seen once: an empty message, a whitespace one, then one over the size limit, sent within a
    second. Each turn answers for its own message: the long one gets the size limit and goes back to the box."""
    page = SimpleNamespace(session_hash="page-refused-in-a-row")
    long_text = "x" * (ctx.max_message_chars + 8000)
    for text in ("", "   ", long_text):
        *_, box = handlers.accept(ctx, text, None, page)
    outs = [last(handlers.chat(ctx, box, None, "", request=page, **SHORT)) for _ in range(3)]
    assert ["Type a message first" in out["status"] for out in outs] == [True, True, False]
    assert "the limit is" in outs[2]["status"] and outs[2]["message"] == long_text
    assert handlers.gr.skip() == outs[0]["message"] == outs[1]["message"]  # nothing of theirs to give back


def test_a_turn_called_through_the_api_keeps_its_own_arguments(ctx):
    """A client's `chat` has no click behind it: the message it passes is the one decoded, whatever pages
    have recorded meanwhile."""
    handlers.accept(ctx, "a page's message", None, SimpleNamespace(session_hash="page-beside-a-client"))
    out = last(handlers.chat(ctx, "the client's message", None, "", request=SimpleNamespace(session_hash="client"),
                             **SHORT))
    assert "Done." in out["status"] and contents(ctx, out["chats"]["value"])[0] == "the client's message"
    ctx.page_turns.drop_session("page-beside-a-client")


def test_a_page_keeps_a_bounded_number_of_waiting_turns(ctx):
    """Past PER_PAGE waiting turns a message is not taken: it stays in the box and its turn says so, and the
    turns before it still get their own messages."""
    page = SimpleNamespace(session_hash="page-flooded")
    ctx.page_turns.PER_PAGE = 2
    try:
        taken = [handlers.accept(ctx, text, None, page) for text in ("one", "two", "three")]
        assert [accepted[0] for accepted in taken] == ["", "", handlers.gr.skip()]  # "three" stays in the box
        outs = [last(handlers.chat(ctx, "three", None, "", request=page, **REFUSED)) for _ in range(3)]
    finally:
        del ctx.page_turns.PER_PAGE
    assert [out["message"] for out in outs[:2]] == ["one", "two"]
    assert "was not sent" in outs[2]["status"] and outs[2]["message"] == handlers.gr.skip()
    turns = PageTurns()
    turns.PAGES = 2
    for session in ("a", "b", "c"):
        turns.add(session, PageTurn(None, "hi"))
    assert turns.take("a", regenerate=False) is None  # forgotten: the least recently used page
    assert turns.take("c", regenerate=False).text == "hi" and turns.take("c", regenerate=False).refused


def test_stop_takes_back_a_regenerate_waiting_in_the_queue(ctx):
    """Regenerate clicked while another answer decodes waits in the queue; Stop stops that answer and takes the
    regenerate back: when its turn comes it ends at once, and the chat keeps its answer. A Regenerate clicked
    after Stop regenerates."""
    page = SimpleNamespace(session_hash="page-stop-regenerate")
    handlers.accept(ctx, "one", None, page)
    chat_id = last(handlers.chat(ctx, "one", None, "", request=page, **SHORT))["chats"]["value"]
    answered = contents(ctx, chat_id)
    handlers.accept(ctx, "two", chat_id, page)
    turn = handlers.chat(ctx, "two", chat_id, "", request=page, **LONG)
    for output in turn:
        if "Decoding" in str(dict(zip(OUTPUTS, output))["status"]):
            break
    try:
        waits = handlers.regenerate_requested(ctx, chat_id, page)
        said = handlers.stop(ctx, page)
    finally:  # the stopped turn runs to its end however the checks go
        statuses = [str(dict(zip(OUTPUTS, output))["status"]) for output in turn]
    assert "Regenerate waits" in waits
    assert "Stopping between steps" in said and "The Regenerate waiting its turn will not run." in said
    assert "Stopped" in statuses[-1] and not any("Regenerate waits" in s for s in statuses)
    kept = contents(ctx, chat_id)
    assert kept[:2] == answered
    regen = [dict(zip(OUTPUTS, output)) for output in handlers.regenerate(ctx, chat_id, request=page, **SHORT)]
    assert len(regen) == 1 and "Stopped before it started: nothing was regenerated." in regen[0]["status"]
    assert {name for name, value in regen[0].items() if value != handlers.gr.skip()} == {"status"}
    assert contents(ctx, chat_id) == kept
    assert "Nothing is being generated" in handlers.stop(ctx, page)  # nothing left to take back
    handlers.regenerate_requested(ctx, chat_id, page)  # after Stop: a new regenerate
    assert "Done." in last(handlers.regenerate(ctx, chat_id, request=page, **SHORT))["status"]


def test_stop_with_only_a_waiting_regenerate_says_it_will_not_run(ctx):
    page, other = SimpleNamespace(session_hash="page-waits"), SimpleNamespace(session_hash="page-decodes")
    handlers.accept(ctx, "one", None, page)
    chat_id = last(handlers.chat(ctx, "one", None, "", request=page, **SHORT))["chats"]["value"]
    turn = handlers.chat(ctx, "another user's long answer", None, "", request=other, **LONG)
    for output in turn:
        if "Decoding" in str(dict(zip(OUTPUTS, output))["status"]):
            break
    try:
        handlers.regenerate_requested(ctx, chat_id, page)
        said = handlers.stop(ctx, page)
    finally:
        list(turn)
    assert "The Regenerate waiting its turn will not run." in said and "Stopping" not in said
    assert "Stopped before it started" in last(handlers.regenerate(ctx, chat_id, request=page, **SHORT))["status"]


def test_every_event_of_a_click_that_arms_stop_runs_on_every_click(tmp_path):
    """The page arms Stop on every Send and Regenerate click and disarms it after each turn: an event the page
    drops while the previous one is in flight (trigger mode "once") would leave Stop armed."""
    demo = ui.build_ui(AppContext(ModelHost(), ChatStore(tmp_path / "chats")))
    by_name = {fn.api_name: fn for fn in demo.fns.values()}
    arming = [fn for fn in demo.fns.values() if fn.js == ui.ARM_STOP]
    clicks = {target for fn in arming for target in fn.targets}
    assert len(arming) == 2 and len(clicks) == 3  # Enter and Send, Regenerate
    on_click = [fn for fn in demo.fns.values() if set(fn.targets) & clicks]
    chained = [by_name[name] for name in ("chat", "regenerate")]
    assert {fn.api_name for fn in on_click} >= {"queue_message", "regenerate_requested"}
    assert all(fn.trigger_mode == "multiple" for fn in on_click + chained)
    for name, first in (("chat", "queue_message"), ("regenerate", "regenerate_requested")):
        assert by_name[name].trigger_after == by_name[first]._id  # the turn is queued after its click's record


def test_stop_right_after_send_takes_the_message_back_before_its_turn_arrives(ctx):
    """Stop pressed after the page showed the message but before its queued event started: the message is taken
    back (Stop says so), and when its event comes it ends at once with the text in the box and nothing saved.
    A second message of the page, sent after, is answered as ever."""
    page = SimpleNamespace(session_hash="page-stop-early")
    handlers.accept(ctx, "stop me at once", None, page)
    handlers.accept(ctx, "answer me", None, page)
    said = handlers.stop(ctx, page)
    assert "Stopped before it started: your message goes back in the box." in said
    out = last(handlers.chat(ctx, "answer me", None, "", request=page, **SHORT))
    assert "Stopped before it started: nothing was kept" in out["status"] and out["message"] == "stop me at once"
    answered = last(handlers.chat(ctx, "answer me", None, "", request=page, **SHORT))
    assert "Done." in answered["status"]
    texts = contents(ctx, answered["chats"]["value"])
    assert "stop me at once" not in texts and texts[0] == "answer me" and len(texts) == 2
    assert "Nothing is being generated" in handlers.stop(ctx, page)


def test_stop_while_a_turn_sets_up_stops_it_before_its_first_run(ctx, monkeypatch):
    """Stop pressed after the turn's event arrived but before it began decoding (here: while it opens its chat)
    reaches it: it ends before its first run, its message back in the box and not saved."""
    page = SimpleNamespace(session_hash="page-stop-setting-up")
    handlers.accept(ctx, "stopped while setting up", None, page)
    opened, said = ctx.store.get_or_create, []

    def open_then_stop(*args, **kwargs):
        said.append(handlers.stop(ctx, page))
        return opened(*args, **kwargs)

    monkeypatch.setattr(ctx.store, "get_or_create", open_then_stop)
    out = last(handlers.chat(ctx, "stopped while setting up", None, "", request=page, **SHORT))
    monkeypatch.setattr(ctx.store, "get_or_create", opened)
    assert "Stopping between steps" in said[0]
    assert "Stopped before it started: nothing was kept" in out["status"]
    assert out["message"] == "stopped while setting up"
    assert not any("stopped while setting up" in m["content"] for c in ctx.store.list() for m in c.messages)
    assert "Nothing is being generated" in handlers.stop(ctx, page)  # the turn left no registration behind
