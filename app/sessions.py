"""Per-page state of the running app: the turns each browser session runs (Stop cancels them), the
messages queued per chat, the last canvas per chat (so the canvas follows the chat the user opens), and the
Regenerate clicks that wait for the answer being decoded."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from flash_dllm.app.live import LiveRun


@dataclass
class Queued:
    session: str
    text: str
    at: float = field(default_factory=time.time)


class Turn:
    """One chat turn (one or two runs). Stop ends the current run between steps and skips the next one."""

    def __init__(self):
        self.stopped = threading.Event()
        self.run: LiveRun | None = None

    def attach(self, run: LiveRun) -> None:
        self.run = run
        if self.stopped.is_set():
            run.stop()

    def stop(self) -> None:
        self.stopped.set()
        run = self.run
        if run is not None:
            run.stop()


class Sessions:
    """Running turns per browser session (Stop cancels them), the chats a turn is decoding, and messages
    queued per chat (shown while they wait for the engine, so a message sent during a generation is visibly
    kept). A queued message whose page went away (reload, closed tab) is not dropped: it is handed back by
    `drop_session` and saved into its chat as an unanswered question once no turn is decoding that chat."""

    def __init__(self):
        self._lock = threading.Lock()
        self.running: dict[str, set[Turn]] = {}
        self.pending: dict[str, list[Queued]] = {}
        self.busy: dict[str, int] = {}  # chat id -> turns decoding it now
        self.orphans: dict[str, list[str]] = {}  # chat id -> queued texts whose page went away
        self.started: dict[str, str] = {}  # session -> the chat its last message with no chat chosen started
        # turns finishing after their page went away -> the login that asked (None without --auth): a page of
        # that login with nothing of its own to stop stops them
        self.unattended: dict[Turn, str | None] = {}
        # turns whose message waits for its chat's previous answer (not decoding yet): Stop on their page ends them
        self.waiting: dict[str, set[Turn]] = {}
        # Messages are accepted one at a time: two sent in quick succession run concurrently, and the second must
        # see the chat the first one started.
        self.accepting = threading.Lock()

    def queue(self, chat_id: str, session: str, text: str) -> None:
        with self._lock:
            self.pending.setdefault(chat_id, []).append(Queued(session, text))

    def unqueue(self, chat_id: str, session: str | None, text: str) -> bool:
        with self._lock:
            items = self.pending.get(chat_id, [])
            for index, item in enumerate(items):
                if item.session == session and item.text == text:
                    del items[index]
                    return True
        return False

    def started_chat(self, session: str, chat_id: str) -> None:
        with self._lock:
            self.started[session] = chat_id

    def started_by(self, session: str) -> str | None:
        """The chat this page's last message started while no chat was chosen."""
        with self._lock:
            return self.started.get(session)

    def queued(self, chat_id: str) -> list[str]:
        with self._lock:
            return [item.text for item in self.pending.get(chat_id, [])] + list(self.orphans.get(chat_id, []))

    def drop_session(self, session: str, owner: str | None = None) -> None:
        """The page went away: its queued messages become orphans, and its running turns (which go on and save
        their answers) become stoppable by any page of its login (``owner``; None without --auth)."""
        with self._lock:
            for chat_id, items in self.pending.items():
                self.orphans.setdefault(chat_id, []).extend(item.text for item in items if item.session == session)
                items[:] = [item for item in items if item.session != session]
            for turn in self.running.pop(session, set()):
                self.unattended[turn] = owner
            self.waiting.pop(session, None)  # a waiting message goes on without its page, as a running turn does

    def take_orphans(self, chat_id: str) -> list[str]:
        """The orphaned queued texts of a chat nobody is decoding now (empty while a turn decodes it)."""
        with self._lock:
            if self.busy.get(chat_id):
                return []
            return self.orphans.pop(chat_id, [])

    def begin(self, session: str | None, chat_id: str, turn: Turn | None = None) -> Turn:
        """The turn starts decoding the chat. `turn`: the one registered when its event arrived (`begin_waiting`):
        it moves from waiting to running, so a Stop that reached it before it began still stops it."""
        turn = turn or Turn()
        with self._lock:
            self.waiting.get(session or "", set()).discard(turn)
            self.running.setdefault(session or "", set()).add(turn)
            self.busy[chat_id] = self.busy.get(chat_id, 0) + 1
        return turn

    def begin_waiting(self, session: str | None) -> Turn:
        """A turn that has arrived but does not decode yet (it waits for its chat to be free, or is still being
        set up): Stop on its page sets its `stopped` (it has no run yet)."""
        turn = Turn()
        with self._lock:
            self.waiting.setdefault(session or "", set()).add(turn)
        return turn

    def end_waiting(self, session: str | None, turn: Turn) -> None:
        with self._lock:
            self.waiting.get(session or "", set()).discard(turn)

    def is_busy(self, chat_id: str) -> bool:
        """Whether a turn is decoding this chat now."""
        with self._lock:
            return bool(self.busy.get(chat_id))

    def any_busy(self) -> bool:
        """Whether a turn is decoding any chat now (the page's turns decode one at a time, every page's)."""
        with self._lock:
            return any(self.busy.values())

    def stop_unattended(self, owner: str | None) -> int:
        """Stop the turns of this login whose pages went away; returns how many there were."""
        with self._lock:
            turns = [turn for turn, by in self.unattended.items() if by == owner]
        for turn in turns:
            turn.stop()
        return len(turns)

    def end(self, session: str | None, turn: Turn, chat_id: str) -> None:
        with self._lock:
            self.unattended.pop(turn, None)
            self.running.get(session or "", set()).discard(turn)
            self.busy[chat_id] = max(0, self.busy.get(chat_id, 0) - 1)

    def stop(self, session: str | None) -> int:
        """Stop every running or waiting turn of this session; returns how many there were."""
        with self._lock:
            turns = [*self.running.get(session or "", set()), *self.waiting.get(session or "", set())]
        for turn in turns:
            turn.stop()
        return len(turns)


