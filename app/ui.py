"""The Gradio 6 page: chat, live diffusion canvas with stats, settings, chats and models.

Every event that a client may call has a stable ``api_name`` (chat, regenerate, stop, replay, export_gif,
export_html, new_chat, clear, open_chat, rename_chat, delete_chat, export_chat, load_model, download_model,
preset); the page's own events have stable names too but are private. Generations share the concurrency
group "gpu" (one at a time, the rest queue in order).
"""
from __future__ import annotations

import html
import threading
import time
from importlib import resources

import gradio as gr

from flash_dllm.app.canvas import empty_canvas_html
from flash_dllm.app.chats import export_file
from flash_dllm.app.export import export_gif, export_html
from flash_dllm.app.models import ModelError
from flash_dllm.app.presets import DEFAULT_PRESET, KNOB_RANGES, KNOBS, PRESETS, default_knobs, preset_values
from flash_dllm.app.turns import OUTPUTS, AppContext, chat_choices, chat_messages, chat_turn, note
from flash_dllm.app.stats import format_bytes, stats_rows, stats_table
from flash_dllm.engine import METHODS, GenerationSettings, hub, memory_snapshot

PRESET_KNOBS = ("block_length", "steps", "threshold", "gamma", "window", "lookahead", "track")


def page_css() -> str:
    return resources.files("flash_dllm.assets").joinpath("canvas.css").read_text(encoding="utf-8")


def system_html(ctx: AppContext, title: str = "Engine") -> str:
    """Memory and the engine's identity (the stats panel before the first answer, and the sidebar)."""
    engine = ctx.host.engine
    device = engine.device if engine is not None else None
    return stats_table(stats_rows(None, memory_snapshot(device), ctx.host.describe()), title)


def banner_html(ctx: AppContext) -> str:
    info = ctx.host.describe()
    model = html.escape(str(info.get("model", "no model loaded")))
    extra = f"<div class='fd-note fd-warn'>{html.escape(ctx.share_note)}</div>" if ctx.share_note else ""
    return (f"<div><b style='font-size:1.25em'>flash-dllm-chat</b> &nbsp;·&nbsp; {model} on "
            f"{html.escape(str(info.get('device', '–')))} &nbsp;·&nbsp; the canvas shows every cell of the answer "
            f"as the model denoises it</div>{extra}")


def model_choices(ctx: AppContext) -> list[tuple[str, str]]:
    try:
        return [(c.label, c.value) for c in ctx.host.choices()]
    except Exception:  # an unreadable cache must not break the page: offer the loaded model only
        return [(f"{ctx.host.name} (loaded)", ctx.host.name)] if ctx.host.name else []


def progress_html(done: int, total: int, label: str) -> str:
    pct = 100.0 * done / total if total else 0.0
    return (f"<div class='fd-note'>{html.escape(label)}: {format_bytes(done)} of {format_bytes(total)} ({pct:.0f}%)</div>"
            f"<div class='fd-progress'><div style='width:{pct:.1f}%'></div></div>")


