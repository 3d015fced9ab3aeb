"""The Gradio 6 page: chat, live diffusion canvas with stats, settings, chats and models.

Every event that a client may call has a stable ``api_name`` (chat, regenerate, stop, replay, export_gif,
export_html, new_chat, clear, open_chat, rename_chat, delete_chat, export_chat, load_model, download_model,
preset); the page's own events have stable names too but are private. Generations share the concurrency
group "gpu" (one at a time, the rest queue in order). The layout is built here, section by section, into one
namespace of components; the handlers live in app/handlers.py (the model picker's in app/model_handlers.py).
"""
from __future__ import annotations

import functools
import inspect
from importlib import resources
from types import SimpleNamespace

import gradio as gr

from flash_dllm.app import handlers as h
from flash_dllm.app import model_handlers as mh
from flash_dllm.app.canvas import empty_canvas_html
from flash_dllm.app.inflight import inflight_html
from flash_dllm.app.model_settings import (DEFAULT_METHOD, DEFAULT_METHOD_B, FOLLOW_OUTPUTS, follow_model, knob_update,
                                          page_settings)
from flash_dllm.app.presets import DEFAULT_PRESET, KNOB_RANGES, KNOBS, PRESETS
from flash_dllm.app.turns import OUTPUTS, AppContext, note
from flash_dllm.engine import METHODS


# Gradio fades a disabled button but draws a disabled textbox as an enabled one: the rename box, inert with its
# button while no chat is chosen (`h.chat_controls`), fades with it so that it does not look typeable
INERT_RENAME_BOX = "#rename-box :is(input, textarea):disabled { opacity: 0.5; cursor: not-allowed; }"


def page_css() -> str:
    canvas = resources.files("flash_dllm.assets").joinpath("canvas.css").read_text(encoding="utf-8")
    return f"{canvas}\n{INERT_RENAME_BOX}\n"


def bind(handler, ctx: AppContext):
    """``handler`` with ``ctx`` as its first argument. Gradio reads the rest of the signature and its
    annotations (API parameter names and defaults, which parameter receives the gr.Request), so the bound
    handler keeps both; a generator stays a generator, so Gradio streams it."""
    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def bound(*args, **kwargs):
            yield from handler(ctx, *args, **kwargs)
    else:
        @functools.wraps(handler)
        def bound(*args, **kwargs):
            return handler(ctx, *args, **kwargs)
    signature = inspect.signature(handler)
    bound.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    return bound


# ---------------------------------------------------------------------------- layout
def sidebar(ctx: AppContext, page: SimpleNamespace) -> None:
    with gr.Sidebar(label="Chats and model", open=True, width=300):
        # filled per visitor when the page loads (on_load): behind a login each one sees only their own chats
        page.chats = gr.Dropdown(choices=[], value=None, label="Chats", allow_custom_value=True)
        page.remembered_chat = gr.Textbox("", visible=False)  # filled in the browser on load (REMEMBERED_CHAT)
        with gr.Row():
            page.new_btn = gr.Button("New chat", size="sm")
            # Delete, Rename and Export are usable (Delete red) only while a chat is chosen: `chat_controls`
            # follows the Chats value
            page.delete_btn = gr.Button("Delete", size="sm", variant="secondary", interactive=False,
                                        elem_id="delete-chat")
        page.rename_box = gr.Textbox(label="Rename chat to", max_lines=1, interactive=False, elem_id="rename-box")
        page.rename_btn = gr.Button("Rename", size="sm", interactive=False, elem_id="rename-chat")
        with gr.Row():
            page.export_fmt = gr.Radio(["md", "json"], value="md", label="Export chat as", scale=2)
            page.export_btn = gr.Button("Export", size="sm", scale=1, interactive=False, elem_id="export-chat")
        page.chat_file = gr.File(label="Exported chat", interactive=False, visible=False)
        gr.Markdown("**Model**")
        page.model_dd = gr.Dropdown(choices=mh.model_choices(ctx), value=ctx.host.name, label="Models",
                                    info="downloaded ones, then known ones (Load downloads those)",
                                    allow_custom_value=True)
        page.load_btn = gr.Button("Load", size="sm")
        page.repo_box = gr.Textbox(label="Hugging Face repo id", placeholder="GSAI-ML/LLaDA-8B-Instruct", max_lines=1)
        page.download_btn = gr.Button("Download and load", size="sm")
        page.model_note = gr.HTML("")
        page.system_info = gr.HTML(h.system_html(ctx))


