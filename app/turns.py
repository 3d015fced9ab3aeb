"""Chat turns: the streamed `chat` and `regenerate` handlers (the per-session bookkeeping behind Stop, queued
messages and each chat's last canvas is app/sessions.py). Everything the page shows during a turn is folded
from engine events (app/live.py)."""
from __future__ import annotations

import html
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import gradio as gr

from flash_dllm.app.canvas import empty_canvas_html
from flash_dllm.app.chats import Chat, ChatStore, clean_text
from flash_dllm.app.live import FRAME_S, LiveRun, RunView
from flash_dllm.app.model_settings import DEFAULT_METHOD, DEFAULT_METHOD_B, page_settings
from flash_dllm.app.models import ModelHost, history_exchanges
from flash_dllm.app.page_turns import PageTurns
from flash_dllm.app.presets import KNOBS, build_settings
from flash_dllm.app.sessions import Recordings, RegenerateRequests, Sessions, Turn
from flash_dllm.engine import SettingsError

# Outputs of `chat` / `regenerate`, in order (app/ui.py wires components in this order).
OUTPUTS = ("chatbot", "chats", "canvas_a", "stats_a", "canvas_b", "stats_b", "answer_b", "status", "replay",
           "rec_a", "rec_b", "message")
MAX_MESSAGE_CHARS = 32_000


def save_orphans(ctx: "AppContext", chat_id: str) -> None:
    """Save a chat's orphaned queued messages as questions (the user finds them there and can Regenerate)."""
    for text in ctx.sessions.take_orphans(chat_id):
        try:
            ctx.store.add_message(chat_id, "user", text)
        except (KeyError, OSError):
            return  # the chat was deleted, or cannot be written: nothing left to keep it in


REGENERATE_WAITS = "Regenerate waits for the answer being decoded, then decodes it again"


@dataclass
class AppContext:
    host: ModelHost
    store: ChatStore
    sessions: Sessions = field(default_factory=Sessions)
    recordings: Recordings = field(default_factory=Recordings)
    regenerations: RegenerateRequests = field(default_factory=RegenerateRequests)
    page_turns: PageTurns = field(default_factory=PageTurns)  # what each click asked for, until its turn starts
    export_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="flash-dllm-export-")))
    share_note: str = ""
    frame_s: float = FRAME_S
    max_message_chars: int = MAX_MESSAGE_CHARS

    def for_request(self, request) -> "AppContext":
        """This context as one page request sees it: behind a login (--auth) its chats are the login's own
        (ChatStore.scoped); without one, every chat."""
        user = getattr(request, "username", None) if request is not None else None
        return replace(self, store=self.store.scoped(user)) if user else self


def chat_choices(store: ChatStore) -> list[tuple[str, str]]:
    return [(chat.title, chat.id) for chat in store.list()]


def chat_messages(chat: Chat | None, queued: list[str] = (), live: str | None = None) -> list[dict]:
    """Chatbot value: saved messages, the answer being decoded, then messages waiting in the queue."""
    out = [{"role": m["role"], "content": m["content"]} for m in (chat.messages if chat else [])]
    if live is not None:
        out.append({"role": "assistant", "content": live})
    for text in queued:
        out.append({"role": "user", "content": text})
        out.append({"role": "assistant", "content": "⏳ queued: waits for the answer being decoded"})
    return out


def chat_now(ctx: "AppContext", chat_id: str | None):
    """Chatbot value of a chat as it is now (its saved messages, then what is still queued for it); gr.skip()
    when there is no such chat."""
    if not chat_id:
        return gr.skip()
    try:
        return chat_messages(ctx.store.get(chat_id), ctx.sessions.queued(chat_id))
    except (KeyError, OSError):
        return gr.skip()


def drop_unused_chat(ctx: "AppContext", chat_id: str | None, session: str | None) -> bool:
    """Remove the chat a refused message of this page started, while it is still empty: the page's `accept`
    creates a chat for a first message before `chat` checks the message and its settings, and a refused first
    message leaves no empty chat behind (as an API call, refused before any chat is made, leaves none). A chat
    with messages, queued messages or a turn decoding it is kept, as is one this page did not start."""
    if not chat_id or not session or ctx.sessions.started_by(session) != chat_id:
        return False
    with ctx.sessions.accepting:  # no message of this page joins the chat meanwhile
        try:
            chat = ctx.store.get(chat_id)
            if chat.messages or ctx.sessions.queued(chat_id) or ctx.sessions.is_busy(chat_id):
                return False
            ctx.store.delete(chat_id)
        except (KeyError, OSError):
            return False
    ctx.recordings.forget(chat_id)
    return True


