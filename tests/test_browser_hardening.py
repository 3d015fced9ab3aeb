"""Issue 20's page items in a real browser (Debian's chromium through Playwright): a message sent while a turn
decodes is answered and saved, Stop before any token keeps nothing, the canvas follows the chosen chat,
closing the Chats dropdown changes nothing, a lone surrogate leaves no empty chat, the prompt tail is the
user's words. Then: a reload reopens the chat the tab was in (a new tab opens none), a
message queued when the page reloads is shown and saved in the reopened chat, and Delete, Rename and Export
are inert while no chat is chosen."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import shutil
import time

import pytest

from app_testing import STATUS, held_browser_site, open_llada_page  # noqa: E402

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")]
FINISHED = f"() => /Done|Stopped|ready for the next|not accepted/.test(({STATUS})())"
NEW_CHAT = f"() => ({STATUS})().trim() === 'New chat.'"  # the note of New chat (a chat may be titled so)


def an_earlier_chat(ctx, folder) -> None:
    """A chat from before: every new page opens one (see `page`)."""
    ctx.host.folder = str(folder)
    earlier = ctx.store.create()
    ctx.store.add_message(earlier.id, "user", "a chat from an earlier visit")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with held_browser_site(tmp_path_factory, an_earlier_chat) as site:
        yield site


def new_chat(tab) -> None:
    tab.get_by_role("button", name="New chat").click()  # each test starts in a new chat of its own
    tab.wait_for_function(NEW_CHAT, timeout=30_000)


@pytest.fixture()
def page(site):
    site.engine.release.set()
    tab = open_llada_page(site, new_chat)
    yield tab
    tab.close()


def send(page, text: str, with_button: bool = False) -> None:
    page.get_by_role("textbox", name="Message").fill(text)
    if with_button:
        page.get_by_role("button", name="Send").click()
    else:
        page.get_by_role("textbox", name="Message").press("Enter")


def saved_texts(ctx) -> list[list[str]]:
    return [[m["content"] for m in chat.messages] for chat in ctx.store.list()]


@pytest.mark.parametrize("with_button", [False, True])
def test_a_message_sent_while_decoding_is_answered_and_saved(site, page, with_button):
    ctx, _, _, engine, _ = site
    engine.release.clear()  # the first turn waits: the second message is surely sent while it decodes
    first, second = f"first {with_button}", f"second {with_button}"
    send(page, first, with_button)
    page.wait_for_function("() => /queued|Decoding|▍/.test(document.body.innerText)", timeout=30_000)
    send(page, second, with_button)
    page.wait_for_function(f"() => document.body.innerText.includes('{second}')", timeout=30_000)
    engine.release.set()
    deadline = time.time() + 120
    while time.time() < deadline and not any(texts[:1] == [first] and len(texts) == 4 for texts in saved_texts(ctx)):
        time.sleep(0.2)
    chat = next(texts for texts in saved_texts(ctx) if texts[:1] == [first])
    assert len(chat) == 4 and chat[2] == second  # both asked and answered, in order
    page.wait_for_function(FINISHED, timeout=60_000)
    page.reload()
    page.get_by_role("textbox", name="Message").wait_for(timeout=30_000)
    assert any(texts[:1] == [first] and texts[2] == second for texts in saved_texts(ctx) if len(texts) == 4)


def test_stop_before_any_token_keeps_nothing_and_gives_the_message_back(site, page):
    ctx, _, _, engine, _ = site
    engine.release.clear()
    send(page, "stop me at once")
    page.wait_for_function("() => document.body.innerText.includes('stop me at once')", timeout=30_000)
    page.get_by_role("button", name="Stop").click()
    page.wait_for_function(FINISHED, timeout=60_000)
    status = page.evaluate(STATUS)
    assert "nothing was kept" in status and "partial answer is kept" not in status
    assert page.get_by_role("textbox", name="Message").input_value() == "stop me at once"
    assert not any("stop me at once" in texts for texts in saved_texts(ctx))


def test_the_canvas_follows_the_chat_and_closing_the_dropdown_changes_nothing(site, page):
    ctx, _, _, _, _ = site
    send(page, "tell me about owls please")
    page.wait_for_function(FINISHED, timeout=60_000)
    prompt = page.inner_text("#canvas-a .fd-prompt")
    assert "owls please" in prompt and "<|" not in prompt
    page.get_by_role("button", name="New chat").click()
    page.wait_for_function("() => !document.querySelector('#canvas-a .fd-cells')", timeout=30_000)
    assert "owls" not in page.inner_text("#canvas-a")
    page.get_by_label("Chats").click()
    page.get_by_role("option", name="tell me about owls please").click()
    page.wait_for_function("() => !!document.querySelector('#canvas-a .fd-cells')", timeout=30_000)
    assert "owls please" in page.inner_text("#canvas-a .fd-prompt")
    page.get_by_label("Chats").click()  # open the dropdown, then click elsewhere
    page.mouse.click(900, 30)
    time.sleep(1.0)
    assert "no longer exists" not in page.evaluate(STATUS)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete").click()
    page.wait_for_function("() => /Deleted/.test(document.querySelector('#status').textContent)", timeout=30_000)
    page.wait_for_function("() => !document.querySelector('#canvas-a .fd-cells')", timeout=30_000)


def test_a_lone_surrogate_in_the_page_is_kept_and_leaves_no_empty_chat(site, page):
    ctx, _, _, _, _ = site
    before = {chat.id for chat in ctx.store.list() if not chat.messages}
    page.evaluate("""() => {
        const box = document.querySelector('#message textarea');
        box.value = 'half ' + String.fromCharCode(0xD800) + ' pair';
        box.dispatchEvent(new Event('input', {bubbles: true}));
    }""")
    page.get_by_role("textbox", name="Message").press("Enter")
    page.wait_for_function(FINISHED, timeout=60_000)
    assert any(texts[:1] == ["half \ufffd pair"] for texts in saved_texts(ctx))
    assert {chat.id for chat in ctx.store.list() if not chat.messages} <= before


def shown(page) -> dict:
    """What the page shows of its chat: the chosen chat's title, the messages, the status, the canvas."""
    return {"chat": page.get_by_label("Chats").input_value(), "users": page.get_by_test_id("user").all_inner_texts(),
            "bots": page.get_by_test_id("bot").all_inner_texts(), "status": page.evaluate(STATUS),
            "cells": page.evaluate("() => !!document.querySelector('#canvas-a .fd-cells')"),
            "stats": page.inner_text("#stats-a")}