def chat_column(ctx: AppContext, page: SimpleNamespace) -> None:
    # the loaded model's methods and published defaults; the page then follows model changes (`follow_model`)
    model = page_settings(ctx.host.engine)
    page.settings_for = gr.State(model.model if model else None)
    methods = list(model.methods) if model else list(METHODS)
    method = model.method if model else DEFAULT_METHOD
    with gr.Column(scale=4, min_width=360):
        page.chatbot = gr.Chatbot(label="Chat", height=440, buttons=["copy", "copy_all"],
                                  placeholder="Ask something: the answer is decoded in parallel on the canvas.")
        with gr.Row():
            page.message = gr.Textbox(label="Message", placeholder="Message (Enter sends)", max_lines=8,
                                      scale=6, autofocus=True, elem_id="message")
            page.send_btn = gr.Button("Send", variant="primary", scale=1, min_width=80)
        with gr.Row():
            # red only while this page has a message in flight (ARM_STOP / DISARM_STOP below)
            page.stop_btn = gr.Button("Stop", variant="secondary", size="sm", elem_id="stop-btn")
            page.regen_btn = gr.Button("Regenerate", size="sm")
            page.clear_btn = gr.Button("Clear", size="sm")
        page.status = gr.HTML(note("Ready."), elem_id="status")
        # `chat`'s message argument (its API parameter); the page's own turns take theirs from app/page_turns.py
        page.turn_msg = gr.Textbox("", visible=False)
        with gr.Accordion("Settings", open=True):
            page.method = gr.Radio(methods, value=method, label="Method")
            page.method_info = gr.Markdown(METHODS[method])
            page.model_defaults = gr.HTML(model.note() if model else "", elem_id="model-defaults-box")
            page.preset = gr.Radio(list(PRESETS), value=model.preset if model else DEFAULT_PRESET, label="Preset",
                                   info="sets the knob values below; none selected: the model's published "
                                        "defaults or values set by hand")
            page.system = gr.Textbox("", label="System prompt", lines=2, placeholder="(optional)")
            with gr.Row():
                page.side = gr.Checkbox(label="Side by side", value=False)
                page.method_b = gr.Dropdown(methods, value=model.method_b if model else DEFAULT_METHOD_B,
                                            label="Compare with")
            with gr.Accordion("Raw knobs", open=False):
                page.knob_inputs = []
                for name in KNOBS:
                    spec = KNOB_RANGES[name]
                    props = dict(minimum=spec.minimum, value=h.K0[name], step=spec.step, info=spec.info)
                    if model and name in model.knobs:
                        props.update(knob_update(name, model.knobs[name], model.block_size))
                    page.knob_inputs.append(gr.Slider(maximum=spec.maximum, label=name.replace("_", " "), **props))


def canvas_column(ctx: AppContext, page: SimpleNamespace) -> None:
    with gr.Column(scale=7, min_width=420):
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=320):
                page.canvas_a = gr.HTML(empty_canvas_html(), elem_id="canvas-a")
            with gr.Column(scale=1, min_width=230):
                page.stats_a = gr.HTML(h.system_html(ctx, "Live stats"), elem_id="stats-a")
        with gr.Row(visible=False, equal_height=False) as page.row_b:
            with gr.Column(scale=3, min_width=320):
                page.canvas_b = gr.HTML(empty_canvas_html("Side-by-side is off."), elem_id="canvas-b")
                page.answer_b = gr.Markdown("", label="Answer B")
            with gr.Column(scale=1, min_width=230):
                page.stats_b = gr.HTML("", elem_id="stats-b")
        page.replay = gr.Slider(0, 1, value=0, step=1, label="Replay: canvas at step", interactive=False)
        with gr.Row():
            page.gif_btn = gr.Button("Export GIF", size="sm")
            page.html_btn = gr.Button("Export HTML", size="sm")
        page.canvas_files = gr.File(label="Denoising export", file_count="multiple", interactive=False,
                                    visible=False)
        page.inflight = gr.HTML(inflight_html(ctx), elem_id="inflight")