def note(text: str, kind: str = "") -> str:
    css = {"warn": " fd-warn", "error": " fd-error"}.get(kind, "")
    return f'<div class="fd-note{css}">{html.escape(text)}</div>'


def settings_meta(view: RunView, settings, model: str | None) -> dict:
    stats = view.stats
    return {"method": settings.method, "model": model or "",
            "tokens_per_s": round(stats.tokens_per_s, 2), "tokens_per_forward": round(stats.tokens_per_forward, 3),
            "steps": stats.steps, "forward_passes": stats.forward_passes, "elapsed_s": round(stats.elapsed_s, 3),
            "generated_tokens": stats.generated_tokens, "finish_reason": stats.finish_reason,
            "settings": settings.to_dict()}


def left_out_note(dropped: int, window: int | None) -> str:
    """The status's part that says what the answer did not see ("" when it saw the whole chat)."""
    if not dropped:
        return ""
    why = "to fit the model's context" if window is None else f"(this model reads the last {window} exchanges)"
    return f" · the {dropped} oldest messages were left out {why}"


def stop_note(views: list[RunView], kept: bool, regenerate: bool) -> str:
    if not views:  # Stop reached the turn before its first run
        return note("Stopped before it started: " + ("nothing was regenerated." if regenerate else
                                                      "nothing was kept, and your message is back in the box."), "warn")
    steps = views[0].stats.steps
    if kept:
        return note(f"Stopped after {steps} steps; the partial answer is kept.", "warn")
    if regenerate:
        return note(f"Stopped after {steps} steps, before any token was committed; the previous answer is "
                    "unchanged.", "warn")
    return note(f"Stopped after {steps} steps, before any token was committed: nothing was kept, and your "
                "message is back in the box.", "warn")


def loaded_model_methods(ctx: AppContext, method: str | None, method_b: str | None) -> tuple[str, str]:
    """``method`` and ``method_b``, each left empty replaced by the loaded model's first and comparison methods
    (the engine's defaults when no model is loaded: the turn then stops at "No model is loaded")."""
    if method and method_b:
        return method, method_b
    model = page_settings(ctx.host.engine)
    first = model.method if model else DEFAULT_METHOD
    second = model.method_b if model else DEFAULT_METHOD_B
    return method or first, method_b or second


def chat_turn(ctx: AppContext, message: str | None, chat_id: str | None, system: str, method: str,
              side_by_side: bool, method_b: str, knob_values: tuple, session: str | None, arrival: Turn,
              regenerate: bool = False):
    """Generator of output tuples (see OUTPUTS) for one streamed turn. When the page goes away mid-turn (a reload,
    a closed tab: Gradio closes this generator), the turn is finished on a thread of its own instead of being
    cancelled, so its answer is decoded and saved into the chat, where the reopened page finds it. `arrival`: the
    turn its page's Stop has reached since the event arrived (Sessions.begin_waiting; the caller ends it)."""
    page_gone = threading.Event()
    outputs = _turn_outputs(ctx, message, chat_id, system, method, side_by_side, method_b, knob_values, session,
                            regenerate, page_gone, arrival)
    regenerating = chat_id if regenerate and isinstance(chat_id, str) else None
    if regenerating:
        ctx.regenerations.start(session, regenerating)  # the answer it waited for (if any) is done
    try:
        for output in outputs:
            try:
                yield output
            except GeneratorExit:
                page_gone.set()
                threading.Thread(target=_finish_unseen, args=(outputs,), name="flash-dllm-turn", daemon=True).start()
                raise
    finally:
        if regenerating:
            ctx.regenerations.end(session, regenerating)


def _finish_unseen(outputs) -> None:
    for _ in outputs:
        pass


CHAT_BUSY_POLL_S = 0.1


def _wait_for_chat(ctx: AppContext, chat_id: str | None, session: str | None, page_gone: threading.Event, emit,
                   arrival: Turn, regenerate: bool = False):
    """Yield a status until no turn is decoding the chat: one whose page went away may still be finishing its
    answer, which must land in the chat before this turn adds a message (turns of the page run one at a time).
    Returns whether the page's Stop ended the wait (the message then never reaches the chat)."""
    if chat_id is None or not ctx.sessions.is_busy(chat_id):
        return False
    if not page_gone.is_set():
        what = "the regenerate" if regenerate else "this message"
        yield emit(status=note("Waiting for this chat's previous answer, still being decoded after its page was "
                               f"reloaded; {what} comes next (Stop takes it back)."))
    while ctx.sessions.is_busy(chat_id) and not arrival.stopped.is_set():
        time.sleep(CHAT_BUSY_POLL_S)
    return arrival.stopped.is_set()


