"""The page's event handlers: module-level functions of the app context, wired to components in app/ui.py.

A handler that needs the app takes the `AppContext` first; app/ui.py binds it (`bind`) and Gradio sees the
rest of the signature. The parameter names and defaults of `chat` and `regenerate` are their public API (gradio_client
calls them by name), so they stay as they are.
"""
from __future__ import annotations

import html
import threading
import time

import gradio as gr

from flash_dllm.app.canvas import empty_canvas_html
from flash_dllm.app.chats import CHAT_ID, clean_text, export_file
from flash_dllm.app.export import export_gif, export_html
from flash_dllm.app.model_settings import fixed_block_length
from flash_dllm.app.models import model_purpose
from flash_dllm.app.page_turns import PageTurn, PageTurns
from flash_dllm.app.presets import default_knobs, matching_preset, preset_values
from flash_dllm.app.stats import stats_rows, stats_table
from flash_dllm.app.turns import (OUTPUTS, REGENERATE_WAITS, AppContext, chat_choices, chat_messages, chat_turn,
                                  note, save_orphans)
from flash_dllm.engine import METHODS, memory_snapshot

PRESET_KNOBS = ("block_length", "steps", "threshold", "gamma", "window", "lookahead", "track")
K0 = default_knobs()


# ---------------------------------------------------------------------------- page fragments
def system_html(ctx: AppContext, title: str = "Engine") -> str:
    """Memory and the engine's identity (the stats panel before the first answer, and the sidebar)."""
    engine = ctx.host.engine
    device = engine.device if engine is not None else None
    return stats_table(stats_rows(None, memory_snapshot(device), ctx.host.describe()), title)


def banner_html(ctx: AppContext) -> str:
    info = ctx.host.describe()
    model = html.escape(str(info.get("model", "no model loaded")))
    extra = f"<div class='fd-note fd-warn'>{html.escape(ctx.share_note)}</div>" if ctx.share_note else ""
    purpose = model_purpose(ctx.host.name)
    about = f"<div class='fd-note' id='model-purpose'>{html.escape(model)}: {html.escape(purpose)}</div>" if purpose else ""
    return (f"<div><b style='font-size:1.25em'>flash-dllm-chat</b> &nbsp;·&nbsp; {model} on "
            f"{html.escape(str(info.get('device', '–')))} &nbsp;·&nbsp; the canvas shows every cell of the answer "
            f"as the model denoises it</div>{about}{extra}")


# ---------------------------------------------------------------------------- chat turns
def accept(ctx: AppContext, text, chat_id, request: gr.Request):
    """Clear the box, show the message as queued, and record it for its `chat` turn (which may wait its turn):
    that turn takes its text and chat from the record (app/page_turns.py), never from the page's components,
    which a message sent next may change first. Every message is recorded, an empty one too (its turn says so)."""
    ctx = ctx.for_request(request)
    text = clean_text(text if isinstance(text, str) else "")
    chosen = chat_id if isinstance(chat_id, str) and chat_id else None
    session = request.session_hash
    turn = PageTurn(chosen, text)
    if not ctx.page_turns.add(session, turn) or not text.strip():  # the box keeps it; its turn says why
        return gr.skip(), gr.skip(), gr.skip(), ""
    with ctx.sessions.accepting:
        if chosen is None:  # the page may not know yet the chat its previous message started (sent moments ago)
            chosen = chat_awaiting_answer(ctx, ctx.sessions.started_by(session))
        turn.chat_id = chosen
        try:
            chat = ctx.store.get_or_create(chosen)
        except OSError:  # the chats folder cannot be written: `chat` says so and puts the message back in the box
            return gr.skip(), gr.skip(), gr.skip(), text
        if chosen is None:
            ctx.sessions.started_chat(session, chat.id)
        turn.chat_id = chat.id  # before `chat` can take it: that event is chained after this one
        ctx.sessions.queue(chat.id, session, text)
    return ("", gr.update(choices=chat_choices(ctx.store), value=chat.id),
            chat_messages(chat, ctx.sessions.queued(chat.id)), text)


def chat_awaiting_answer(ctx: AppContext, chat_id: str | None) -> str | None:
    """chat_id when that chat still exists and has no answer yet (empty, or ending with the user's message)."""
    if chat_id is None:
        return None
    try:
        messages = ctx.store.get(chat_id).messages
    except KeyError:
        return None
    return chat_id if not messages or messages[-1]["role"] == "user" else None