def reload_and_wait(page, words: str) -> None:
    page.reload(wait_until="load")
    page.get_by_role("textbox", name="Message").wait_for(timeout=30_000)
    page.wait_for_function(f"() => ({STATUS})().includes({words!r})", timeout=30_000)


def test_a_reload_reopens_the_chat_the_tab_was_in(site, page):
    """Reloaded, the tab shows the chat it was in (not the most recently updated one) as choosing it would:
    its messages, its status, Delete usable, and the canvas of its last answer (the app keeps it per chat). A
    new tab, which was in no chat, opens none (the chats stay listed), so its first message starts a new chat."""
    ctx, url, browser, _, errors = site
    send(page, "reload keeps me here")
    page.wait_for_function(FINISHED, timeout=60_000)
    chat = next(c for c in ctx.store.list() if [m["content"] for m in c.messages][:1] == ["reload keeps me here"])
    later = ctx.store.create()
    ctx.store.add_message(later.id, "user", "a chat updated later")
    reload_and_wait(page, "Opened “reload keeps me here”")
    after = shown(page)
    assert after["chat"] == "reload keeps me here" and after["users"] == ["reload keeps me here"]
    assert after["bots"] == [chat.messages[1]["content"]]
    assert after["cells"] and "Live stats" in after["stats"]
    assert page.get_by_role("button", name="Delete", exact=True).is_enabled()
    fresh = browser.new_page(viewport={"width": 1500, "height": 1000})  # a context of its own: a new tab
    fresh.on("pageerror", lambda err: errors.append(str(err)))
    try:
        fresh.goto(url, wait_until="load")
        fresh.get_by_role("textbox", name="Message").wait_for(timeout=30_000)
        fresh.wait_for_timeout(1500)  # the load events have run: a reopen would have shown by now
        opened = shown(fresh)
        assert not opened["chat"] and opened["users"] == [] and "Opened" not in opened["status"]
        assert not fresh.get_by_role("button", name="Delete", exact=True).is_enabled()
    finally:
        fresh.close()
        ctx.store.delete(later.id)
    page.get_by_role("button", name="New chat").click()  # New chat is as it was: an empty chat, kept on reload
    page.wait_for_function(NEW_CHAT, timeout=30_000)
    reload_and_wait(page, "Opened “New chat”")
    assert shown(page)["users"] == []


