"""Chats on disk: one JSON file per chat under ``<data_dir>/chats``, written atomically.

A chat is ``{"id", "title", "created", "updated", "system", "messages": [{"role", "content", "meta"?}],
"owner"}``
with plain-string content (what the user typed, what the engine decoded); ``meta`` holds an answer's
method and speed. Unreadable files are skipped (and named in `ChatStore.problems`), never overwritten.
A save writes ``.tmp-*.json`` and renames it over ``<id>.json``; only ``<id>.json`` files are chats, and a
temp file a killed process left behind is removed when the store opens.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

TITLE_CHARS = 48
CHAT_ID = re.compile(r"[0-9a-f]{32}")
CHAT_FILE = re.compile(r"[0-9a-f]{32}\.json")
STALE_TEMP_S = 60.0  # a write-and-rename takes milliseconds; an older temp file belongs to a process that died


class ChatSaveError(OSError):
    """A chat that could not be written; the message names the folder and the reason."""


def clean_text(text) -> str:
    """Text as the app stores it: a lone UTF-16 surrogate (a browser can send one; no file can hold it)
    becomes U+FFFD, so the rest of what was typed is kept."""
    text = "" if text is None else str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@dataclass
class Chat:
    id: str
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    system: str = ""
    messages: list[dict] = field(default_factory=list)
    owner: str = ""  # the login that made it ("": made without a login; see ChatStore.scoped)

    def conversation(self) -> list[dict]:
        """Messages for the engine, as {"role", "content": str}: the system prompt first (if any), then the
        turns."""
        head = [{"role": "system", "content": self.system}] if self.system.strip() else []
        return head + [{"role": m["role"], "content": message_text(m["content"])} for m in self.messages]

    def to_dict(self) -> dict:
        return asdict(self)


def message_text(content) -> str:
    """A message's text: a string as is; Gradio 6 content parts ([{"type": "text", "text": ...}, ...]) joined,
    so the engine only ever sees plain strings."""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


class ChatStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.problems: list[str] = []
        self._lock = threading.RLock()
        self.remove_stale_temp_files()

    def remove_stale_temp_files(self) -> None:
        for path in self.folder.glob(".tmp-*.json"):
            try:
                if time.time() - path.stat().st_mtime > STALE_TEMP_S:
                    path.unlink()
            except OSError:
                pass  # read-only folder, or another process removed it first

    def _path(self, chat_id: str) -> Path:
        if not isinstance(chat_id, str) or not CHAT_ID.fullmatch(chat_id):
            raise KeyError(f"no chat with id {chat_id!r}")
        return self.folder / f"{chat_id}.json"

    def _read(self, path: Path) -> Chat | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return Chat(id=data["id"], title=data.get("title", "Chat"), created=data.get("created", 0.0),
                        updated=data.get("updated", 0.0), system=data.get("system", ""),
                        messages=[m for m in data.get("messages", []) if m.get("role") in ("user", "assistant")],
                        owner=str(data.get("owner") or ""))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            note = f"{path.name}: {err}"
            if note not in self.problems:
                self.problems.append(note)
            return None

    def list(self) -> list[Chat]:
        """Every readable chat, most recently updated first."""
        with self._lock:
            files = [p for p in self.folder.glob("*.json") if CHAT_FILE.fullmatch(p.name)]
            chats = [c for c in (self._read(p) for p in files) if c is not None]
        return sorted(chats, key=lambda c: c.updated, reverse=True)

    def get(self, chat_id: str) -> Chat:
        with self._lock:
            path = self._path(chat_id)
            chat = self._read(path) if path.exists() else None
        if chat is None:
            raise KeyError(f"no chat with id {chat_id!r}")
        return chat

    def scoped(self, owner: str | None) -> "ChatStore | OwnedChats":
        """The chats one login may see and change: with a login (``owner``), only the chats it made; without
        one (the app has no --auth), every chat, as the machine's one user expects."""
        return OwnedChats(self, owner) if owner else self

    def create(self, title: str = "New chat", system: str = "", owner: str = "") -> Chat:
        chat = Chat(id=uuid.uuid4().hex, title=title, system=system, owner=owner)
        self.save(chat)
        return chat

    def get_or_create(self, chat_id: str | None, system: str = "") -> Chat:
        return existing_or_new(self, chat_id, system)

    def save(self, chat: Chat) -> None:
        chat.updated = time.time()
        chat.title, chat.system = clean_text(chat.title), clean_text(chat.system)
        for message in chat.messages:
            if isinstance(message.get("content"), str):
                message["content"] = clean_text(message["content"])
        text = json.dumps(chat.to_dict(), ensure_ascii=False, indent=1)
        with self._lock:
            path = self._path(chat.id)
            try:
                fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
            except OSError as err:
                raise ChatSaveError(f"cannot save chats in {self.folder}: {err.strerror or err}") from None
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text)
                os.replace(tmp, path)
            except OSError as err:
                Path(tmp).unlink(missing_ok=True)
                raise ChatSaveError(f"cannot save chats in {self.folder}: {err.strerror or err}") from None
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def rename(self, chat_id: str, title: str) -> Chat:
        title = " ".join((title or "").split())
        if not title:
            raise ValueError("a chat title cannot be empty")
        with self._lock:
            chat = self.get(chat_id)
            chat.title = title[:200]
            self.save(chat)
        return chat

    def delete(self, chat_id: str) -> None:
        with self._lock:
            self._path(chat_id).unlink(missing_ok=True)

    def add_message(self, chat_id: str, role: str, content: str, meta: dict | None = None) -> Chat:
        with self._lock:
            chat = self.get(chat_id)
            message = {"role": role, "content": content}
            if meta:
                message["meta"] = meta
            chat.messages.append(message)
            if role == "user" and chat.title == "New chat":
                chat.title = title_from(content) or "New chat"
            self.save(chat)
        return chat

    def pop_last(self, chat_id: str, role: str, content: str | None = None) -> bool:
        """Remove the last message if it has this role (and content); True when one was removed."""
        with self._lock:
            chat = self.get(chat_id)
            if not chat.messages:
                return False
            last = chat.messages[-1]
            if last["role"] != role or (content is not None and last["content"] != content):
                return False
            chat.messages.pop()
            if not chat.messages:
                chat.title = "New chat"  # the title came from the message taken back
            self.save(chat)
        return True

    def put_answer(self, chat_id: str, content: str, meta: dict | None = None, replace: bool = False) -> Chat:
        """Append an assistant answer, or (regenerate) replace the trailing one."""
        with self._lock:
            chat = self.get(chat_id)
            if replace and chat.messages and chat.messages[-1]["role"] == "assistant":
                chat.messages.pop()
            message = {"role": "assistant", "content": content}
            if meta:
                message["meta"] = meta
            chat.messages.append(message)
            self.save(chat)
        return chat