def chat(ctx: AppContext, message, chat_id=None, system="", method=None, side_by_side=False,
         method_b=None, gen_length=K0["gen_length"], block_length=K0["block_length"], steps=K0["steps"],
         threshold=K0["threshold"], gamma=K0["gamma"], temperature=K0["temperature"], window=K0["window"],
         lookahead=K0["lookahead"], track=K0["track"], max_candidates=K0["max_candidates"], seed=K0["seed"],
         request: gr.Request = None):
    knobs = (gen_length, block_length, steps, threshold, gamma, temperature, window, lookahead, track,
             max_candidates, seed)
    session = request.session_hash if request else None
    arrival = ctx.sessions.begin_waiting(session)  # the page's Stop reaches this turn from now on (see `stop`)
    try:
        turn = ctx.page_turns.take(session, regenerate=False)  # the page's message: what `accept` recorded
        if turn is not None and turn.refused:
            yield status_only(note(f"{TOO_MANY} the message was not sent; it is still in the box.", "warn"))
            return
        if turn is not None:
            message, chat_id = turn.text, turn.chat_id
            if turn.stopped:  # Stop came before this event did: the turn ends before its first run
                arrival.stop()
        yield from chat_turn(ctx.for_request(request), message, chat_id, system, method, side_by_side, method_b,
                             knobs, session, arrival)
    finally:
        ctx.sessions.end_waiting(session, arrival)


def regenerate(ctx: AppContext, chat_id, system="", method=None, side_by_side=False,
               method_b=None, gen_length=K0["gen_length"], block_length=K0["block_length"],
               steps=K0["steps"], threshold=K0["threshold"], gamma=K0["gamma"],
               temperature=K0["temperature"], window=K0["window"], lookahead=K0["lookahead"],
               track=K0["track"], max_candidates=K0["max_candidates"], seed=K0["seed"],
               request: gr.Request = None):
    knobs = (gen_length, block_length, steps, threshold, gamma, temperature, window, lookahead, track,
             max_candidates, seed)
    session = request.session_hash if request else None
    arrival = ctx.sessions.begin_waiting(session)  # the page's Stop reaches this turn from now on (see `stop`)
    try:
        turn = ctx.page_turns.take(session, regenerate=True)  # the page's click: what `regenerate_requested` recorded
        if turn is not None and (turn.refused or turn.stopped or turn.repeat):
            said = (f"{TOO_MANY} this Regenerate was not taken." if turn.refused else
                    "Stopped before it started: nothing was regenerated." if turn.stopped else None)
            yield status_only(note(said, "warn") if said else gr.skip())  # a repeated click changes nothing
            return
        if turn is not None:
            chat_id = turn.chat_id
        yield from chat_turn(ctx.for_request(request), None, chat_id, system, method, side_by_side, method_b, knobs,
                             session, arrival, regenerate=True)
    finally:
        ctx.sessions.end_waiting(session, arrival)


TOO_MANY = f"More than {PageTurns.PER_PAGE} turns of this page wait for the engine:"
ANOTHER_DECODES = "Regenerate waits: another chat's answer is being decoded (one at a time); it starts after that."


def status_only(status) -> tuple:
    """The output of a page's turn that ends before it starts: its status, nothing else changed."""
    return tuple(status if name == "status" else gr.skip() for name in OUTPUTS)