def test_a_message_queued_when_the_page_reloads_is_in_the_reopened_chat(site, page):
    """Nothing typed is lost across a reload: the reopened chat shows the queued message, which is saved into it
    as its unanswered question once the turn decoding that chat ends."""
    ctx, _, _, engine, _ = site
    engine.release.clear()  # the first turn waits: the second message is surely queued when the page reloads
    send(page, "asked before the reload")
    page.wait_for_function("() => /queued|Decoding|▍/.test(document.body.innerText)", timeout=30_000)
    send(page, "queued at the reload")
    page.wait_for_function("() => document.body.innerText.includes('queued at the reload')", timeout=30_000)
    reload_and_wait(page, "Opened “asked before the reload”")
    assert shown(page)["users"] == ["asked before the reload", "queued at the reload"]
    engine.release.set()
    deadline = time.time() + 60
    while time.time() < deadline and not any(texts[:1] == ["asked before the reload"]
                                             and texts[-1:] == ["queued at the reload"] for texts in saved_texts(ctx)):
        time.sleep(0.2)
    assert any(texts[:1] == ["asked before the reload"] and texts[-1:] == ["queued at the reload"]
               for texts in saved_texts(ctx))
    reload_and_wait(page, "no answer yet")
    assert shown(page)["users"][-1] == "queued at the reload"


def test_an_answer_being_decoded_when_the_page_reloads_is_finished_and_saved(site, page):
    """A reload mid-answer does not cancel the answer: the turn finishes without its page and saves the answer
    into the chat, which the reloaded tab reopens (saying the answer is on its way while it is); a message sent
    into that chat meanwhile waits for it, so the chat keeps its order."""
    ctx, _, _, engine, _ = site
    engine.release.clear()  # the turn waits before its first step: the reload surely comes mid-turn
    send(page, "answer me after the reload")
    page.wait_for_function("() => /Decoding|▍/.test(document.body.innerText)", timeout=30_000)
    reload_and_wait(page, "still being decoded")
    assert shown(page)["users"] == ["answer me after the reload"] and shown(page)["bots"] == ["⏳ being decoded"]
    send(page, "and then this")  # into the reopened chat, while its first answer is still pending
    page.wait_for_function(f"() => ({STATUS})().includes('Waiting for this chat')", timeout=30_000)
    engine.release.set()
    page.wait_for_function(FINISHED, timeout=120_000)
    chat = next(texts for texts in saved_texts(ctx) if texts[:1] == ["answer me after the reload"])
    assert len(chat) == 4 and chat[2] == "and then this" and chat[1] and chat[3], chat
    reload_and_wait(page, "Opened “answer me after the reload”")
    assert shown(page)["bots"] == [chat[1], chat[3]]


def test_the_reloaded_page_can_stop_the_answer_its_reload_left_running(site, page):
    """Reloading to get out of a long answer must still be able to end it: the answer goes on without its page,
    and the reloaded page's Stop stops it (nothing was committed, so nothing is kept and the question stays,
    unanswered, for Regenerate)."""
    ctx, _, _, engine, _ = site
    engine.release.clear()
    send(page, "stop me after the reload")
    page.wait_for_function("() => /Decoding|▍/.test(document.body.innerText)", timeout=30_000)
    reload_and_wait(page, "still being decoded")
    chat_id = next(c.id for c in ctx.store.list() if [m["content"] for m in c.messages] == ["stop me after the reload"])
    deadline = time.time() + 10
    while time.time() < deadline and not ctx.sessions.unattended:  # the old page's unload hands its turn over
        time.sleep(0.05)
    page.get_by_role("button", name="Stop").click()
    page.wait_for_function(f"() => ({STATUS})().includes('Stopping between steps')", timeout=30_000)
    deadline = time.time() + 30
    while time.time() < deadline and ctx.sessions.is_busy(chat_id):
        time.sleep(0.1)
    assert not ctx.sessions.is_busy(chat_id) and not ctx.sessions.unattended
    assert [m["content"] for m in ctx.store.get(chat_id).messages] == ["stop me after the reload"]
    engine.release.set()


def test_stop_takes_back_a_message_waiting_for_the_answer_a_reload_left_running(site, page):
    """A message sent into a chat whose answer goes on without its page waits for that answer; Stop on the page
    takes the waiting message back (into the box, never into the chat) and leaves the answer running, which a
    second Stop would end."""
    ctx, _, _, engine, _ = site
    engine.release.clear()
    send(page, "keep decoding me")
    page.wait_for_function("() => /Decoding|▍/.test(document.body.innerText)", timeout=30_000)
    reload_and_wait(page, "still being decoded")
    chat_id = next(c.id for c in ctx.store.list() if [m["content"] for m in c.messages] == ["keep decoding me"])
    send(page, "never mind this one")
    page.wait_for_function(f"() => ({STATUS})().includes('Waiting for this chat')", timeout=30_000)
    page.get_by_role("button", name="Stop").click()
    page.wait_for_function(f"() => ({STATUS})().includes('Stopped before it started')", timeout=30_000)
    assert page.get_by_role("textbox", name="Message").input_value() == "never mind this one"
    assert ctx.sessions.is_busy(chat_id)  # the earlier answer was not stopped with it
    engine.release.set()
    deadline = time.time() + 60
    while time.time() < deadline and ctx.sessions.is_busy(chat_id):
        time.sleep(0.1)
    messages = ctx.store.get(chat_id).messages
    assert [m["role"] for m in messages] == ["user", "assistant"] and messages[0]["content"] == "keep decoding me"
    assert not any(ctx.sessions.waiting.values())