# ---------------------------------------------------------------------------- wiring
# Client-side only: the page counts its turns in flight (a message may be sent while another is queued) and
# shows Stop in the stop colour while any is; every arm is matched by the disarm chained after its turn, which
# runs however the turn ends (answered, stopped, refused, an empty message). So every event of a click that
# arms runs on each click (trigger mode "multiple"): one the page dropped (mode "once", while the previous is
# in flight) would leave its arm without a disarm.
ARM_STOP = ("() => { window.fdTurns = (window.fdTurns || 0) + 1;"
            " document.getElementById('stop-btn')?.classList.add('armed'); }")
DISARM_STOP = ("() => { window.fdTurns = Math.max(0, (window.fdTurns || 0) - 1);"
               " if (!window.fdTurns) document.getElementById('stop-btn')?.classList.remove('armed'); }")


def wire_turns(ctx: AppContext, page: SimpleNamespace) -> None:
    """A click runs its handler at once (`accept`, `regenerate_requested`: they record what the click asked for,
    app/page_turns.py), then queues its turn (`chat`, `regenerate`) in the "gpu" group, which takes that record
    rather than reading the page's components, which the next click may have changed."""
    turn_outputs = [getattr(page, name) for name in OUTPUTS]
    settings_inputs = [page.system, page.method, page.side, page.method_b, *page.knob_inputs]
    stop_colour = dict(queue=False, api_visibility="private")
    queued_turn = dict(concurrency_id="gpu", concurrency_limit=1, show_progress="minimal",
                       show_progress_on=page.status, trigger_mode="multiple")
    gr.on([page.message.submit, page.send_btn.click], None, js=ARM_STOP, trigger_mode="multiple", **stop_colour)
    page.regen_btn.click(None, js=ARM_STOP, trigger_mode="multiple", **stop_colour)
    gr.on([page.message.submit, page.send_btn.click], bind(h.accept, ctx), [page.message, page.chats],
          [page.message, page.chats, page.chatbot, page.turn_msg], queue=False, api_name="queue_message",
          api_visibility="private", trigger_mode="multiple").then(
        bind(h.chat, ctx), [page.turn_msg, page.chats, *settings_inputs], turn_outputs, api_name="chat",
        **queued_turn).then(None, js=DISARM_STOP, **stop_colour)
    # says at once when the regenerate waits for the answer being decoded; a second click on the chat it
    # regenerates is a repeat, which changes nothing (a double click regenerates once)
    page.regen_btn.click(bind(h.regenerate_requested, ctx), page.chats, page.status, queue=False,
                         api_name="regenerate_requested", api_visibility="private", show_progress="hidden",
                         trigger_mode="multiple").then(
        bind(h.regenerate, ctx), [page.chats, *settings_inputs], turn_outputs, api_name="regenerate",
        **queued_turn).then(None, js=DISARM_STOP, **stop_colour)
    page.stop_btn.click(bind(h.stop, ctx), None, page.status, api_name="stop", concurrency_limit=None,
                        concurrency_id="instant")


def wire_canvas(ctx: AppContext, page: SimpleNamespace) -> None:
    recordings = [page.rec_a, page.rec_b]
    page.replay.input(h.replay_at, [page.replay, *recordings], [page.canvas_a, page.canvas_b], api_name="replay",
                      trigger_mode="always_last", concurrency_limit=None, concurrency_id="instant")
    page.gif_btn.click(bind(h.export_canvas_gif, ctx), recordings, page.canvas_files, api_name="export_gif",
                       concurrency_limit=2, concurrency_id="export")
    page.html_btn.click(bind(h.export_canvas_html, ctx), recordings, page.canvas_files, api_name="export_html",
                        concurrency_limit=2, concurrency_id="export")