@dataclass
class ChatCanvas:
    """What the canvas column showed after a chat's last turn: its recordings and stats."""

    recordings: list  # Canvas of run A (and B), replayable and exportable
    stats: list[str]


class Recordings:
    """The last turn's canvas per chat, so the canvas, stats and exports follow the chat the user opens instead
    of showing another chat's answer, also in a reloaded page or another tab. Who may see a chat's canvas is
    who may open the chat (the caller asks its login's chat store first). The most recent chats only: their
    recorded steps are kept in memory, not on disk."""

    KEPT = 32

    def __init__(self):
        self._lock = threading.Lock()
        self._by_chat: dict[str, ChatCanvas] = {}

    def keep(self, chat_id: str, views: list) -> None:
        shown = ChatCanvas([v.canvas for v in views], [v.stats_html() for v in views])
        with self._lock:
            self._by_chat.pop(chat_id, None)
            self._by_chat[chat_id] = shown
            while len(self._by_chat) > self.KEPT:
                self._by_chat.pop(next(iter(self._by_chat)))

    def get(self, chat_id: str | None) -> ChatCanvas | None:
        with self._lock:
            return self._by_chat.get(chat_id or "")

    def forget(self, chat_id: str) -> None:
        with self._lock:
            self._by_chat.pop(chat_id, None)


class RegenerateRequests:
    """Regenerate clicks that wait for the answer being decoded in their chat. Turns of the "gpu" group run one
    at a time, so such a regenerate waits in Gradio's queue, where its handler cannot say so: the page's click
    asks here first (`handlers.regenerate_requested`), and the turn decoding that chat says in its status that
    the regenerate waits, until the regenerate starts. Keyed by page session and chat; a page that goes away
    takes its requests with it, and its Stop takes them back. A click while that page's regenerate of the chat
    runs asks nothing: it is a repeat, which regenerates nothing (app/page_turns.py)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._asked: set[tuple[str, str]] = set()
        self._running: dict[tuple[str, str], int] = {}

    def ask(self, session: str | None, chat_id: str) -> bool:
        """Note a regenerate of this chat that waits; False (nothing noted) while this page regenerates it."""
        key = (session or "", chat_id)
        with self._lock:
            if self._running.get(key):
                return False
            self._asked.add(key)
            return True

    def running(self, session: str | None, chat_id: str) -> bool:
        """Whether this page's regenerate of the chat is decoding it (and was not stopped)."""
        with self._lock:
            return bool(self._running.get((session or "", chat_id)))

    def waiting(self, session: str | None, chat_id: str) -> bool:
        with self._lock:
            return (session or "", chat_id) in self._asked

    def start(self, session: str | None, chat_id: str | None) -> None:
        """This page's regenerate of the chat starts: it waits no more."""
        key = (session or "", chat_id or "")
        with self._lock:
            self._asked.discard(key)
            self._running[key] = self._running.get(key, 0) + 1

    def end(self, session: str | None, chat_id: str | None) -> None:
        key = (session or "", chat_id or "")
        with self._lock:
            self._asked.discard(key)
            left = self._running.get(key, 0) - 1
            if left > 0:
                self._running[key] = left
            else:
                self._running.pop(key, None)

    def stop(self, session: str | None) -> None:
        """The page's Stop: its waiting regenerates will not run, and a click from now on is a new regenerate
        even while the stopped one is still ending."""
        with self._lock:
            self._asked = {key for key in self._asked if key[0] != (session or "")}
            self._running = {key: n for key, n in self._running.items() if key[0] != (session or "")}

    def drop_session(self, session: str) -> None:
        with self._lock:
            self._asked = {key for key in self._asked if key[0] != session}
