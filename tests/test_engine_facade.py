"""The engine's public surface, used the way a caller would: only `flash_dllm.engine`'s exports load a model,
generate, stream events and cancel; the app imports nothing else from the engine and nothing from the kernels."""
from __future__ import annotations

import ast
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import flash_dllm.engine as engine_api

APP = Path(__file__).resolve().parent.parent / "app"


def test_load_generate_stream_and_cancel_through_the_exports_only(tiny_llada):
    from flash_dllm.engine import (CanvasStart, Engine, Finished, GenerationResult, GenerationSettings, SequenceDone,
                                   StepEvent, tokens_per_forward)

    engine = Engine.load(str(tiny_llada), device="cpu", graphs=False)
    assert engine.graphs is False and engine.describe()["kernels"] == "torch"
    settings = GenerationSettings(method="flash-cache", gen_length=32, block_length=16, threshold=1.0)

    events: list = []
    (done,) = engine.generate(["Hello there"], settings, on_event=events.append)
    assert isinstance(done, GenerationResult) and done.finish_reason in ("eos", "length")
    assert isinstance(events[0], CanvasStart) and isinstance(events[-1], SequenceDone)
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert len(steps) == done.steps >= 2 and events[-1].token_ids == done.token_ids
    assert done.tokens_per_forward == round(tokens_per_forward(len(done.token_ids), done.forward_passes), 3)
    assert Finished([done]).to_dict()["results"][0]["text"] == done.text

    cancel, seen = threading.Event(), []

    def stop_after_first_step(event) -> None:
        seen.append(event)
        if isinstance(event, StepEvent):
            cancel.set()

    (stopped,) = engine.generate([[{"role": "user", "content": "Hello there"}]], settings,
                                 on_event=stop_after_first_step, cancel=cancel)
    assert stopped.finish_reason == "cancelled" and stopped.steps == 1
    assert sum(isinstance(e, StepEvent) for e in seen) == 1
    assert isinstance(seen[-1], SequenceDone) and seen[-1].finish_reason == "cancelled"
    (again,) = engine.generate(["Hello there"], settings)  # the engine stays usable after a cancel
    assert again.token_ids == done.token_ids


def test_bad_prompts_and_settings_raise_the_exported_errors(tiny_llada):
    from flash_dllm.engine import Engine, GenerationSettings, PromptError, SettingsError

    engine = Engine.load(str(tiny_llada), device="cpu")
    settings = GenerationSettings(method="llada", gen_length=8, block_length=8, steps=2)
    gradio_parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]  # the app flattens these
    for prompt, needle in [("   ", "empty"), (gradio_parts, "must be text"),
                           ([{"role": "tool", "content": "hi"}], "unknown chat role")]:
        with pytest.raises(PromptError, match=needle):
            engine.generate([prompt], settings)
    with pytest.raises(SettingsError, match="gen length"):
        engine.generate(["hi"], GenerationSettings(gen_length=0))


@pytest.mark.parametrize("option,value,needle", [("device", "tpu9", "unknown device 'tpu9'"),
                                                 ("dtype", "fp8", "unknown dtype 'fp8'"),
                                                 ("kernels", "cuda", "unknown kernel backend 'cuda'")])
def test_load_names_the_setting_not_a_flag(tiny_llada, option, value, needle):
    from flash_dllm.engine import Engine, SettingsError

    with pytest.raises(SettingsError) as refused:
        Engine.load(str(tiny_llada), **{option: value})
    assert needle in str(refused.value) and "--" not in str(refused.value)


def test_auto_on_a_gpu_is_bf16_triton_kernels_and_graphs(tiny_llada):
    """GPU machines only: the defaults Engine.load decides when nothing is asked."""
    from flash_dllm.engine import Engine, GenerationSettings, pick_device

    if pick_device("auto").type != "cuda":
        pytest.skip("needs a CUDA device")
    engine = Engine.load(str(tiny_llada))
    info = engine.describe()
    assert (info["dtype"], info["kernels"], info["graphs"]) == ("bfloat16", "triton", True)
    assert info["device"].startswith("cuda")
    (result,) = engine.generate(["Hello"], GenerationSettings(gen_length=32, block_length=16))
    assert result.kernels == "triton" and result.steps >= 1


def test_the_exports_resolve_lazily_and_completely():
    code = ("import sys, flash_dllm.engine as e\n"
            "print(sorted(m for m in ('torch', 'transformers', 'gradio') if m in sys.modules))\n"
            "print(sorted(e.METHODS), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    heavy, methods = done.stdout.splitlines()
    assert heavy == "[]"  # importing the package is free; the CLI's --help relies on it
    assert methods == ("['block-diffusion', 'block-diffusion-verify', 'dream', 'fast-dllm', 'flash-cache', "
                       "'flash-verify', 'llada'] False")
    for name in engine_api.__all__:
        assert getattr(engine_api, name) is not None, name
        assert name in dir(engine_api)
    assert all(isinstance(text, str) and text for text in engine_api.METHODS.values())
    assert engine_api.hub.__name__ == "flash_dllm.engine.hub"
    with pytest.raises(AttributeError):
        engine_api.decode_everything  # noqa: B018 - not an export


def forbidden_imports(source: str, public: set[str]) -> list[str]:
    """Imports of an app module that go past the engine's public surface: flash_dllm.kernels, an engine
    module other than the package itself (or training, for train-tiny), or a name the package does not export."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in modules:
            if module == "flash_dllm.kernels" or module.startswith("flash_dllm.kernels."):
                found.append(f"line {node.lineno}: {module}")
            elif module == "flash_dllm.engine" and names is not None:
                found += [f"line {node.lineno}: flash_dllm.engine.{n} (not exported)" for n in names if n not in public]
            elif module.startswith("flash_dllm.engine.") and not (
                    module == "flash_dllm.engine.training" or module.startswith("flash_dllm.engine.training.")):
                found.append(f"line {node.lineno}: {module}")
    return found


def test_the_import_check_catches_each_way_past_the_surface():
    public = set(engine_api.__all__)
    assert forbidden_imports("from flash_dllm.engine import Engine, hub\nimport flash_dllm.engine\n"
                             "from flash_dllm.engine.training.train import main\n", public) == []
    bad = ("from flash_dllm.engine.engine import Engine\nimport flash_dllm.kernels\n"
           "def f():\n    from flash_dllm.kernels import resolve_backend\n"
           "from flash_dllm.engine import paths\nimport flash_dllm.engine.metrics\n")
    assert len(forbidden_imports(bad, public)) == 5


def test_app_modules_use_only_the_engine_package():
    public = set(engine_api.__all__)
    problems = {path.name: found for path in sorted(APP.glob("*.py"))
                if (found := forbidden_imports(path.read_text(encoding="utf-8"), public))}
    assert problems == {}
