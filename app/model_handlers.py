"""The page's model handlers: the model picker's choices, and loading or downloading a model with progress
notes (a download runs on a thread; only the load itself waits for the answer being decoded). The chat handlers
are app/handlers.py."""
from __future__ import annotations

import html
import threading

import gradio as gr

from flash_dllm.app.handlers import banner_html, system_html
from flash_dllm.app.models import ModelError, known_models
from flash_dllm.app.stats import format_bytes
from flash_dllm.app.turns import AppContext, note
from flash_dllm.engine import hub


def downloaded_choices(ctx: AppContext) -> list[tuple[str, str]]:
    try:
        return [(c.label, c.value) for c in ctx.host.choices()]
    except Exception:  # an unreadable cache must not break the page: offer the loaded model only
        return [(f"{ctx.host.name} (loaded)", ctx.host.name)] if ctx.host.name else []


def model_choices(ctx: AppContext) -> list[tuple[str, str]]:
    """The model picker: the downloaded models, then the known checkpoints not downloaded yet (each with its
    bf16 size and whether it fits a 24 GiB card); choosing one of those downloads it (`load_model`)."""
    downloaded = downloaded_choices(ctx)
    have = {value for _, value in downloaded}
    return downloaded + [(f"{c.label} · not downloaded: Load downloads it", c.value) for c in known_models()
                         if c.value not in have]


def known_to_download(ctx: AppContext, name) -> str | None:
    """``name`` when it is a known checkpoint that is not downloaded (loading it means downloading it)."""
    name = name.strip() if isinstance(name, str) else ""
    if name not in {c.value for c in known_models()} or name in {value for _, value in downloaded_choices(ctx)}:
        return None
    return name


def progress_html(done: int, total: int, label: str) -> str:
    pct = 100.0 * done / total if total else 0.0
    return (f"<div class='fd-note'>{html.escape(label)}: {format_bytes(done)} of {format_bytes(total)} ({pct:.0f}%)</div>"
            f"<div class='fd-progress'><div style='width:{pct:.1f}%'></div></div>")


def after_load(ctx: AppContext, message_html):
    """The model outputs (note, engine info, model list, banner) after a load step."""
    return (message_html, system_html(ctx), gr.update(choices=model_choices(ctx), value=ctx.host.name),
            banner_html(ctx))


def in_background(work, *args):
    """Run ``work(*args)`` on a daemon thread; returns (thread, outcome dict with "value" or "error")."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = work(*args)
        except ModelError as err:
            outcome["error"] = str(err)
        except Exception as err:  # a bug: shown in the page rather than lost on a thread
            outcome["error"] = f"{type(err).__name__}: {err}"

    thread = threading.Thread(target=run, name="flash-dllm-model", daemon=True)
    thread.start()
    return thread, outcome


def switch_steps(ctx: AppContext, name: str, download: bool, size: int = 0):
    """Fetch (download with progress, or find in the cache) then load: the model outputs after each step. The
    fetch never holds the lock chats wait on; only the load does, after the answer being decoded."""
    progress = {"done": 0, "total": size}
    thread, fetched = in_background(ctx.host.fetch, name, lambda d, t: progress.update(done=d, total=t), download)
    while thread.is_alive():
        thread.join(0.5)
        if progress["total"]:
            yield after_load(ctx, progress_html(progress["done"], progress["total"], f"Downloading {name}"))
        else:
            yield after_load(ctx, note(f"Looking for {name}…"))
    if "error" in fetched:
        yield after_load(ctx, note(fetched["error"], "error"))
        return
    if progress["total"]:
        yield after_load(ctx, progress_html(progress["done"], progress["total"], f"Downloaded {name}"))
    yield after_load(ctx, note(f"Loading {name}… (waits for the answer being decoded)"))
    thread, loaded = in_background(ctx.host.load_folder, fetched["value"], name.strip())
    while thread.is_alive():
        thread.join(0.5)
    if "error" in loaded:
        yield after_load(ctx, note(loaded["error"], "error"))
        return
    yield after_load(ctx, note(f"Loaded {ctx.host.name}."))


def load_model(ctx: AppContext, name):
    repo = known_to_download(ctx, name)
    if repo is not None:  # a known checkpoint chosen from the picker: the download flow, with its fit check
        yield from download_model(ctx, repo)
        return
    try:
        name = ctx.host.check_allowed(name)
    except ModelError as err:
        yield after_load(ctx, note(str(err), "error"))
        return
    if name == ctx.host.name and ctx.host.engine is not None:
        yield after_load(ctx, note(f"{name} is loaded."))
        return
    yield from switch_steps(ctx, name, download=False)


def download_model(ctx: AppContext, repo_id):
    repo_id = (repo_id or "").strip() if isinstance(repo_id, str) else ""
    if not hub.REPO_ID.match(repo_id):
        yield after_load(ctx, note("Type a Hugging Face repo id such as GSAI-ML/LLaDA-8B-Instruct.", "warn"))
        return
    yield after_load(ctx, note(f"Asking the Hub about {repo_id}…"))
    thread, sized = in_background(ctx.host.weight_bytes, repo_id)
    while thread.is_alive():
        thread.join(0.5)
    if "error" in sized:
        yield after_load(ctx, note(sized["error"], "error"))
        return
    ok, fit = hub.fit_check(sized["value"], ctx.host.target_device(), ctx.host.options.dtype)
    if not ok and ctx.host.engine is None:
        yield after_load(ctx, note(f"{repo_id} {fit}", "error"))
        return
    # with a model loaded the check is repeated after unloading it (its memory counts as free then)
    yield from switch_steps(ctx, repo_id, download=True, size=sized["value"])