def regenerate_requested(ctx: AppContext, chat_id, request: gr.Request = None):
    """The page's Regenerate click, before its queued `regenerate` event: records the click's chat for that
    event (app/page_turns.py). A click while this page already regenerates that chat (queued or decoding) is
    recorded as a repeat, whose event changes nothing: a double click regenerates once. While the chosen chat's
    answer is being decoded, the regenerate waits in the "gpu" queue (one turn at a time) and then decodes the
    chat's last answer again, replacing the one decoded meanwhile. The status says so now, and the turn decoding
    the chat keeps saying so (`RegenerateRequests`) until the regenerate starts, as a message sent meanwhile is
    shown queued. While another chat's answer decodes, the status says the regenerate waits for it (the
    regenerate's own first output replaces that line when it starts)."""
    ctx = ctx.for_request(request)
    session = request.session_hash if request is not None else None
    chosen = resolve_chat_choice(ctx, chat_id)
    repeat = chosen is not None and (ctx.page_turns.regenerates(session, chosen)
                                     or ctx.regenerations.running(session, chosen))
    asked = chosen if chosen is not None or not isinstance(chat_id, str) else chat_id  # unknown: its turn says so
    if not ctx.page_turns.add(session, PageTurn(asked, repeat=repeat)) or chosen is None or repeat:
        return gr.skip()
    if not ctx.sessions.is_busy(chosen):
        # another chat's answer (this page's or another user's) holds the one turn that decodes at a time
        return note(ANOTHER_DECODES) if ctx.sessions.any_busy() else gr.skip()
    ctx.regenerations.ask(session, chosen)
    return note(f"{REGENERATE_WAITS}.")


def stop(ctx: AppContext, request: gr.Request):
    """Stop this page's turns, and take back its regenerates still waiting in the queue (each ends at once when
    its turn comes; messages waiting there are still answered). With no turn of its own decoding or waiting for
    its chat, Stop ends the turns of its login that go on after their page went away (a reload mid-answer: the
    reloaded page's Stop still reaches that answer)."""
    session = request.session_hash if request else None
    stopped = ctx.sessions.stop(session)
    taken = ctx.page_turns.stop(session)
    ctx.regenerations.stop(session)  # none waits now: the decoding turn stops saying so
    message_back = False
    if not stopped:
        # the message just sent, whose event has not arrived yet: it ends when it does, its text back in the box.
        # Its event registers (sessions) before it takes its record (page_turns), so one that did both since
        # the first look is seen by the second.
        message_back = ctx.page_turns.stop_message(session)
        stopped = message_back or ctx.sessions.stop(session)
    if not stopped:
        stopped = ctx.sessions.stop_unattended(getattr(request, "username", None))
    said = "Stopping between steps…" if stopped else "Nothing is being generated."
    if message_back:
        said = "Stopped before it started: your message goes back in the box."
    if taken:
        said = f"{'Stopping between steps… ' if stopped else ''}The Regenerate waiting its turn will not run."
    return note(said, "warn")


# ---------------------------------------------------------------------------- canvas replay and export
def replay_at(step, recording_a, recording_b):
    step = int(step or 0)
    a = recording_a.at_step(step).render() if recording_a is not None else gr.skip()
    b = recording_b.at_step(step).render() if recording_b is not None else gr.skip()
    return a, b


def export_canvas(ctx: AppContext, kind: str, recording_a, recording_b):
    if recording_a is None:
        raise gr.Error("Nothing to export yet: send a message first.")
    folder = ctx.export_dir / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{threading.get_ident() % 10000}"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for tag, recording in (("a", recording_a), ("b", recording_b)):
        if recording is None:
            continue
        name = f"denoising-{tag}-{recording.method}.{kind}"
        write = export_gif if kind == "gif" else export_html
        files.append(str(write(recording, folder / name)))
    return gr.update(value=files, visible=True)


def export_canvas_gif(ctx: AppContext, a, b):
    return export_canvas(ctx, "gif", a, b)


def export_canvas_html(ctx: AppContext, a, b):
    return export_canvas(ctx, "html", a, b)


# ---------------------------------------------------------------------------- chats
def resolve_chat_choice(ctx: AppContext, value) -> str | None:
    """The chat id a Chats dropdown value stands for. Closing the open dropdown sends what its box shows (a
    title, or nothing) rather than an id; a title that names exactly one chat stands for that chat."""
    if not isinstance(value, str) or not value.strip():
        return None
    if CHAT_ID.fullmatch(value):
        return value
    matches = [c.id for c in ctx.store.list() if c.title == value.strip()]
    return matches[0] if len(matches) == 1 else None


def may_open(ctx: AppContext, chat_id: str) -> bool:
    """Whether this request's login sees the chat (ctx: ctx.for_request)."""
    try:
        ctx.store.get(chat_id)
    except (KeyError, OSError):
        return False
    return True