class OwnedChats:
    """A ChatStore seen by one login (the page's --auth): it lists, opens and changes only the chats that login
    made; another login's chat, or one made without a login, reads as absent (KeyError), as a deleted one does.
    Several people behind one share link therefore never see each other's chats."""

    def __init__(self, store: ChatStore, owner: str):
        self.store, self.owner = store, owner
        self.folder, self.problems = store.folder, store.problems

    def _check(self, chat_id: str) -> None:
        self.get(chat_id)

    def list(self) -> list[Chat]:
        return [chat for chat in self.store.list() if chat.owner == self.owner]

    def get(self, chat_id: str) -> Chat:
        chat = self.store.get(chat_id)
        if chat.owner != self.owner:
            raise KeyError(f"no chat with id {chat_id!r}")
        return chat

    def create(self, title: str = "New chat", system: str = "") -> Chat:
        return self.store.create(title, system, owner=self.owner)

    def get_or_create(self, chat_id: str | None, system: str = "") -> Chat:
        return existing_or_new(self, chat_id, system)

    def save(self, chat: Chat) -> None:
        with self.store._lock:
            self._check(chat.id)
            self.store.save(chat)

    def rename(self, chat_id: str, title: str) -> Chat:
        with self.store._lock:
            self._check(chat_id)
            return self.store.rename(chat_id, title)

    def delete(self, chat_id: str) -> None:
        with self.store._lock:
            self._check(chat_id)
            self.store.delete(chat_id)

    def add_message(self, chat_id: str, role: str, content: str, meta: dict | None = None) -> Chat:
        with self.store._lock:
            self._check(chat_id)
            return self.store.add_message(chat_id, role, content, meta)

    def pop_last(self, chat_id: str, role: str, content: str | None = None) -> bool:
        with self.store._lock:
            self._check(chat_id)
            return self.store.pop_last(chat_id, role, content)

    def put_answer(self, chat_id: str, content: str, meta: dict | None = None, replace: bool = False) -> Chat:
        with self.store._lock:
            self._check(chat_id)
            return self.store.put_answer(chat_id, content, meta, replace)


def existing_or_new(chats: "ChatStore | OwnedChats", chat_id: str | None, system: str) -> Chat:
    """The chat chat_id names when those chats hold it, else a new one (a stale or foreign id starts afresh)."""
    if chat_id:
        try:
            return chats.get(chat_id)
        except KeyError:
            pass
    return chats.create(system=system)


def to_markdown(chat: Chat) -> str:
    lines = [f"# {chat.title}", ""]
    if chat.system.strip():
        lines += ["**System:**", "", chat.system.strip(), ""]
    for message in chat.messages:
        who = "User" if message["role"] == "user" else "Assistant"
        meta = message.get("meta") or {}
        note = ""
        if meta.get("method"):
            note = f" _({meta['method']}, {meta.get('tokens_per_s', 0):.1f} tok/s)_"
        lines += [f"**{who}:**{note}", "", message["content"], ""]
    return "\n".join(lines)


def to_json(chat: Chat) -> str:
    return json.dumps(chat.to_dict(), ensure_ascii=False, indent=2)


def export_file(chat: Chat, fmt: str, folder: str | Path) -> Path:
    """Write the chat as Markdown ("md") or JSON ("json") into ``folder``; returns the file."""
    if fmt not in ("md", "json"):
        raise ValueError(f"export format must be md or json (got {fmt!r})")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", chat.title).strip("-")[:60] or "chat"
    path = Path(folder) / f"{stem}-{chat.id[:8]}.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_markdown(chat) if fmt == "md" else to_json(chat), encoding="utf-8")
    return path