def _turn_outputs(ctx: AppContext, message: str | None, chat_id: str | None, system: str, method: str,
                  side_by_side: bool, method_b: str, knob_values: tuple, session: str | None, regenerate: bool,
                  page_gone: threading.Event, arrival: Turn):
    values = {name: gr.skip() for name in OUTPUTS}

    def emit(**changes):
        values.update(changes)
        return tuple(values[name] for name in OUTPUTS)

    message = message if isinstance(message, str) else ""
    chat_id = chat_id if isinstance(chat_id, str) else None
    text = clean_text(message).strip()
    system = clean_text(system if isinstance(system, str) else "")
    knobs = dict(zip(KNOBS, knob_values, strict=True))
    # the page's `accept` showed the message queued in its chat (starting one for a first message)
    queued = not regenerate and bool(chat_id and session) and ctx.sessions.unqueue(chat_id, session, message)

    def refuse(status: str, give_back: bool = True):
        """The output of a turn that ends before it decodes: its status and, for a message, the message back in
        the box and the chat as it now is (no longer showing the message queued); the empty chat a refused first
        message started is removed again."""
        changes = {"status": status}
        if not regenerate:
            if give_back:
                changes["message"] = message
            if queued and drop_unused_chat(ctx, chat_id, session):
                changes.update(chats=gr.update(choices=chat_choices(ctx.store), value=None), chatbot=[])
            else:
                changes["chatbot"] = chat_now(ctx, chat_id)
        return emit(**changes)

    if not regenerate:
        if not text:
            yield refuse(note("Type a message first.", "warn"), give_back=False)
            return
        if len(text) > ctx.max_message_chars:
            yield refuse(note(f"The message is {len(text)} characters long; the limit is {ctx.max_message_chars}.",
                              "error"))
            return
    # an API call that names no method gets the loaded model's own (a block model refuses flash-cache)
    method, method_b = loaded_model_methods(ctx, method, method_b)
    try:
        settings = build_settings(method, **knobs)
        settings_b = build_settings(method_b, **knobs) if side_by_side else None
    except (SettingsError, ValueError, TypeError) as err:
        yield refuse(note(f"Setting not accepted: {err}", "error"))
        return
    if ctx.host.engine is None:
        yield refuse(note("No model is loaded: choose one under Model.", "error"))
        return
    if (yield from _wait_for_chat(ctx, chat_id, session, page_gone, emit, arrival, regenerate)):
        said = "nothing was regenerated" if regenerate else "your message is back in the box"
        yield emit(status=note(f"Stopped before it started: {said}. This chat's previous answer is still being "
                               "decoded; Stop again ends it.", "warn"),
                   message=gr.skip() if regenerate else message, chatbot=chat_now(ctx, chat_id))
        return
    try:
        if regenerate:
            chat = ctx.store.get(chat_id)  # never creates: an unknown id has nothing to regenerate
        else:
            chat = ctx.store.get_or_create(chat_id, system)
        if system != chat.system:
            chat.system = system
            ctx.store.save(chat)
    except KeyError:
        said = ("Nothing to regenerate: send a message first." if not chat_id else
                "Nothing to regenerate: that chat does not exist (any more).")
        yield refuse(note(said, "warn"), give_back=False)
        return
    except OSError as err:
        yield refuse(note(f"{err}", "error"))
        return
    if regenerate:
        replace = bool(chat.messages) and chat.messages[-1]["role"] == "assistant"
        history = chat.messages[:-1] if replace else list(chat.messages)
        if not history or history[-1]["role"] != "user":
            yield emit(status=note("Nothing to regenerate: send a message first.", "warn"))
            return
        shown = Chat(chat.id, chat.title, system=chat.system, messages=history)
        asked = history[-1]["content"]
    else:
        replace = False
        saved_before = (not queued and chat.messages and chat.messages[-1]["role"] == "user"
                        and chat.messages[-1]["content"] == text)  # saved when its page went away
        try:
            shown = chat if saved_before else ctx.store.add_message(chat.id, "user", text)
        except OSError as err:
            yield refuse(note(f"{err}", "error"))
            return
        asked = text
    prompt = shown.conversation()
    choices = gr.update(choices=chat_choices(ctx.store), value=chat.id)
    turn = ctx.sessions.begin(session, chat.id, arrival)  # a Stop since the event arrived stops it before any run
    runs = [("A", settings)] + ([("B", settings_b)] if settings_b is not None else [])
    views: list[RunView] = []
    failure, dropped, kept = None, 0, False
    values.update(canvas_b=empty_canvas_html("Side-by-side is off.") if settings_b is None else
                  empty_canvas_html("B starts when A is done (one generation at a time)."))
    ctx.host.gpu.acquire()
    try:
        engine = ctx.host.engine
        window = history_exchanges(ctx.host.name)
        prompt, dropped = engine.fit_conversation(prompt, settings, window)
        for label, run_settings in runs:
            if turn.stopped.is_set():
                break
            view = RunView(label, ctx.host.describe(), engine.device, prompt_text=asked)
            views.append(view)
            canvas_key, stats_key = ("canvas_a", "stats_a") if label == "A" else ("canvas_b", "stats_b")
            run = LiveRun(engine, prompt, run_settings, frame_s=ctx.frame_s,
                          on_submit=lambda request: ctx.host.label(request.id, "page"))
            turn.attach(run)
            run.start()
            try:
                for batch in run.frames():
                    view.fold(batch)
                    if page_gone.is_set():  # nobody sees the frames: only decode and fold
                        continue
                    live = None
                    if label == "A" and not view.done:
                        preview = view.canvas.answer_preview() if view.canvas else ""
                        live = (preview + " ▍") if preview else "▍"
                    waiting = view.waiting_note()
                    state = f"Decoding ({label}: {run_settings.method}) · step {view.stats.steps}" + (
                        f" · {waiting}" if waiting else "")
                    if ctx.regenerations.waiting(session, chat.id):  # this page clicked Regenerate meanwhile
                        state += f" · {REGENERATE_WAITS}"
                    updates = {canvas_key: view.canvas_html(), stats_key: view.stats_html(),
                               "status": note(state)}
                    updates["chatbot"] = chat_messages(shown, ctx.sessions.queued(chat.id), live)
                    updates["chats"] = choices
                    yield emit(**updates)
            finally:
                run.close()
            if view.error:
                failure = view.error
                break
            result = view.result
            if label == "A":
                # a stopped turn keeps what it committed; one stopped before any token leaves nothing behind
                if result is not None and (result.text or result.finish_reason != "cancelled"):
                    meta = settings_meta(view, run_settings, ctx.host.name)
                    shown = ctx.store.put_answer(chat.id, result.text, meta, replace)
                    kept = True
            else:
                values["answer_b"] = result.text if result is not None else ""
    except OSError as err:  # the chats folder became unwritable mid-turn
        failure = str(err)
    finally:
        ctx.host.gpu.release()
        ctx.sessions.end(session, turn, chat.id)
        save_orphans(ctx, chat.id)
    stopped = any(v.stats.finish_reason == "cancelled" for v in views) or (turn.stopped.is_set() and len(views) < len(runs))
    if not regenerate and not kept and (failure is not None or stopped) and not page_gone.is_set():
        try:  # the question goes back to the box, not into the chat (it would change the next answer)
            ctx.store.pop_last(chat.id, "user", text)
            shown = ctx.store.get(chat.id)
        except (KeyError, OSError):
            pass
        values["message"] = message
    if failure is not None:
        status = note(f"{failure}. The engine is ready for the next message.", "error")
    elif stopped:
        status = stop_note(views, kept, regenerate)
    else:
        parts = [f"{v.label}: {v.stats.generated_tokens} tokens in {v.stats.elapsed_s:.2f} s "
                 f"({v.stats.tokens_per_s:.1f} tok/s, {v.stats.tokens_per_forward:.2f} tokens/forward)" for v in views]
        status = note("Done. " + " · ".join(parts) + left_out_note(dropped, window))
    recordings = [v.canvas for v in views]
    if not page_gone.is_set():  # a page that went away has no canvas to come back to
        ctx.recordings.keep(chat.id, views)
    max_step = max((c.steps for c in recordings if c is not None), default=0)
    yield emit(
        chatbot=chat_messages(shown, ctx.sessions.queued(chat.id)),
        chats=gr.update(choices=chat_choices(ctx.store), value=chat.id),
        canvas_a=views[0].canvas_html() if views else gr.skip(),
        stats_a=views[0].stats_html() if views else gr.skip(),
        canvas_b=views[1].canvas_html() if len(views) > 1 else gr.skip(),
        stats_b=views[1].stats_html() if len(views) > 1 else gr.skip(),
        status=status,
        replay=gr.update(maximum=max(1, max_step), value=max_step, interactive=max_step > 0),
        rec_a=recordings[0] if recordings else None,
        rec_b=recordings[1] if len(recordings) > 1 else None,
    )