def build_ui(ctx: AppContext) -> gr.Blocks:
    methods = METHODS
    knobs0 = k0 = default_knobs()
    default_method = GenerationSettings().method
    default_b = "llada" if "llada" in methods else default_method

    with gr.Blocks(title="flash-dllm-chat", analytics_enabled=False, fill_width=True) as demo:
        rec_a, rec_b = gr.State(None), gr.State(None)
        banner = gr.HTML(banner_html(ctx))
        with gr.Sidebar(label="Chats and model", open=True, width=300):
            chats = gr.Dropdown(choices=chat_choices(ctx.store), value=None, label="Chats", allow_custom_value=True)
            with gr.Row():
                new_btn = gr.Button("New chat", size="sm")
                delete_btn = gr.Button("Delete", size="sm", variant="stop")
            rename_box = gr.Textbox(label="Rename chat to", max_lines=1)
            rename_btn = gr.Button("Rename", size="sm")
            with gr.Row():
                export_fmt = gr.Radio(["md", "json"], value="md", label="Export chat as", scale=2)
                export_btn = gr.Button("Export", size="sm", scale=1)
            chat_file = gr.File(label="Exported chat", interactive=False, visible=False)
            gr.Markdown("**Model**")
            model_dd = gr.Dropdown(choices=model_choices(ctx), value=ctx.host.name, label="Downloaded models",
                                   allow_custom_value=True)
            load_btn = gr.Button("Load", size="sm")
            repo_box = gr.Textbox(label="Hugging Face repo id", placeholder="GSAI-ML/LLaDA-8B-Instruct", max_lines=1)
            download_btn = gr.Button("Download and load", size="sm")
            model_note = gr.HTML("")
            system_info = gr.HTML(system_html(ctx))
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=360):
                chatbot = gr.Chatbot(label="Chat", height=440, buttons=["copy", "copy_all"],
                                     placeholder="Ask something: the answer is decoded in parallel on the canvas.")
                with gr.Row():
                    message = gr.Textbox(label="Message", placeholder="Message (Enter sends)", max_lines=8,
                                         scale=6, autofocus=True, elem_id="message")
                    send_btn = gr.Button("Send", variant="primary", scale=1, min_width=80)
                with gr.Row():
                    stop_btn = gr.Button("Stop", variant="stop", size="sm")
                    regen_btn = gr.Button("Regenerate", size="sm")
                    clear_btn = gr.Button("Clear", size="sm")
                status = gr.HTML(note("Ready."), elem_id="status")
                turn_msg = gr.Textbox("", visible=False)
                with gr.Accordion("Settings", open=True):
                    method = gr.Radio(list(methods), value=default_method, label="Method")
                    method_info = gr.Markdown(methods[default_method])
                    preset = gr.Radio(list(PRESETS), value=DEFAULT_PRESET, label="Preset")
                    system = gr.Textbox("", label="System prompt", lines=2, placeholder="(optional)")
                    with gr.Row():
                        side = gr.Checkbox(label="Side by side", value=False)
                        method_b = gr.Dropdown(list(methods), value=default_b, label="Compare with")
                    with gr.Accordion("Raw knobs", open=False):
                        knob_inputs = []
                        for name in KNOBS:
                            spec = KNOB_RANGES[name]
                            knob_inputs.append(gr.Slider(spec.minimum, spec.maximum, value=knobs0[name], step=spec.step,
                                                         label=name.replace("_", " "), info=spec.info))
            with gr.Column(scale=7, min_width=420):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3, min_width=320):
                        canvas_a = gr.HTML(empty_canvas_html(), elem_id="canvas-a")
                    with gr.Column(scale=1, min_width=230):
                        stats_a = gr.HTML(system_html(ctx, "Live stats"), elem_id="stats-a")
                with gr.Row(visible=False, equal_height=False) as row_b:
                    with gr.Column(scale=3, min_width=320):
                        canvas_b = gr.HTML(empty_canvas_html("Side-by-side is off."), elem_id="canvas-b")
                        answer_b = gr.Markdown("", label="Answer B")
                    with gr.Column(scale=1, min_width=230):
                        stats_b = gr.HTML("", elem_id="stats-b")
                replay = gr.Slider(0, 1, value=0, step=1, label="Replay: canvas at step", interactive=False)
                with gr.Row():
                    gif_btn = gr.Button("Export GIF", size="sm")
                    html_btn = gr.Button("Export HTML", size="sm")
                canvas_files = gr.File(label="Denoising export", file_count="multiple", interactive=False, visible=False)
        timer = gr.Timer(5.0)

        components = dict(chatbot=chatbot, chats=chats, canvas_a=canvas_a, stats_a=stats_a, canvas_b=canvas_b,
                          stats_b=stats_b, answer_b=answer_b, status=status, replay=replay, rec_a=rec_a,
                          rec_b=rec_b, message=message)
        turn_outputs = [components[name] for name in OUTPUTS]
        settings_inputs = [system, method, side, method_b, *knob_inputs]

        # ---------------------------------------------------------------- chat turns
        def accept(text, chat_id, request: gr.Request):
            """Clear the box, show the message as queued, and hand it to `chat` (which may wait its turn)."""
            if not (text or "").strip():
                return gr.skip(), gr.skip(), gr.skip(), ""
            chat = ctx.store.get_or_create(chat_id)
            ctx.sessions.queue(chat.id, request.session_hash, text)
            return ("", gr.update(choices=chat_choices(ctx.store), value=chat.id),
                    chat_messages(chat, ctx.sessions.queued(chat.id)), text)

        def chat(message, chat_id=None, system="", method=default_method, side_by_side=False,
                 method_b=default_b, gen_length=k0["gen_length"], block_length=k0["block_length"], steps=k0["steps"],
                 threshold=k0["threshold"], gamma=k0["gamma"], temperature=k0["temperature"], window=k0["window"],
                 lookahead=k0["lookahead"], track=k0["track"], max_candidates=k0["max_candidates"], seed=k0["seed"],
                 request: gr.Request = None):
            knobs = (gen_length, block_length, steps, threshold, gamma, temperature, window, lookahead, track,
                     max_candidates, seed)
            yield from chat_turn(ctx, message, chat_id, system, method, side_by_side, method_b, knobs,
                                 request.session_hash if request else None)

        def regenerate(chat_id, system="", method=default_method, side_by_side=False,
                       method_b=default_b, gen_length=k0["gen_length"], block_length=k0["block_length"],
                       steps=k0["steps"], threshold=k0["threshold"], gamma=k0["gamma"],
                       temperature=k0["temperature"], window=k0["window"], lookahead=k0["lookahead"],
                       track=k0["track"], max_candidates=k0["max_candidates"], seed=k0["seed"],
                       request: gr.Request = None):
            knobs = (gen_length, block_length, steps, threshold, gamma, temperature, window, lookahead, track,
                     max_candidates, seed)
            yield from chat_turn(ctx, None, chat_id, system, method, side_by_side, method_b, knobs,
                                 request.session_hash if request else None, regenerate=True)

        def stop(request: gr.Request):
            stopped = ctx.sessions.stop(request.session_hash if request else None)
            return note("Stopping between steps…" if stopped else "Nothing is being generated.", "warn")

        gr.on([message.submit, send_btn.click], accept, [message, chats], [message, chats, chatbot, turn_msg],
              queue=False, api_name="queue_message", api_visibility="private").then(
            chat, [turn_msg, chats, *settings_inputs], turn_outputs, api_name="chat", concurrency_id="gpu",
            concurrency_limit=1, show_progress="minimal", show_progress_on=status)
        regen_btn.click(regenerate, [chats, *settings_inputs], turn_outputs, api_name="regenerate",
                        concurrency_id="gpu", concurrency_limit=1, show_progress="minimal", show_progress_on=status)
        stop_btn.click(stop, None, status, api_name="stop", concurrency_limit=None, concurrency_id="instant")

        # ---------------------------------------------------------------- canvas replay and export
        def replay_at(step, recording_a, recording_b):
            step = int(step or 0)
            a = recording_a.at_step(step).render() if recording_a is not None else gr.skip()
            b = recording_b.at_step(step).render() if recording_b is not None else gr.skip()
            return a, b

        def export(kind, recording_a, recording_b):
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

        replay.input(replay_at, [replay, rec_a, rec_b], [canvas_a, canvas_b], api_name="replay",
                     trigger_mode="always_last", concurrency_limit=None, concurrency_id="instant")
        gif_btn.click(lambda a, b: export("gif", a, b), [rec_a, rec_b], canvas_files, api_name="export_gif",
                      concurrency_limit=2, concurrency_id="export")
        html_btn.click(lambda a, b: export("html", a, b), [rec_a, rec_b], canvas_files, api_name="export_html",
                       concurrency_limit=2, concurrency_id="export")

        # ---------------------------------------------------------------- chats
        def open_chat(chat_id):
            try:
                chat = ctx.store.get(chat_id)
            except KeyError:
                return [], "", note("That chat no longer exists.", "warn")
            return chat_messages(chat, ctx.sessions.queued(chat.id)), chat.system, note(f"Opened “{chat.title}”.")

        def new_chat(system):
            empty = next((c for c in ctx.store.list() if not c.messages), None)
            chat = empty or ctx.store.create(system=system or "")
            return gr.update(choices=chat_choices(ctx.store), value=chat.id), [], note("New chat.")

        def rename_chat(chat_id, title):
            try:
                chat = ctx.store.rename(chat_id, title)
            except (KeyError, ValueError) as err:
                return gr.skip(), gr.skip(), note(str(err).strip("'\""), "error")
            return gr.update(choices=chat_choices(ctx.store), value=chat.id), "", note(f"Renamed to “{chat.title}”.")

        def delete_chat(chat_id):
            if not chat_id:
                return gr.skip(), gr.skip(), note("Choose a chat to delete.", "warn")
            try:
                title = ctx.store.get(chat_id).title
            except KeyError:
                gone = note("That chat no longer exists.", "warn")
                return gr.update(choices=chat_choices(ctx.store), value=None), [], gone
            ctx.store.delete(chat_id)
            return gr.update(choices=chat_choices(ctx.store), value=None), [], note(f"Deleted “{title}”.")

        def export_chat(chat_id, fmt):
            try:
                chat = ctx.store.get(chat_id)
            except KeyError:
                return None, note("Choose a chat to export.", "warn")
            path = export_file(chat, fmt, ctx.export_dir / "chats")
            return gr.update(value=str(path), visible=True), note(f"Exported “{chat.title}” as {fmt}.")

        def clear(system):
            chats_update, messages, _ = new_chat(system)
            return chats_update, messages, note("Cleared: this is a new chat; the previous one stays under Chats.")

        chats.input(open_chat, chats, [chatbot, system, status], api_name="open_chat")
        new_btn.click(new_chat, system, [chats, chatbot, status], api_name="new_chat")
        clear_btn.click(clear, system, [chats, chatbot, status], api_name="clear")
        rename_btn.click(rename_chat, [chats, rename_box], [chats, rename_box, status], api_name="rename_chat")
        delete_btn.click(delete_chat, chats, [chats, chatbot, status], api_name="delete_chat",
                         js="(id) => (id && confirm('Delete this chat for good?')) ? id : null")
        export_btn.click(export_chat, [chats, export_fmt], [chat_file, status], api_name="export_chat")

        # ---------------------------------------------------------------- models
        def after_load(message_html):
            return (message_html, system_html(ctx), gr.update(choices=model_choices(ctx), value=ctx.host.name),
                    banner_html(ctx))

        def load_model(name):
            yield after_load(note(f"Loading {name}… (waits for the answer being decoded)"))
            try:
                ctx.host.switch(name)
            except ModelError as err:
                yield after_load(note(str(err), "error"))
                return
            yield after_load(note(f"Loaded {ctx.host.name}."))

        def download_model(repo_id):
            repo_id = (repo_id or "").strip()
            if not hub.REPO_ID.match(repo_id):
                yield after_load(note("Type a Hugging Face repo id such as GSAI-ML/LLaDA-8B-Instruct.", "warn"))
                return
            try:
                size = ctx.host.weight_bytes(repo_id)
            except ModelError as err:
                yield after_load(note(str(err), "error"))
                return
            ok, fit = hub.fit_check(size, ctx.host.target_device(), ctx.host.options.dtype)
            if not ok and ctx.host.engine is None:
                yield after_load(note(f"{repo_id} {fit}", "error"))
                return
            # with a model loaded the check is repeated after unloading it (its memory counts as free then)
            progress = {"done": 0, "total": size}
            outcome: dict = {}

            def work():
                try:
                    outcome["path"] = hub.resolve_model(repo_id, progress=lambda d, t: progress.update(done=d, total=t))
                except Exception as err:  # shown in the page
                    outcome["error"] = str(err)

            worker = threading.Thread(target=work, name="flash-dllm-download", daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.5)
                yield after_load(progress_html(progress["done"], progress["total"] or size, f"Downloading {repo_id}"))
            if "error" in outcome:
                yield after_load(note(outcome["error"], "error"))
                return
            yield after_load(progress_html(progress["done"], progress["total"] or size, f"Downloaded {repo_id}"))
            yield after_load(note(f"Downloaded {repo_id}; loading (waits for the answer being decoded)…"))
            try:
                ctx.host.switch(repo_id, weight_bytes=size)
            except ModelError as err:
                yield after_load(note(str(err), "error"))
                return
            yield after_load(note(f"Loaded {repo_id}."))

        model_outputs = [model_note, system_info, model_dd, banner]
        load_btn.click(load_model, model_dd, model_outputs, api_name="load_model", concurrency_id="gpu",
                       concurrency_limit=1)
        download_btn.click(download_model, repo_box, model_outputs, api_name="download_model",
                           concurrency_id="download", concurrency_limit=1)

        # ---------------------------------------------------------------- settings
        def apply_preset(name, gen_length):
            values = preset_values(name, gen_length)
            return tuple(values[k] for k in PRESET_KNOBS)

        knob_by_name = dict(zip(KNOBS, knob_inputs, strict=True))
        preset.input(apply_preset, [preset, knob_by_name["gen_length"]], [knob_by_name[k] for k in PRESET_KNOBS],
                     api_name="preset")
        method.change(lambda m: methods.get(m, ""), method, method_info, queue=False, api_name="method_info",
                      api_visibility="private")
        side.change(lambda on: gr.update(visible=bool(on)), side, row_b, queue=False, api_name="side_by_side",
                    api_visibility="private")
        timer.tick(lambda: system_html(ctx), None, system_info, api_name="engine_info", api_visibility="private",
                   concurrency_limit=None, concurrency_id="instant", show_progress="hidden")

        def on_load():
            return banner_html(ctx), gr.update(choices=chat_choices(ctx.store)), system_html(ctx)

        demo.load(on_load, None, [banner, chats, system_info], api_name="page_load", api_visibility="private")

        def on_unload(request: gr.Request = None):
            if request is not None and request.session_hash:
                ctx.sessions.drop_session(request.session_hash)

        demo.unload(on_unload)
    demo.queue(default_concurrency_limit=4)
    return demo