def open_chat(ctx: AppContext, chat_id, request: gr.Request = None):
    ctx = ctx.for_request(request)
    chat_id = resolve_chat_choice(ctx, chat_id)
    if chat_id is None:  # nothing chosen (the dropdown closed without a choice): leave the page as it is
        return gr.skip(), gr.skip(), gr.skip()
    try:
        chat = ctx.store.get(chat_id)
    except KeyError:
        return [], "", note("That chat no longer exists.", "warn")
    unanswered = bool(chat.messages) and chat.messages[-1]["role"] == "user"
    decoding = unanswered and ctx.sessions.is_busy(chat.id)  # e.g. asked by this tab before it was reloaded
    if decoding:
        status = note(f"Opened “{chat.title}”. Its answer is still being decoded and will be saved here: open the "
                      "chat again in a moment to see it.")
    elif unanswered:
        status = note(f"Opened “{chat.title}”. Its last message has no answer yet: press Regenerate to answer it.",
                      "warn")
    else:
        status = note(f"Opened “{chat.title}”.")
    live = "⏳ being decoded" if decoding else None
    return chat_messages(chat, ctx.sessions.queued(chat.id), live), chat.system, status


CANVAS_OUTPUTS = ("canvas_a", "stats_a", "canvas_b", "stats_b", "answer_b", "replay", "rec_a", "rec_b",
                  "chat_file", "canvas_files")


def chat_canvas(ctx: AppContext, chat_id, request: gr.Request = None):
    """The canvas column for the chat now chosen (see CANVAS_OUTPUTS): its last answer's canvas, stats and
    recordings while the app keeps them (any page of a login that may open the chat), else empty; exports of
    another chat are hidden."""
    ctx = ctx.for_request(request)
    chat_id = resolve_chat_choice(ctx, chat_id)
    shown = ctx.recordings.get(chat_id) if chat_id and may_open(ctx, chat_id) else None
    hidden = gr.update(value=None, visible=False)
    if shown is None or not shown.recordings or shown.recordings[0] is None:
        return (empty_canvas_html(), system_html(ctx, "Live stats"), empty_canvas_html("Side-by-side is off."), "",
                "", gr.update(maximum=1, value=0, interactive=False), None, None, hidden, hidden)
    rec_a = shown.recordings[0]
    rec_b = shown.recordings[1] if len(shown.recordings) > 1 else None
    steps = max(r.steps for r in shown.recordings if r is not None)
    return (rec_a.render(), shown.stats[0], rec_b.render() if rec_b else empty_canvas_html("Side-by-side is off."),
            shown.stats[1] if rec_b else "", gr.skip(), gr.update(maximum=max(1, steps), value=steps,
                                                                  interactive=steps > 0),
            rec_a, rec_b, hidden, hidden)


def reopen_chat(ctx: AppContext, remembered, current, request: gr.Request = None):
    """On page load: a reloaded tab reopens the chat it was in (``remembered``, kept by the browser for the tab)
    while it still exists for this login, as choosing it would (`open_chat`, then `chat_canvas`: the chats list,
    chatbot, system prompt, status, then CANVAS_OUTPUTS). A new tab, or a remembered chat since deleted, opens
    no chat: what is typed there starts a new one rather than feeding an old chat's history into the prompt. A
    page that chose a chat before this ran (a message sent at once) keeps it."""
    mine = ctx.for_request(request)
    ids = [chat.id for chat in mine.store.list()]
    if resolve_chat_choice(mine, current) is not None or remembered not in ids:
        return (gr.skip(),) * (4 + len(CANVAS_OUTPUTS))
    return (gr.update(choices=chat_choices(mine.store), value=remembered), *open_chat(ctx, remembered, request),
            *chat_canvas(ctx, remembered, request))


CHAT_CONTROLS = ("delete_btn", "rename_box", "rename_btn", "export_btn")  # they act on the chosen chat


def chat_controls(ctx: AppContext, chat_id, request: gr.Request = None):
    """CHAT_CONTROLS usable (Delete in the stop colour) only while a chat is chosen: with none they could only
    answer with a warning."""
    chosen = resolve_chat_choice(ctx.for_request(request), chat_id) is not None
    delete = gr.update(interactive=chosen, variant="stop" if chosen else "secondary")
    return delete, *(gr.update(interactive=chosen) for _ in CHAT_CONTROLS[1:])


