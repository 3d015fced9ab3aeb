"""The `flash-dllm-chat` command line, run in-process through main(argv) (plus one real console-script run)."""
import importlib
import json
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import flash_dllm.engine.decode_loop as decode_loop
from flash_dllm.app.paths import load_app_settings
from app_testing import run  # noqa: E402

FAST = ["--method", "llada", "--gen-length", "8", "--block-length", "8", "--steps", "4"]
JSON_FIELDS = {"text", "token_ids", "forward_passes", "steps", "elapsed_s", "tokens_per_s", "method", "model",
               "kernels", "verify_passes", "draft_passes", "accepted_drafts", "rejected_drafts", "tokens_per_forward"}
STATS = re.compile(r"^\[\d+ tokens \| \d+ forward passes \| [\d.]+ tokens/forward \| [\d.]+ tok/s \| [\d.]+ s \| "
                   r"llada \| torch kernels\]$")



def assert_usage_error(code, out, err, needle):
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and needle.lower() in err.lower(), err


@pytest.fixture(params=["llada", "dream"])
def family_folder(request, tiny_llada, tiny_dream):
    return request.param, tiny_llada if request.param == "llada" else tiny_dream


def test_generate_text_output(family_folder, capsys):
    _, folder = family_folder
    argv = ["generate", "--model", str(folder), "--prompt", "Hello there", *FAST]
    code, out, err = run(argv + ["--json"], capsys)
    assert code == 0, err
    answer = json.loads(out)["text"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert out.startswith(answer + "\n")
    stats = out[len(answer) + 1:]
    assert stats.count("\n") == 1 and STATS.match(stats.strip()), stats


def test_the_prompt_may_be_given_without_its_flag(tiny_llada, capsys):
    flagged = run(["generate", "--model", str(tiny_llada), "--prompt", "Hello there", *FAST, "--json"], capsys)
    bare = run(["generate", "Hello there", "--model", str(tiny_llada), *FAST, "--json"], capsys)
    assert flagged[0] == bare[0] == 0, bare
    assert json.loads(bare[1])["token_ids"] == json.loads(flagged[1])["token_ids"]


def test_generate_json_fields(family_folder, capsys):
    family, folder = family_folder
    code, out, err = run(["generate", "--model", str(folder), "--prompt", "Hello", "--system", "Be brief.",
                          *FAST, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert JSON_FIELDS <= set(doc)
    assert doc["method"] == "llada" and doc["kernels"] == "torch" and doc["model"] == str(folder.resolve())
    assert doc["forward_passes"] == doc["steps"] <= 4 and len(doc["token_ids"]) <= 8
    if doc["finish_reason"] == "length":
        assert doc["steps"] == 4 and len(doc["token_ids"]) == 8
    assert doc["draft_passes"] + doc["verify_passes"] == doc["forward_passes"]
    assert doc["tokens_per_forward"] == round(len(doc["token_ids"]) / doc["forward_passes"], 3)
    eos = json.loads((folder / "config.json").read_text())["eos_token_id"]
    assert eos not in doc["token_ids"]


def test_every_setting_reaches_the_engine(tiny_llada, capsys):
    base = ["generate", "--model", str(tiny_llada), "--prompt", "Hello", "--json"]
    flags = ["--method", "llada", "--gen-length", "8", "--block-length", "4", "--steps", "4", "--threshold", "0.5",
             "--temperature", "0.7", "--seed", "3", "--cfg-scale", "0.5", "--window", "8", "--lookahead", "0",
             "--track", "-1", "--gamma", "0.6", "--acceptance", "cumulative", "--cache-mode", "prefix"]
    code, out, err = run(base + flags, capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"] == dict(doc["settings"], method="llada", gen_length=8, block_length=4, steps=4,
                                   threshold=0.5, temperature=0.7, seed=3, cfg_scale=0.5, window=8, lookahead=0,
                                   track=-1, gamma=0.6, acceptance="cumulative", cache_mode="prefix",
                                   use_chat_template=True)
    assert doc["forward_passes"] == 2 * doc["steps"]  # classifier-free guidance: two forwards per step
    plain = json.loads(run(base + FAST, capsys)[1])
    with_system = json.loads(run(base + FAST + ["--system", "You are terse."], capsys)[1])
    raw = json.loads(run(base + FAST + ["--no-chat-template"], capsys)[1])
    assert raw["prompt_tokens"] == len("Hello") < plain["prompt_tokens"] < with_system["prompt_tokens"]
    assert raw["settings"]["use_chat_template"] is False


def test_generate_from_fake_hub(family_folder, fake_hub, capsys):
    family, folder = family_folder
    fake_hub.add_repo(f"tiny/{family}", folder)
    code, out, err = run(["generate", "--model", f"tiny/{family}", "--prompt", "Hello", *FAST, "--json"], capsys)
    assert code == 0, err
    local_code, local_out, _ = run(["generate", "--model", str(folder), "--prompt", "Hello", *FAST, "--json"], capsys)
    assert json.loads(out)["model"] == f"tiny/{family}"
    assert json.loads(out)["token_ids"] == json.loads(local_out)["token_ids"]


def test_batch_file(tiny_llada, tmp_path, capsys):
    batch = tmp_path / "prompts.txt"
    batch.write_text("First question\n\nSecond, longer question here\n")
    code, out, err = run(["generate", "--model", str(tiny_llada), "--batch-file", str(batch), *FAST, "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["results"]) == 2 and all(JSON_FIELDS <= set(r) for r in doc["results"])
    assert doc["tokens"] == sum(len(r["token_ids"]) for r in doc["results"])
    assert doc["forward_passes"] == sum(r["forward_passes"] for r in doc["results"])
    assert doc["tokens_per_s"] > 0 and doc["method"] == "llada"
    code, out, err = run(["generate", "--model", str(tiny_llada), "--batch-file", str(batch), *FAST], capsys)
    assert code == 0 and out.count("### ") == 2 and out.rstrip().splitlines()[-1].startswith("batch [")


def test_last_model_is_remembered(tiny_dream, capsys):
    assert run(["generate", "--model", str(tiny_dream), "--prompt", "Hi", *FAST], capsys)[0] == 0
    assert load_app_settings()["last_model"] == str(tiny_dream.resolve())
    code, out, err = run(["generate", "--prompt", "Hi", *FAST, "--json"], capsys)
    assert code == 0 and json.loads(out)["model"] == str(tiny_dream.resolve())


def test_a_remembered_bundled_name_is_used_without_a_note(capsys):
    """`--model bundled` is remembered as typed; the next run uses it quietly (it once said the model was gone)."""
    assert run(["generate", "--model", "bundled", "--prompt", "Hi", *FAST], capsys)[0] == 0
    assert load_app_settings()["last_model"] == "bundled"
    code, out, err = run(["generate", "--prompt", "Hi", *FAST, "--json"], capsys)
    assert code == 0 and "no longer" not in err and json.loads(out)["model"] == "bundled"


@pytest.fixture
def broken_models(tiny_llada, tmp_path):
    missing = shutil.copytree(tiny_llada, tmp_path / "missing-shard")
    (missing / "model-00002-of-00002.safetensors").unlink()
    truncated = shutil.copytree(tiny_llada, tmp_path / "truncated-shard")
    shard = truncated / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    unsupported = tmp_path / "bert"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps({"model_type": "bert"}))
    return {"missing": missing, "truncated": truncated, "unsupported": unsupported}


BAD_INPUTS = [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "   "], "prompt is empty"),
    (["--prompt", "hi", "--gen-length", "0"], "gen length"),
    (["--prompt", "hi", "--gen-length", "10", "--block-length", "4"], "multiple of block length"),
    (["--prompt", "hi", "--gen-length", "16", "--block-length", "8", "--steps", "3"],
     "multiple of the number of blocks"),
    (["--prompt", "hi", "--threshold", "0"], "threshold"),
    (["--prompt", "hi", "--threshold", "1.5"], "threshold"),
    (["--prompt", "hi " * 40, "--gen-length", "512", "--block-length", "512"], "context"),
    (["--prompt", "hi", "--method", "nonsense"], "invalid choice"),
    (["--prompt", "hi", "--gen-length", "eight"], "invalid int"),
    (["--prompt", "hi", "--device", "cuda"], "argument --device: device 'cuda': no CUDA GPU"),
    (["--prompt", "hi", "--device", "gpu0"], "argument --device: unknown device 'gpu0'"),
    (["--prompt", "hi", "--gen-length", "0"], "argument --gen-length: gen length must be at least 1"),
    (["--prompt", "hi", "--gen-length", "-5"], "argument --gen-length: gen length must be at least 1"),
    (["--prompt", "hi", "--gen-length", "100", "--steps", "50"],  # 4 blocks of 25 (chosen): 50 is no multiple of 4
     "steps 50 must be a multiple of the number of blocks (4)"),
    (["--batch-file", "/nonexistent/prompts.txt"], "cannot read"),
    ([], "--prompt"),
    (["hi", "--prompt", "hi"], "give the prompt once"),
    (["hi", "--top-k", "3"], "argument --top-k: top k filters method dream's sampling only"),  # not ignored
    (["hi", "--method", "fast-dllm", "--top-p", "0.9"], "argument --top-p: top p filters method dream's"),
]


@pytest.mark.parametrize("extra,needle", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(extra, needle, tiny_llada, capsys):
    if "cuda" in extra and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_usage_error(*run(["generate", "--model", str(tiny_llada), "--method", "llada", *extra], capsys), needle)


@pytest.mark.parametrize("kind,needle", [("missing", "missing safetensors shard"), ("truncated", "truncated"),
                                         ("unsupported", "unsupported model type 'bert'")])
def test_broken_model_is_one_line_and_exit_2(kind, needle, broken_models, capsys):
    argv = ["generate", "--model", str(broken_models[kind]), "--prompt", "hi", *FAST]
    assert_usage_error(*run(argv, capsys), needle)


def test_engine_settings_fail_before_any_download_and_name_the_flag(fake_hub, tiny_llada, monkeypatch, capsys):
    """Device and kernel backend are the engine's to check; it does so before fetching weights, and its
    message names the setting while the CLI names the flag."""
    fake_hub.add_repo("tiny/llada", tiny_llada)
    base = ["generate", "--model", "tiny/llada", "--prompt", "hi", *FAST]
    assert_usage_error(*run(base + ["--device", "cuda:x"], capsys), "argument --device: unknown device 'cuda:x'")
    if not torch.cuda.is_available():
        # Triton fixes a kernel's mode (interpreted or compiled) when its module is imported: import them all
        # under the interpreter first, or a module first imported below stays compiled for the later tests
        for module in pkgutil.iter_modules(importlib.import_module("flash_dllm.kernels").__path__):
            importlib.import_module(f"flash_dllm.kernels.{module.name}")
        monkeypatch.setenv("TRITON_INTERPRET", "0")  # what a user's machine has: no CPU interpreter
        code, out, err = run(base + ["--kernels", "triton"], capsys)
        assert_usage_error(code, out, err, "argument --kernels: kernel backend 'triton' needs a CUDA device")
    assert fake_hub.gets(".safetensors") == []


def test_graphs_are_on_unless_no_graphs(tiny_llada, monkeypatch, capsys):
    from flash_dllm.engine import Engine

    load, loaded = Engine.load.__func__, []
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: loaded.append(load(cls, *a, **kw)) or loaded[-1]))
    base = ["generate", "--model", str(tiny_llada), "--prompt", "hi", *FAST]
    assert run(base, capsys)[0] == 0 and run(base + ["--no-graphs"], capsys)[0] == 0
    assert [engine.graphs for engine in loaded] == [True, False]


# ---- --gen-length without --block-length: a block length that divides it is chosen --------------------------
def generate_args(*flags):
    from flash_dllm.app.cli import build_parser

    return build_parser().parse_args(["generate", "hi", *flags])


@pytest.mark.parametrize("flags, block", [
    (["--gen-length", "100"], 25),  # 32 does not divide 100: its largest divisor up to 32
    (["--gen-length", "128"], 32),
    (["--gen-length", "97"], 97),  # prime: one block, not 97 blocks of one token
    ([], 32),  # the defaults: 128 in blocks of 32
    (["--gen-length", "10", "--block-length", "4"], 4),  # an explicit block length is kept, even a wrong one
])
def test_settings_choose_a_block_length_only_when_none_is_given(flags, block):
    from flash_dllm.app.cli import settings_from
    from flash_dllm.engine import GenerationSettings, SettingsError, block_length_for, validate

    settings = settings_from(generate_args(*flags))
    assert settings.block_length == block
    if "--block-length" in flags:
        with pytest.raises(SettingsError, match="multiple of block length 4"):
            validate(settings)
    else:
        validate(settings)
        assert settings.block_length == block_length_for(settings.gen_length, GenerationSettings().block_length)


def test_steps_are_judged_against_the_chosen_blocks():
    """--steps must be a multiple of the number of blocks, here the chosen ones: 100 tokens are 4 blocks of 25."""
    from flash_dllm.app.cli import settings_from
    from flash_dllm.engine import SettingsError, validate

    for steps in (4, 20, 52, 100):
        settings = settings_from(generate_args("--gen-length", "100", "--steps", str(steps)))
        assert (settings.block_length, settings.n_blocks, settings.steps) == (25, 4, steps)
        validate(settings)
    for steps in (2, 50, 101):
        with pytest.raises(SettingsError, match=r"multiple of the number of blocks \(4\)"):
            validate(settings_from(generate_args("--gen-length", "100", "--steps", str(steps))))


def test_gen_length_alone_decodes_an_answer_of_that_length(family_folder, capsys):
    """`generate --gen-length 40` with no --block-length once failed: the default block length 32 divides no 40."""
    _, folder = family_folder
    code, out, err = run(["generate", "--model", str(folder), "--prompt", "What is 2+3?", "--method", "llada",
                          "--gen-length", "40", "--steps", "8", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["settings"]["gen_length"] == 40 and doc["settings"]["block_length"] == 20  # 2 blocks of 20
    assert doc["forward_passes"] == doc["steps"] <= 8 and 0 < len(doc["token_ids"]) <= 40
    if doc["finish_reason"] == "length":
        assert doc["steps"] == 8 and len(doc["token_ids"]) == 40
    code, out, err = run(["generate", "--model", str(folder), "--prompt", "What is 2+3?", "--method", "llada",
                          "--gen-length", "40"], capsys)
    assert code == 0 and STATS.match(out.rstrip().splitlines()[-1]), err


def test_a_block_diffusion_model_keeps_its_own_block_size(tiny_llada, monkeypatch, capsys):
    """A block-diffusion model decodes only in its own block size: without --block-length that one is used, not
    one chosen to divide --gen-length, and a --gen-length that is no multiple of it is refused in one line."""
    import dataclasses

    from flash_dllm.engine import Engine

    load = Engine.load.__func__

    def block_model(cls, *args, **kwargs):
        engine = load(cls, *args, **kwargs)
        engine.model.config = dataclasses.replace(engine.model.config, block_size=8)
        return engine

    monkeypatch.setattr(Engine, "load", classmethod(block_model))
    base = ["generate", "--model", str(tiny_llada), "--prompt", "hi", "--json"]
    code, out, err = run(base + ["--gen-length", "40"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["method"] == "block-diffusion" and doc["settings"]["block_length"] == 8
    assert_usage_error(*run(base + ["--gen-length", "36"], capsys),
                       "argument --gen-length: gen length 36 must be a positive multiple of block length 8")


def test_block_length_help_names_the_default_and_the_divisor_rule(capsys):
    out = " ".join(run(["generate", "--help"], capsys)[1].split())
    assert "block length (default 32, or a divisor of --gen-length when 32 does not divide it" in out


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"]])
def test_help_is_quick_and_names_the_kernel_backend(argv):
    """--help imports neither torch nor gradio (the engine's names resolve lazily)."""
    code = ("import sys\nfrom flash_dllm.app.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('heavy:', sorted(m for m in ('torch', 'gradio', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "heavy: []" in done.stdout, done.stdout[-500:]
    assert "kernel backend" in done.stdout and "--no-graphs" in done.stdout and "CUDA graph" in done.stdout


def test_offline_without_cache_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_usage_error(*run(["generate", "--model", "org/not-cached", "--prompt", "hi", *FAST], capsys), "offline")


def test_unsupported_repo_exit_2(fake_hub, capsys):
    fake_hub.add_repo("org/bert", extra={"config.json": b'{"model_type": "bert"}', "model.safetensors": b"0" * 1000})
    assert_usage_error(*run(["generate", "--model", "org/bert", "--prompt", "hi", *FAST], capsys), "unsupported")
    assert fake_hub.gets(".safetensors") == []


def test_out_of_memory_exit_2(tiny_llada, monkeypatch, capsys):
    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(decode_loop, "forward_cached", out_of_memory)
    assert_usage_error(*run(["generate", "--model", str(tiny_llada), "--prompt", "hi", *FAST], capsys), "out of memory")


def test_pull_and_models_commands(fake_hub, tiny_dream, capsys):
    fake_hub.add_repo("tiny/dream", tiny_dream)
    code, out, err = run(["pull", "tiny/dream"], capsys)
    assert code == 0, err
    assert "tiny/dream (dream" in out and "models--tiny--dream" in out
    code, out, err = run(["models"], capsys)
    row = next(line for line in out.splitlines() if line.startswith("tiny/dream"))
    assert "dream" in row and " GB " in row and "models--tiny--dream" in row
    code, out, err = run(["models", "--json"], capsys)
    assert "tiny/dream" in [m["name"] for m in json.loads(out)]
    assert_usage_error(*run(["pull", "not a repo"], capsys), "not a hugging face repo id")


def stub_module(monkeypatch, name: str, **attributes) -> types.ModuleType:
    """Replace a module for one test. The parent package's attribute too: once the real module was imported
    (by another test), `from package import module` finds that attribute before sys.modules."""
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    monkeypatch.setitem(sys.modules, name, module)
    parent, _, child = name.rpartition(".")
    monkeypatch.setattr(importlib.import_module(parent), child, module, raising=False)
    return module


def test_load_flags_before_the_command_are_kept(tiny_llada, tmp_path, capsys):
    """`flash-dllm-chat --model M generate ...` (the usage line shows --model before COMMAND) loads M; argparse
    used to overwrite it with the subcommand's default and answer with the bundled model."""
    code, out, _ = run(["--model", str(tiny_llada), "generate", "--prompt", "Hello there", *FAST, "--json"], capsys)
    before = json.loads(out)
    after = json.loads(run(["generate", "--model", str(tiny_llada), "--prompt", "Hello there", *FAST, "--json"],
                           capsys)[1])
    assert code == 0 and before["model"] == after["model"] == str(tiny_llada)
    assert before["token_ids"] == after["token_ids"]
    code, out, err = run(["--model", str(tmp_path / "nothing-here"), "generate", "hi"], capsys)
    assert code == 2 and "nothing-here" in out + err  # not silently the bundled model


@pytest.mark.parametrize("argv,flag", [(["--port", "9000", "serve"], "--port"),
                                       (["--share", "generate", "hi"], "--share")])
def test_app_flags_before_a_command_are_refused_not_ignored(argv, flag, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2 and flag in out + err and "after it" in out + err


def test_no_command_launches_the_ui(monkeypatch, capsys):
    calls = []
    stub_module(monkeypatch, "flash_dllm.app.launch",
                add_launch_arguments=lambda parser: parser.add_argument("--port", type=int, default=7860),
                run=lambda args: calls.append(args.port) or 0)
    assert run(["--port", "7999"], capsys)[0] == 0 and calls == [7999]
    assert run([], capsys)[0] == 0 and calls == [7999, 7860]


def test_generate_never_touches_the_ui(tiny_llada, monkeypatch, capsys):
    def forbidden(*args):
        raise AssertionError("generate imported the UI")

    stub_module(monkeypatch, "flash_dllm.app.launch", add_launch_arguments=forbidden, run=forbidden)
    assert run(["generate", "--model", str(tiny_llada), "--prompt", "hi", *FAST], capsys)[0] == 0


def test_train_tiny_passes_every_argument_to_the_trainer(monkeypatch, capsys):
    seen = []
    stub_module(monkeypatch, "flash_dllm.engine.training.train", main=lambda argv: seen.append(argv) or 3)
    assert run(["train-tiny", "--minutes", "1", "--help"], capsys)[0] == 3
    assert seen == [["--minutes", "1", "--help"]]


def test_installed_console_script(tiny_llada, tmp_path):
    script = Path(sys.executable).parent / "flash-dllm-chat"
    assert script.is_file(), "the console script is not installed (pip install -e .)"
    env = dict(os.environ, FLASH_DLLM_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1")
    done = subprocess.run([str(script), "generate", "--model", str(tiny_llada), "--prompt", "Hello", *FAST, "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert JSON_FIELDS <= set(json.loads(done.stdout))


@pytest.mark.parametrize("method", ["fast-dllm", "flash-cache", "flash-verify"])
def test_cached_methods_through_the_cli(family_folder, tmp_path, method, capsys):
    """The Flash settings reach the engine; a batch file runs as one batch; JSON counts draft and verify
    passes separately and reports the kernel path and the drafts."""
    _, folder = family_folder
    batch = tmp_path / "prompts.txt"
    batch.write_text("What is 12*7?\nhello\n")
    flags = ["--method", method, "--gen-length", "16", "--block-length", "8", "--window", "4", "--lookahead", "4",
             "--track", "4", "--threshold", "0.6", "--gamma", "0.2", "--acceptance", "cumulative", "--kernels", "torch"]
    code, out, err = run(["generate", "--model", str(folder), "--batch-file", str(batch), *flags, "--json"], capsys)
    assert code == 0, err
    results = json.loads(out)["results"]
    assert len(results) == 2 and all(JSON_FIELDS <= set(r) for r in results)
    for r in results:
        assert r["method"] == method and r["kernels"] == "torch"
        assert r["settings"]["window"] == 4 and r["settings"]["track"] == 4 and r["settings"]["gamma"] == 0.2
        assert r["forward_passes"] == r["draft_passes"] + r["verify_passes"]
        if method == "flash-verify":
            assert r["verify_passes"] > 0 and r["accepted_drafts"] + r["rejected_drafts"] > 0
        else:
            assert r["verify_passes"] == 0 and r["accepted_drafts"] == r["rejected_drafts"] == 0
    single = ["generate", "--model", str(folder), "--prompt", "hello", *flags, "--json"]
    code, out, err = run(single, capsys)
    assert code == 0 and json.loads(out)["token_ids"] == results[1]["token_ids"]  # batch == single run


# ---- serve (issue 21): the flags are checked before any model loads --------------------------------------------
@pytest.mark.parametrize("flags, needle", [
    (["--api-key", ""], "--api-key is empty"),
    (["--max-in-flight", "0"], "--max-in-flight 0"),
    (["--port", "70000"], "--port 70000"),
    (["--host", "no.such.host.invalid"], "--host no.such.host.invalid"),
    (["--device", "tpu"], "device 'tpu'"),
])
def test_serve_refuses_bad_flags_in_one_line(flags, needle, capsys, monkeypatch):
    from flash_dllm.engine import Engine

    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: pytest.fail("loaded a model")))
    code, out, err = run(["serve", *flags], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_serve_refuses_a_port_in_use(capsys, monkeypatch):
    import socket

    from flash_dllm.engine import Engine

    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **kw: pytest.fail("loaded a model")))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, out, err = run(["serve", "--port", str(port)], capsys)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err, err


def test_help_lists_serve_and_its_flags(capsys):
    assert "serve" in run(["--help"], capsys)[1]
    out = run(["serve", "--help"], capsys)[1]
    for flag in ("--model", "--host", "--port", "--device", "--dtype", "--kernels", "--no-graphs", "--api-key"):
        assert flag in out, flag
