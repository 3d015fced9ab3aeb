"""The turns a page asked for that have not started yet: each message sent and each Regenerate click, from the
click to the start of its queued event.

The page's click runs a handler at once (`accept`, `regenerate_requested`), then Gradio queues the turn itself
(`chat`, `regenerate`, one at a time). Gradio reads the queued event's inputs from the page's shared components
when it queues the event, and a second click may have changed them by then (the hidden box that carries the
text, the Chats value), so the turn would decode another click's text or into another chat. Instead the click
records its text and chat here, and the queued event takes the page's oldest recorded turn of its kind: Gradio
may queue two events of a page in the other order, but the turns still run in the order their clicks reached
the app, which is the order the page showed them queued. Every click of the page is recorded and every queued
event takes one (a refused message too: it still gets its own refusal), so the two stay in step. A turn called
through the API without the page takes nothing and keeps the arguments it was called with.

Stop pressed on a page with no turn running or arrived takes back its oldest message still waiting to start
(`stop_message`; a Stop right after Send, before the turn's event began): the user stops what they just asked for.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass
class PageTurn:
    """One click's turn: the text sent (None for a Regenerate click) and the chat it chose."""

    chat_id: str | None
    text: str | None = None
    stopped: bool = False  # the page's Stop took it back before it started: it ends at once
    repeat: bool = False  # a Regenerate click while the page already regenerates that chat: it does nothing
    refused: bool = False  # more turns of the page wait than it may have: the click was not recorded

    @property
    def regenerate(self) -> bool:
        return self.text is None


class PageTurns:
    """Recorded turns per page session, oldest first. Bounded: a page keeps at most PER_PAGE waiting turns (a
    click beyond that is refused, its event told so), and PAGES pages are remembered (the least recently used
    is forgotten first; a page that goes away is forgotten at once)."""

    PER_PAGE = 64
    PAGES = 4096

    def __init__(self):
        self._lock = threading.Lock()
        self._pages: OrderedDict[str, deque[PageTurn]] = OrderedDict()

    def add(self, session: str | None, turn: PageTurn) -> bool:
        """Record a click's turn; False (nothing recorded) when the page already has PER_PAGE waiting."""
        if not session:
            return True  # no page to keep it for: the event reads its own inputs
        with self._lock:
            waiting = self._pages.setdefault(session, deque())
            self._pages.move_to_end(session)
            while len(self._pages) > self.PAGES:
                self._pages.popitem(last=False)
            if len(waiting) >= self.PER_PAGE:
                return False
            waiting.append(turn)
            return True

    def take(self, session: str | None, regenerate: bool) -> PageTurn | None:
        """The page's oldest waiting turn of this kind (a message, or a regenerate). A page with none left gets a
        turn marked `refused` (its click was not recorded); a session that is no page (an API client) gets None."""
        with self._lock:
            waiting = self._pages.get(session or "")
            if waiting is None:
                return None
            for turn in waiting:
                if turn.regenerate == regenerate:
                    waiting.remove(turn)
                    return turn
        return PageTurn(None, None if regenerate else "", refused=True)

    def regenerates(self, session: str | None, chat_id: str) -> bool:
        """Whether a regenerate of this chat clicked on this page waits to start (not taken back by Stop)."""
        with self._lock:
            return any(turn.regenerate and not turn.stopped and not turn.repeat and turn.chat_id == chat_id
                       for turn in self._pages.get(session or "", ()))

    def stop(self, session: str | None) -> int:
        """Stop pressed on this page: its regenerates that wait to start end at once when they start. Messages
        waiting in the queue are still answered, in order (nothing typed is lost). Returns how many it took back."""
        with self._lock:
            taken = [turn for turn in self._pages.get(session or "", ())
                     if turn.regenerate and not turn.stopped and not turn.repeat]
            for turn in taken:
                turn.stopped = True
        return len(taken)

    def stop_message(self, session: str | None) -> bool:
        """Stop pressed on a page with no turn running or arrived: its oldest message waiting to start (sent, its
        event not begun) ends when it starts, its text back in the box. Only that one: the box holds one text,
        and later messages are answered in order as ever. Whether there was one."""
        with self._lock:
            for turn in self._pages.get(session or "", ()):
                if turn.text and turn.text.strip() and not turn.stopped and not turn.refused:
                    turn.stopped = True
                    return True
        return False

    def drop_session(self, session: str) -> None:
        """The page went away: Gradio drops its queued events, so nothing will take its turns."""
        with self._lock:
            self._pages.pop(session, None)
