"""The page, the model picker and the API follow the loaded model's family (issue #23): the methods a model can
decode, its published defaults as starting values, the known checkpoints, and the API's default method."""
from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import shutil
from html import unescape

import httpx
import pytest
import torch

from flash_dllm.app import handlers as h
from flash_dllm.app import model_handlers as mh
from flash_dllm.app.api import ApiConfig
from flash_dllm.app.chats import ChatStore
from flash_dllm.app.model_settings import FAMILY_KNOBS, FOLLOW_OUTPUTS, follow_model, methods_for, settings_for
from flash_dllm.app.models import LoadOptions, ModelHost
from flash_dllm.app.turns import AppContext, OUTPUTS
from flash_dllm.engine import Engine, GenerationSettings, hub
from flash_dllm.engine.families import BLOCK_METHODS, KNOWN_MODELS
from flash_dllm.engine.tiny import TinySpec, write_tiny_model
from api_testing import error_of, served_api, served_app  # noqa: E402

NON_BLOCK = ("llada", "fast-dllm", "flash-cache", "flash-verify", "dream")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A tiny model of each family, loaded on the CPU (one thread: far faster on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("family-models")
    specs = {"llada": TinySpec("llada"), "dream": TinySpec("dream", n_kv_heads=2),
             "llada-moe": TinySpec(family="llada-moe", n_kv_heads=2), "llada2": TinySpec(family="llada2", n_kv_heads=2)}
    try:
        yield {family: Engine.load(str(write_tiny_model(root / family, spec)), device="cpu")
               for family, spec in specs.items()}
    finally:
        torch.set_num_threads(threads)


def context(engine, tmp_path) -> AppContext:
    return AppContext(ModelHost(engine, LoadOptions(device="cpu"), name=engine.name), ChatStore(tmp_path / "chats"))


def followed(ctx, shown_for=None) -> dict:
    return dict(zip(FOLLOW_OUTPUTS, follow_model(ctx, shown_for), strict=True))


# ---------------------------------------------------------------------------- methods and starting values
def test_a_block_model_offers_only_the_block_methods_and_the_others_never_do(engines):
    assert methods_for(engines["llada2"].model.config) == BLOCK_METHODS
    for family in ("llada", "dream", "llada-moe"):
        assert methods_for(engines[family].model.config) == NON_BLOCK, family
    for family, engine in engines.items():  # the first method offered is the one the engine defaults to
        assert settings_for(engine.model.config, engine.name).method == engine.default_method, family


def test_starting_values_are_the_published_defaults_with_their_source(engines):
    llada2 = engines["llada2"].model.config
    mini = settings_for(llada2, "inclusionAI/LLaDA2.0-mini")
    assert mini.method == "block-diffusion" and mini.method_b == "block-diffusion-verify"
    assert mini.knobs["block_length"] == 32 and mini.knobs["threshold"] == 0.95 and mini.knobs["temperature"] == 0
    # the tiny model's context is 512: the published 512-token answer is capped to half of it, in whole blocks
    assert mini.knobs["gen_length"] == 256 and mini.capped_at == 512
    assert "half the model's context" in unescape(mini.note())
    assert "inclusionAI/LLaDA2.0-mini README" in mini.note() and "fixed" in mini.note()
    coder = settings_for(engines["dream"].model.config, "apple/DiffuCoder-7B-cpGRPO")  # a checkpoint's own
    assert coder.knobs["temperature"] == 0.4 and coder.knobs["gen_length"] == coder.knobs["block_length"]
    assert "apple/ml-diffucoder" in coder.note() and "Not offered: block-diffusion" in coder.note()
    llada = settings_for(engines["llada"].model.config, "GSAI-ML/LLaDA-8B-Instruct")
    assert llada.knobs == {"gen_length": 128, "block_length": 32, "steps": 0, "threshold": 0.9, "temperature": 0.0}
    assert llada.method_b == "llada" and llada.capped_at is None
    assert llada.preset == "balanced" and coder.preset is None and mini.preset is None  # Dream: one block


def test_the_page_follows_a_model_change_once_and_keeps_its_own_edits_otherwise(engines, tmp_path):
    ctx = context(engines["llada2"], tmp_path)
    out = followed(ctx)
    assert out["settings_for"] == engines["llada2"].name
    assert out["method"]["choices"] == list(BLOCK_METHODS) and out["method"]["value"] == "block-diffusion"
    assert out["method_b"]["choices"] == list(BLOCK_METHODS) and out["method_b"]["value"] == "block-diffusion-verify"
    block = out["knob:block_length"]
    assert block["value"] == 32 and block["interactive"] is False and "block size" in block["info"]
    assert out["knob:gen_length"]["step"] == 32 and out["knob:gen_length"]["minimum"] == 32
    assert out["knob:threshold"]["value"] == 0.95 and "model-defaults" in out["model_defaults"]
    assert out["preset"]["value"] is None  # LLaDA2's published threshold is no preset's: none is shown selected
    assert all(isinstance(v, dict) and v.get("__type__") == "update" and len(v) == 1
               for v in follow_model(ctx, engines["llada2"].name))  # the same model: every output skipped
    ctx.host.engine, ctx.host.name = engines["llada"], engines["llada"].name  # another page switched the model
    out = followed(ctx, engines["llada2"].name)
    assert out["method"]["choices"] == list(NON_BLOCK) and out["method"]["value"] == "flash-cache"
    assert out["knob:block_length"]["interactive"] is True and out["knob:gen_length"]["step"] == 8
    assert out["preset"]["value"] == "balanced"  # LLaDA's published defaults are the balanced preset's
    assert [name.removeprefix("knob:") for name in FOLLOW_OUTPUTS if name.startswith("knob:")] == list(FAMILY_KNOBS)


def test_a_preset_keeps_a_block_models_block_length(engines, tmp_path):
    values = dict(zip(h.PRESET_KNOBS, h.apply_preset(context(engines["llada2"], tmp_path), "quality", 256)))
    assert values["block_length"] == 32
    values = dict(zip(h.PRESET_KNOBS, h.apply_preset(context(engines["dream"], tmp_path), "fast", 256)))
    assert values["block_length"] == 32 and values["threshold"] == 0.7  # a preset's own block for other models


def test_a_knob_set_by_hand_unmarks_a_preset_it_no_longer_matches(engines, tmp_path):
    """The preset mark follows the knobs: after a preset it stays, after a hand-set knob that leaves every preset
    it is cleared, and a knob set back to the preset's value marks it again. A block model's fixed block
    length is not compared (a preset cannot set it)."""
    ctx = context(engines["llada"], tmp_path)
    for name in ("fast", "balanced", "quality"):
        values = h.apply_preset(ctx, name, 256)
        assert h.preset_after_knobs(ctx, 256, *values) == name
    values = dict(zip(h.PRESET_KNOBS, h.apply_preset(ctx, "quality", 256)))
    assert h.preset_after_knobs(ctx, 256, *{**values, "threshold": 0.5}.values()) is None
    assert h.preset_after_knobs(ctx, 256, *{**values, "threshold": 0.95}.values()) == "quality"
    assert h.preset_after_knobs(ctx, 256, *{**values, "block_length": 8}.values()) is None
    block_model = context(engines["llada2"], tmp_path)
    values = dict(zip(h.PRESET_KNOBS, h.apply_preset(block_model, "fast", 256)))
    assert values["block_length"] == 32 and h.preset_after_knobs(block_model, 256, *values.values()) == "fast"
    from flash_dllm.app.presets import matching_preset
    assert matching_preset(256, {**values, "block_length": 8}, skip=("block_length",)) == "fast"
    assert matching_preset(256, {**values, "block_length": 8}) is None


def last_outputs(turn) -> dict:
    """The final output tuple of a streamed turn (h.chat or h.regenerate), by output name."""
    *_, final = turn
    return dict(zip(OUTPUTS, final, strict=True))


def run_turn(ctx, **knobs) -> dict:
    return last_outputs(h.chat(ctx, "hello", None, "", **knobs))


def test_a_message_with_the_pages_starting_values_decodes_a_block_model(engines, tmp_path):
    ctx = context(engines["llada2"], tmp_path)
    start = settings_for(engines["llada2"].model.config, engines["llada2"].name)
    knobs = {k: start.knobs[k] for k in FAMILY_KNOBS}
    out = run_turn(ctx, method=start.method, **{**knobs, "gen_length": 64})
    assert "Done." in out["status"], out["status"]
    saved = ctx.store.list()[0].messages[-1]
    assert saved["meta"]["method"] == "block-diffusion" and saved["meta"]["settings"]["block_length"] == 32
    refused = run_turn(ctx, method="flash-cache", gen_length=64, block_length=32)  # what the page no longer offers
    assert "block-diffusion" in refused["status"] and "fd-error" in refused["status"]


def test_a_chat_or_regenerate_call_naming_no_method_uses_the_loaded_models_methods(engines, tmp_path):
    """A script calling the page's `chat` endpoint with only a message (gradio_client fills the defaults) gets the
    loaded model's first method, and side by side its comparison method: never a method the model refuses."""
    ctx = context(engines["llada2"], tmp_path)
    out = run_turn(ctx, gen_length=64, block_length=32, side_by_side=True)
    assert "Done." in out["status"], out["status"]
    chat_id = ctx.store.list()[0].id
    saved = ctx.store.get(chat_id).messages[-1]
    assert saved["meta"]["method"] == "block-diffusion"
    assert " verify)</td>" in out["stats_b"], out["stats_b"]  # B drafted and verified: block-diffusion-verify
    assert "Done." in last_outputs(h.regenerate(ctx, chat_id, "", gen_length=64, block_length=32))["status"]
    assert ctx.store.get(chat_id).messages[-1]["meta"]["method"] == "block-diffusion"
    ctx = context(engines["llada"], tmp_path / "llada")  # a bidirectional model keeps the engine's default
    run_turn(ctx, gen_length=16, block_length=16)
    assert ctx.store.list()[0].messages[-1]["meta"]["method"] == "flash-cache"


# ---------------------------------------------------------------------------- the model picker
def test_the_picker_lists_known_checkpoints_with_their_fit_beside_the_downloaded(engines, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # nothing downloaded
    choices = dict((value, label) for label, value in mh.model_choices(context(engines["llada"], tmp_path)))
    assert engines["llada"].name in choices  # the loaded model first
    assert set(KNOWN_MODELS) <= set(choices)
    assert "does not fit a 24 GiB card" in choices["inclusionAI/LLaDA2.0-mini"]
    assert "fits a 24 GiB card" in choices["GSAI-ML/LLaDA-8B-Instruct"] and "not downloaded" in choices[
        "GSAI-ML/LLaDA-8B-Instruct"]


def test_loading_a_known_checkpoint_not_downloaded_starts_the_download_with_its_fit_check(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    asked = []
    monkeypatch.setattr(hub, "remote_weight_bytes", lambda repo: asked.append(repo) or 32 * hub.GIB)
    monkeypatch.setattr(hub, "fit_check", lambda size, device, dtype=None: (False, "does not fit: needs 39.4 GiB"))
    ctx = AppContext(ModelHost(options=LoadOptions(device="cpu")), ChatStore(tmp_path / "chats"))
    notes = [step[0] for step in mh.load_model(ctx, "inclusionAI/LLaDA2.0-mini")]
    assert asked == ["inclusionAI/LLaDA2.0-mini"] and "Asking the Hub" in notes[0]
    assert "fd-error" in notes[-1] and "does not fit" in notes[-1] and ctx.host.engine is None


# ---------------------------------------------------------------------------- the API
@pytest.fixture(scope="module")
def block_api(engines):
    host = ModelHost(engines["llada2"], LoadOptions(device="cpu"), name=engines["llada2"].name)
    with served_api(host, ApiConfig()) as base_url:
        yield base_url, engines["llada2"].name


def complete(base_url: str, model: str, **fields) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}
    return httpx.post(base_url + "/chat/completions", json=body, timeout=120)


def test_an_api_request_without_a_method_decodes_a_block_model_with_its_block_method(block_api):
    base_url, model = block_api
    response = complete(base_url, model, max_tokens=64)
    assert response.status_code == 200, response.text
    assert response.json()["flash_dllm"]["method"] == "block-diffusion"
    listed = httpx.get(base_url + "/models", timeout=30).json()["data"][0]
    assert listed["object"] == "model" and listed["family"] == "llada2"
    assert listed["default_method"] == "block-diffusion" and listed["methods"] == list(BLOCK_METHODS)


def test_a_block_models_max_tokens_must_be_whole_blocks(block_api):
    base_url, model = block_api
    error = error_of(complete(base_url, model, max_tokens=100))
    assert error["param"] == "max_tokens" and "block size 32" in error["message"] and "96 or 128" in error["message"]
    error = error_of(complete(base_url, model, max_completion_tokens=20))
    assert error["param"] == "max_completion_tokens" and "32" in error["message"]


def test_a_method_or_block_length_the_model_cannot_take_is_a_400_naming_the_field(block_api):
    base_url, model = block_api
    response = complete(base_url, model, max_tokens=64, method="flash-cache")
    error = error_of(response)
    assert response.status_code == 400 and error["param"] == "method" and "block-diffusion" in error["message"]
    error = error_of(complete(base_url, model, max_tokens=64, block_length=16))
    assert error["param"] == "block_length" and "block size 32" in error["message"]


def test_an_api_request_to_another_family_keeps_the_engines_default(engines, tmp_path):
    host = ModelHost(engines["llada"], LoadOptions(device="cpu"), name=engines["llada"].name)
    with served_api(host, ApiConfig()) as base_url:
        response = complete(base_url, engines["llada"].name, max_tokens=32)
        assert response.json()["flash_dllm"]["method"] == GenerationSettings().method
        error = error_of(complete(base_url, engines["llada"].name, max_tokens=32, method="block-diffusion"))
        assert error["param"] == "method" and "block-diffusion models only" in error["message"]


# ---------------------------------------------------------------------------- a real browser
@pytest.mark.browser
@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_the_page_of_a_block_model_offers_its_methods_and_decodes_with_its_defaults(engines, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    from test_browser import ARGS, STATUS

    errors: list[str] = []
    with served_app(engines["llada2"].folder, tmp_path) as app, sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(app.url, wait_until="domcontentloaded")
            page.get_by_role("textbox", name="Message").wait_for(timeout=30_000)
            assert page.get_by_label("block-diffusion", exact=True).is_checked()
            assert page.get_by_label("flash-cache", exact=True).count() == 0
            assert "inclusionAI/LLaDA2.0-mini README" in page.inner_text("#model-defaults")
            page.get_by_role("textbox", name="Message").fill("hello block model")
            page.get_by_role("textbox", name="Message").press("Enter")
            page.wait_for_function(f"() => /Done|ready for the next/.test(({STATUS})())", timeout=90_000)
            assert "Done." in page.evaluate(STATUS)
        finally:
            browser.close()
    answer = app.ctx.store.list()[0].messages[-1]
    assert answer["meta"]["method"] == "block-diffusion" and answer["meta"]["settings"]["gen_length"] == 256
    assert errors == []