def test_delete_is_inert_while_no_chat_is_chosen(site, page):
    delete = page.get_by_role("button", name="Delete", exact=True)
    page.wait_for_function("() => !!document.querySelector('#delete-chat.stop')", timeout=30_000)
    assert delete.is_enabled() and "stop" in delete.get_attribute("class")  # the new chat is chosen
    page.once("dialog", lambda dialog: dialog.accept())
    delete.click()
    page.wait_for_function(f"() => /Deleted/.test(({STATUS})())", timeout=30_000)
    page.wait_for_function("() => !document.querySelector('#delete-chat.stop')", timeout=30_000)
    assert not delete.is_enabled() and "stop" not in delete.get_attribute("class")
    assert page.get_by_label("Chats").input_value() == ""
    page.get_by_role("button", name="New chat").click()
    page.wait_for_function(NEW_CHAT, timeout=30_000)
    page.wait_for_function("() => !!document.querySelector('#delete-chat.stop')", timeout=30_000)
    assert delete.is_enabled()


# Rename (its box and its button) and Export, as the page draws them: usable or not
RENAME_EXPORT = ("() => [document.querySelector('#rename-box input, #rename-box textarea'),"
                 " document.querySelector('#rename-chat'), document.querySelector('#export-chat')]"
                 ".map(el => !!el && !el.disabled)")


def rename_and_export(page) -> dict:
    box = page.get_by_label("Rename chat to")
    return {"box": box.is_editable(), "Rename": page.get_by_role("button", name="Rename", exact=True).is_enabled(),
            "Export": page.get_by_role("button", name="Export", exact=True).is_enabled()}


def test_rename_and_export_are_inert_while_no_chat_is_chosen(site, page):
    """As Delete: usable while a chat is chosen (a new one, one answered, one reopened by a reload), inert once
    it is deleted and in a new tab, which opens none."""
    ctx, url, browser, _, errors = site
    usable, inert = dict.fromkeys(("box", "Rename", "Export"), True), dict.fromkeys(("box", "Rename", "Export"), False)
    page.wait_for_function(f"() => ({RENAME_EXPORT})().every(Boolean)", timeout=30_000)
    assert rename_and_export(page) == usable  # the new chat is chosen
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Delete", exact=True).click()
    page.wait_for_function(f"() => /Deleted/.test(({STATUS})())", timeout=30_000)
    page.wait_for_function(f"() => !({RENAME_EXPORT})().some(Boolean)", timeout=30_000)
    assert rename_and_export(page) == inert and page.get_by_label("Chats").input_value() == ""
    box_opacity = "() => getComputedStyle(document.querySelector('#rename-box input, #rename-box textarea')).opacity"
    assert page.evaluate(box_opacity) == "0.5"  # faded as Gradio fades the inert buttons: it does not look typeable
    send(page, "name me later")  # a message with no chat chosen starts one, and chooses it
    page.wait_for_function(FINISHED, timeout=60_000)
    page.wait_for_function(f"() => ({RENAME_EXPORT})().every(Boolean)", timeout=30_000)
    assert rename_and_export(page) == usable
    reload_and_wait(page, "Opened “name me later”")
    page.wait_for_function(f"() => ({RENAME_EXPORT})().every(Boolean)", timeout=30_000)
    assert rename_and_export(page) == usable
    page.get_by_label("Rename chat to").fill("renamed in the page")
    page.get_by_role("button", name="Rename", exact=True).click()
    page.wait_for_function(f"() => ({STATUS})().includes('Renamed to')", timeout=30_000)
    assert any(chat.title == "renamed in the page" for chat in ctx.store.list())
    fresh = browser.new_page(viewport={"width": 1500, "height": 1000})  # a new tab: no chat chosen
    fresh.on("pageerror", lambda err: errors.append(str(err)))
    try:
        fresh.goto(url, wait_until="load")
        fresh.get_by_role("textbox", name="Message").wait_for(timeout=30_000)
        fresh.wait_for_timeout(1500)  # the load events have run: a reopen would have enabled them by now
        assert fresh.get_by_label("Chats").input_value() == "" and rename_and_export(fresh) == inert
    finally:
        fresh.close()
