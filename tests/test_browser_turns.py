"""The page's turns in a real browser (Debian's chromium through Playwright), clicked faster than they run:
messages sent in quick succession each get their own answer or refusal, a double click on Regenerate
regenerates once and leaves Stop plain, and Stop takes back a Regenerate still waiting for the answer being
decoded."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import shutil
import time

import pytest

from app_testing import STATUS, held_browser_site, open_llada_page  # noqa: E402

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")]
STOP_ARMED = "() => document.querySelector('#stop-btn').classList.contains('armed')"
ENDED = f"() => !({STOP_ARMED})()"  # every turn the page sent has ended (each arms Stop, each end disarms it)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    with held_browser_site(tmp_path_factory) as site:
        yield site


@pytest.fixture()
def page(site):
    site.engine.release.set()
    tab = open_llada_page(site)
    yield tab
    site.engine.release.set()
    tab.close()


def send(page, text: str) -> None:
    page.get_by_role("textbox", name="Message").fill(text)
    page.get_by_role("textbox", name="Message").press("Enter")


def answered_chat(site, page, question: str) -> str:
    """Send `question` into a new chat and wait for its answer; returns the chat's id."""
    send(page, question)
    page.wait_for_function(f"() => ({STATUS})().includes('Done.')", timeout=60_000)
    page.wait_for_function(ENDED, timeout=10_000)
    return next(c.id for c in site.ctx.store.list() if [m["content"] for m in c.messages][:1] == [question])


def wait_until(check, timeout=30.0) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.05)


def test_messages_sent_in_quick_succession_each_get_their_own_turn(site, page):
    """An empty message, a whitespace one and one over the size limit, sent within a second: the page ends on
    the size limit with the long message back in the box. Then two questions sent at once are both answered,
    in the order sent, in the chat the first one started."""
    long_text = "y" * (site.ctx.max_message_chars + 8000)
    for text in ("", "   ", long_text):
        send(page, text)
    page.wait_for_function(f"() => ({STATUS})().includes('the limit is')", timeout=15_000)
    page.wait_for_function(ENDED, timeout=10_000)
    assert "the limit is" in page.evaluate(STATUS)  # no empty message's refusal came after it
    assert page.get_by_role("textbox", name="Message").input_value() == long_text
    send(page, "first of two")
    page.wait_for_function("() => document.querySelector('#message textarea').value === ''", timeout=30_000)
    send(page, "second of two")  # as soon as the box is free again: the first turn may not have started yet

    def saved() -> list[list[str]]:
        return [[m["content"] for m in c.messages] for c in site.ctx.store.list()]

    wait_until(lambda: any(texts[:1] == ["first of two"] and len(texts) == 4 for texts in saved()), timeout=60)
    page.wait_for_function(ENDED, timeout=10_000)
    chat = next(texts for texts in saved() if texts[:1] == ["first of two"])
    assert chat[2] == "second of two", saved()


def test_a_double_click_on_regenerate_regenerates_once_and_leaves_stop_plain(site, page):
    chat_id = answered_chat(site, page, "regenerate me once")
    site.engine.release.clear()  # the regenerate waits: the second click surely comes while it is in flight
    regenerate = page.get_by_role("button", name="Regenerate")
    regenerate.click()
    wait_until(lambda: site.ctx.sessions.is_busy(chat_id))
    regenerate.click()
    page.wait_for_timeout(500)  # the second click's handler has run
    assert page.evaluate(STOP_ARMED)
    site.engine.release.set()
    page.wait_for_function(f"() => ({STATUS})().includes('Done.')", timeout=60_000)
    page.wait_for_function(ENDED, timeout=10_000)  # the dropped click of old left Stop armed for good
    assert [m["role"] for m in site.ctx.store.get(chat_id).messages] == ["user", "assistant"]


def test_stop_takes_back_a_regenerate_waiting_for_the_answer_being_decoded(site, page):
    chat_id = answered_chat(site, page, "keep my answer")
    answer = site.ctx.store.get(chat_id).messages[1]
    site.engine.release.clear()
    send(page, "stop this one")
    wait_until(lambda: site.ctx.sessions.is_busy(chat_id))
    page.get_by_role("button", name="Regenerate").click()
    page.wait_for_function(f"() => ({STATUS})().includes('Regenerate waits')", timeout=30_000)
    page.get_by_role("button", name="Stop").click()
    wait_until(lambda: not site.ctx.sessions.is_busy(chat_id))  # the message's turn is stopped and over
    site.engine.release.set()  # a regenerate that still ran would now decode
    page.wait_for_function(ENDED, timeout=60_000)
    assert "Stopped before it started: nothing was regenerated." in page.evaluate(STATUS)
    messages = site.ctx.store.get(chat_id).messages
    assert [m["content"] for m in messages] == ["keep my answer", answer["content"]] and messages[1] == answer
    assert page.get_by_role("textbox", name="Message").input_value() == "stop this one"
