"""Chats behind a login (--auth): each login sees and changes only the chats it made, so people who share one
link never read each other's chats; without a login the machine's one user sees every chat, as before."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from gradio_client import Client

from flash_dllm.app import handlers
from flash_dllm.app.chats import ChatStore, OwnedChats
from flash_dllm.app.launch import serve
from flash_dllm.app.models import LoadOptions, ModelHost
from flash_dllm.app.turns import AppContext
from flash_dllm.engine import Engine
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from app_testing import free_port  # noqa: E402


def test_a_login_sees_and_changes_only_its_own_chats(tmp_path):
    store = ChatStore(tmp_path)
    mine = store.scoped("ann").create(system="Be brief.")
    store.scoped("ann").add_message(mine.id, "user", "ann's question")
    theirs = store.scoped("bob").create()
    before_login = store.create()
    ann = store.scoped("ann")
    assert isinstance(ann, OwnedChats) and store.scoped(None) is store and store.scoped("") is store
    assert [c.id for c in ann.list()] == [mine.id]
    assert {c.id for c in store.list()} == {mine.id, theirs.id, before_login.id}  # no login: everything
    for other in (theirs.id, before_login.id):
        for attempt in (lambda: ann.get(other), lambda: ann.rename(other, "mine now"), lambda: ann.delete(other),
                        lambda: ann.add_message(other, "user", "hi"), lambda: ann.pop_last(other, "user"),
                        lambda: ann.put_answer(other, "hi"), lambda: ann.save(store.get(other))):
            with pytest.raises(KeyError):
                attempt()
        assert store.get(other).messages == [] and store.get(other).title == "New chat"
    assert ann.get_or_create(theirs.id).id not in (theirs.id, before_login.id)  # a new chat of ann's instead
    saved = json.loads((tmp_path / f"{mine.id}.json").read_text())
    assert saved["owner"] == "ann"
    reopened = ChatStore(tmp_path)  # after a restart the owner is still known
    assert reopened.get(mine.id).owner == "ann" and reopened.get(before_login.id).owner == ""
    assert mine.id in {c.id for c in reopened.scoped("ann").list()}
    assert mine.id not in {c.id for c in reopened.scoped("bob").list()}
    ann.rename(mine.id, "Renamed")
    ann.delete(mine.id)
    assert mine.id not in {c.id for c in store.list()}


def test_the_page_handlers_scope_chats_by_the_requests_login(tmp_path):
    store = ChatStore(tmp_path / "chats")
    ctx = AppContext(ModelHost(), store)
    ann = SimpleNamespace(username="ann", session_hash="s-ann")
    bob = SimpleNamespace(username="bob", session_hash="s-bob")
    chats_update, _, _ = handlers.new_chat(ctx, "", ann)
    ann_chat = chats_update["value"]
    store.scoped("ann").rename(ann_chat, "ann's plans")
    assert handlers.on_load(ctx, bob)[1]["choices"] == []
    assert [value for _, value in handlers.on_load(ctx, ann)[1]["choices"]] == [ann_chat]
    assert [value for _, value in handlers.on_load(ctx, None)[1]["choices"]] == [ann_chat]  # no login
    _, _, status = handlers.open_chat(ctx, ann_chat, bob)
    assert "no longer exists" in status
    assert handlers.open_chat(ctx, "ann's plans", bob) == (handlers.gr.skip(),) * 3  # by title: bob has none
    _, _, status = handlers.delete_chat(ctx, ann_chat, bob)
    assert "no longer exists" in status and store.get(ann_chat).title == "ann's plans"
    assert "error" in handlers.rename_chat(ctx, ann_chat, "bob's now", bob)[2]
    assert handlers.export_chat(ctx, ann_chat, "md", bob)[0] is None
    assert store.get(ann_chat).title == "ann's plans"
    _, _, status = handlers.open_chat(ctx, ann_chat, ann)
    assert "Opened" in status
    # a page load reopens only a chat of the login's own (a tab shared by two logins remembers ann's chat)
    assert handlers.reopen_chat(ctx, ann_chat, "", bob) == (handlers.gr.skip(),) * (4 + len(handlers.CANVAS_OUTPUTS))
    assert handlers.reopen_chat(ctx, ann_chat, "", ann)[0]["value"] == ann_chat


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory):
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    home = tmp_path_factory.mktemp("home")
    folder = write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llada", TinySpec("llada"))
    engine = Engine.load(str(folder), device="cpu")
    ctx = AppContext(ModelHost(engine, LoadOptions(device="cpu"), name=str(folder)), ChatStore(home / "chats"))
    demo = serve(ctx, port=free_port(), auth=[("ann", "ann-pw"), ("bob", "bob-pw")])
    try:
        yield SimpleNamespace(url=demo.local_url, home=home)
    finally:
        demo.close()
        torch.set_num_threads(saved_threads)


def test_two_logins_on_one_served_page_do_not_see_each_others_chats(shared_app):
    ann = Client(shared_app.url, auth=("ann", "ann-pw"), verbose=False)
    bob = Client(shared_app.url, auth=("bob", "bob-pw"), verbose=False)
    outputs = ann.predict(message="ann's secret", gen_length=32, block_length=16, api_name="/chat")
    chat_id = outputs[1]["value"] if isinstance(outputs[1], dict) else outputs[1]
    assert ChatStore(shared_app.home / "chats").get(chat_id).owner == "ann"
    chats, _, _ = bob.predict("", api_name="/new_chat")  # the Chats list as bob's page gets it
    assert chat_id not in json.dumps(chats) and len(chats["choices"]) == 1
    chatbot, _, status = bob.predict(chat_id, api_name="/open_chat")
    assert "no longer exists" in status and "ann's secret" not in json.dumps(chatbot)
    bob_chat = chats["value"]
    _, _, status = bob.predict(chat_id, api_name="/delete_chat")
    assert ChatStore(shared_app.home / "chats").get(chat_id).messages  # still there
    chatbot, _, status = ann.predict(chat_id, api_name="/open_chat")
    assert "ann's secret" in json.dumps(chatbot)
    chats, _, _ = ann.predict("", api_name="/new_chat")
    assert chat_id in json.dumps(chats) and bob_chat not in json.dumps(chats)