# Client-side only: the tab keeps the id of the chat it shows (sessionStorage lasts as long as the tab, reloads
# included), and the page load hands it to `reopen_chat`; titles and empty values are not ids. A browser that
# refuses storage (an embedding frame) only loses the memory: a reload then opens no chat, as a new tab does.
CHAT_KEY = "flash-dllm-chat:open-chat"
REMEMBER_CHAT = (f"(id) => {{ try {{ if (typeof id === 'string' && /^[0-9a-f]{{32}}$/.test(id))"
                 f" sessionStorage.setItem('{CHAT_KEY}', id); }} catch (e) {{}} }}")
REMEMBERED_CHAT = (f"(remembered, current) => {{ let id = ''; try {{ id = sessionStorage.getItem('{CHAT_KEY}') || '';"
                   f" }} catch (e) {{}} return [id, current]; }}")


# Client-side only: Delete asks first; a cancelled confirmation sends the chat's id marked as kept (h.KEEP_CHAT),
# so that the status says the chat was kept rather than that no chat is chosen.
CONFIRM_DELETE = (f"(id) => !id ? null : confirm('Delete this chat for good?') ? id : '{h.KEEP_CHAT}' + id")


def wire_chats(ctx: AppContext, page: SimpleNamespace) -> None:
    listing = [page.chats, page.chatbot, page.status]
    # after any change of the chosen chat, the canvas column follows it (its own private event, so the public
    # events keep their outputs)
    canvas = dict(fn=bind(h.chat_canvas, ctx), inputs=page.chats,
                  outputs=[getattr(page, name) for name in h.CANVAS_OUTPUTS], api_visibility="private",
                  queue=False)
    page.chats.change(None, page.chats, None, js=REMEMBER_CHAT, queue=False, api_visibility="private")
    page.chats.change(bind(h.chat_controls, ctx), page.chats, [getattr(page, name) for name in h.CHAT_CONTROLS],
                      api_name="chat_controls", api_visibility="private", queue=False, show_progress="hidden")
    page.chats.input(bind(h.open_chat, ctx), page.chats, [page.chatbot, page.system, page.status],
                     api_name="open_chat").then(api_name="canvas_after_open", **canvas)
    page.new_btn.click(bind(h.new_chat, ctx), page.system, listing, api_name="new_chat").then(
        api_name="canvas_after_new", **canvas)
    page.clear_btn.click(bind(h.clear, ctx), page.system, listing, api_name="clear").then(
        api_name="canvas_after_clear", **canvas)
    page.rename_btn.click(bind(h.rename_chat, ctx), [page.chats, page.rename_box],
                          [page.chats, page.rename_box, page.status], api_name="rename_chat")
    page.delete_btn.click(bind(h.delete_chat, ctx), page.chats, listing, api_name="delete_chat",
                          js=CONFIRM_DELETE).then(
        api_name="canvas_after_delete", **canvas)
    page.export_btn.click(bind(h.export_chat, ctx), [page.chats, page.export_fmt], [page.chat_file, page.status],
                          api_name="export_chat")


def wire_models(ctx: AppContext, page: SimpleNamespace) -> None:
    model_outputs = [page.model_note, page.system_info, page.model_dd, page.banner]
    # one switch at a time, in its own group: a download (or a stalled Hub) never holds the "gpu" group that
    # chats queue in; the switch takes the engine's lock only to load (app/models.py)
    follow = follow_model_event(ctx, page)
    page.load_btn.click(bind(mh.load_model, ctx), page.model_dd, model_outputs, api_name="load_model",
                        concurrency_id="models", concurrency_limit=1).then(api_name="follow_after_load", **follow)
    page.download_btn.click(bind(mh.download_model, ctx), page.repo_box, model_outputs, api_name="download_model",
                            concurrency_id="models", concurrency_limit=1).then(
        api_name="follow_after_download", **follow)