def new_chat(ctx: AppContext, system, request: gr.Request = None):
    ctx = ctx.for_request(request)
    empty = next((c for c in ctx.store.list() if not c.messages), None)
    chat = empty or ctx.store.create(system=system or "")
    return gr.update(choices=chat_choices(ctx.store), value=chat.id), [], note("New chat.")


def rename_chat(ctx: AppContext, chat_id, title, request: gr.Request = None):
    ctx = ctx.for_request(request)
    try:
        chat = ctx.store.rename(chat_id, title)
    except (KeyError, ValueError) as err:
        return gr.skip(), gr.skip(), note(str(err).strip("'\""), "error")
    return gr.update(choices=chat_choices(ctx.store), value=chat.id), "", note(f"Renamed to “{chat.title}”.")


# What the page's Delete sends when its confirmation is cancelled: this prefix, then the chat's id (`delete_chat`
# keeps that chat; "no chat" stays "Choose a chat to delete.")
KEEP_CHAT = "keep:"


def delete_chat(ctx: AppContext, chat_id, request: gr.Request = None):
    ctx = ctx.for_request(request)
    if isinstance(chat_id, str) and chat_id.startswith(KEEP_CHAT):  # the confirmation was cancelled
        try:
            title = ctx.store.get(chat_id.removeprefix(KEEP_CHAT)).title
        except KeyError:
            return gr.skip(), gr.skip(), note("Nothing was deleted.")
        return gr.skip(), gr.skip(), note(f"Kept “{title}”: nothing was deleted.")
    if not chat_id:
        return gr.skip(), gr.skip(), note("Choose a chat to delete.", "warn")
    try:
        title = ctx.store.get(chat_id).title
    except KeyError:
        gone = note("That chat no longer exists.", "warn")
        return gr.update(choices=chat_choices(ctx.store), value=None), [], gone
    ctx.store.delete(chat_id)
    ctx.recordings.forget(chat_id)
    return gr.update(choices=chat_choices(ctx.store), value=None), [], note(f"Deleted “{title}”.")


def export_chat(ctx: AppContext, chat_id, fmt, request: gr.Request = None):
    ctx = ctx.for_request(request)
    try:
        chat = ctx.store.get(chat_id)
    except KeyError:
        return None, note("Choose a chat to export.", "warn")
    path = export_file(chat, fmt, ctx.export_dir / "chats")
    return gr.update(value=str(path), visible=True), note(f"Exported “{chat.title}” as {fmt}.")


def clear(ctx: AppContext, system, request: gr.Request = None):
    chats_update, messages, _ = new_chat(ctx, system, request)
    return chats_update, messages, note("Cleared: this is a new chat; the previous one stays under Chats.")


# ---------------------------------------------------------------------------- settings and page life
def apply_preset(ctx: AppContext, name, gen_length):
    values = preset_values(name, gen_length)
    block = fixed_block_length(ctx.host.engine)
    if block:  # a block-diffusion model decodes in its own block size only
        values["block_length"] = block
    return tuple(values[k] for k in PRESET_KNOBS)


def preset_after_knobs(ctx: AppContext, gen_length, *values):
    """The preset marked after a knob is set by hand: the one the knobs still match, else none."""
    skip = ("block_length",) if fixed_block_length(ctx.host.engine) else ()
    return matching_preset(gen_length, dict(zip(PRESET_KNOBS, values, strict=True)), skip)


def method_info(m):
    return METHODS.get(m, "")


def show_side_by_side(on):
    return gr.update(visible=bool(on))


def engine_info(ctx: AppContext):
    return system_html(ctx)


def on_load(ctx: AppContext, request: gr.Request = None):
    return banner_html(ctx), gr.update(choices=chat_choices(ctx.for_request(request).store)), system_html(ctx)


def on_unload(ctx: AppContext, request: gr.Request = None):
    """The page went away: its queued messages are saved into their chats (now, or when the turn decoding
    that chat ends), never dropped."""
    if request is not None and request.session_hash:
        ctx.sessions.drop_session(request.session_hash, getattr(request, "username", None))
        ctx.regenerations.drop_session(request.session_hash)
        ctx.page_turns.drop_session(request.session_hash)
        for chat_id in list(ctx.sessions.orphans):
            save_orphans(ctx, chat_id)