def follow_model_event(ctx: AppContext, page: SimpleNamespace) -> dict:
    """The private event that sets the method controls and family knobs for the loaded model (after a load,
    on page load, and on the engine timer: another page or client may have switched the model)."""
    knob_by_name = dict(zip(KNOBS, page.knob_inputs, strict=True))
    outputs = [knob_by_name[name.removeprefix("knob:")] if name.startswith("knob:") else getattr(page, name)
               for name in FOLLOW_OUTPUTS]
    return dict(fn=bind(follow_model, ctx), inputs=page.settings_for, outputs=outputs, api_visibility="private",
                queue=False, show_progress="hidden")


def wire_settings(ctx: AppContext, page: SimpleNamespace) -> None:
    knob_by_name = dict(zip(KNOBS, page.knob_inputs, strict=True))
    page.preset.input(bind(h.apply_preset, ctx), [page.preset, knob_by_name["gen_length"]],
                      [knob_by_name[k] for k in h.PRESET_KNOBS], api_name="preset")
    preset_knobs = [knob_by_name["gen_length"], *(knob_by_name[k] for k in h.PRESET_KNOBS)]
    for name in h.PRESET_KNOBS:  # a knob set by hand: the preset mark follows what the knobs now hold
        knob_by_name[name].input(bind(h.preset_after_knobs, ctx), preset_knobs, page.preset, queue=False,
                                 api_name=f"preset_after_{name}", api_visibility="private", show_progress="hidden")
    page.method.change(h.method_info, page.method, page.method_info, queue=False, api_name="method_info",
                       api_visibility="private")
    page.side.change(h.show_side_by_side, page.side, page.row_b, queue=False, api_name="side_by_side",
                     api_visibility="private")
    page.timer.tick(bind(h.engine_info, ctx), None, page.system_info, api_name="engine_info",
                    api_visibility="private", concurrency_limit=None, concurrency_id="instant", show_progress="hidden")
    page.timer.tick(api_name="follow_model", **follow_model_event(ctx, page))
    # every engine request (this page's, other pages', the API's), as the engine reports them
    page.inflight_timer.tick(bind(inflight_html, ctx), None, page.inflight, api_name="requests_in_flight",
                             api_visibility="private", concurrency_limit=None, concurrency_id="instant",
                             show_progress="hidden")


def build_ui(ctx: AppContext) -> gr.Blocks:
    with gr.Blocks(title="flash-dllm-chat", analytics_enabled=False, fill_width=True) as demo:
        page = SimpleNamespace(rec_a=gr.State(None), rec_b=gr.State(None))
        page.banner = gr.HTML(h.banner_html(ctx))
        sidebar(ctx, page)
        with gr.Row(equal_height=False):
            chat_column(ctx, page)
            canvas_column(ctx, page)
        page.timer = gr.Timer(5.0)
        page.inflight_timer = gr.Timer(1.0)
        wire_turns(ctx, page)
        wire_canvas(ctx, page)
        wire_chats(ctx, page)
        wire_models(ctx, page)
        wire_settings(ctx, page)
        demo.load(bind(h.on_load, ctx), None, [page.banner, page.chats, page.system_info], api_name="page_load",
                  api_visibility="private")
        demo.load(bind(h.reopen_chat, ctx), [page.remembered_chat, page.chats],
                  [page.chats, page.chatbot, page.system, page.status,
                   *(getattr(page, name) for name in h.CANVAS_OUTPUTS)],
                  js=REMEMBERED_CHAT, api_name="reopen_chat", api_visibility="private", queue=False,
                  show_progress="hidden")
        demo.load(api_name="follow_on_page_load", **follow_model_event(ctx, page))
        demo.unload(bind(h.on_unload, ctx))
    demo.queue(default_concurrency_limit=4)
    return demo
