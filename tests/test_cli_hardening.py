"""Issue 20 on the command line: every bad input is one `error:` line naming the flag or file at fault (exit 2),
before any model loads where the input allows; state left over from earlier runs never breaks a run."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from flash_dllm.app.paths import load_app_settings, remember_model
from flash_dllm.engine import hub
from app_testing import run  # noqa: E402

FAST = ["--method", "llada", "--gen-length", "8", "--block-length", "8", "--steps", "4"]



def assert_one_line(code, err, *needles):
    assert code == 2, (code, err)
    lines = [line for line in err.strip().splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle.lower() in lines[0].lower(), err


@pytest.mark.parametrize("flags,needles", [
    (["--temperature", "nan"], ["--temperature", "finite"]),
    (["--temperature", "inf"], ["--temperature", "finite"]),
    (["--temperature", "1e-320"], ["--temperature", "at least"]),
    (["--gamma", "nan"], ["--gamma", "finite"]),
    (["--cfg-scale", "nan"], ["--cfg-scale", "finite"]),
    (["--cfg-scale", "inf"], ["--cfg-scale", "finite"]),
    (["--seed", str(2**64)], ["--seed", "2**64"]),
    (["--seed", "-1"], ["--seed"]),
    (["--device", "mps"], ["--device", "not supported"]),
    (["--device", "gpu0"], ["--device", "unknown device"]),
])
def test_settings_out_of_range_are_refused_with_their_flag(flags, needles, tiny_llada, capsys):
    code, _, err = run(["generate", "hi", "--model", str(tiny_llada), *FAST, *flags], capsys)
    assert_one_line(code, err, *needles)


def test_prompt_sources_and_text_encoding(tiny_llada, tmp_path, capsys):
    batch = tmp_path / "prompts.txt"
    batch.write_text("one\ntwo\n")
    code, _, err = run(["generate", "dropped?", "--batch-file", str(batch), "--model", str(tiny_llada), *FAST], capsys)
    assert_one_line(code, err, "PROMPT", "--batch-file", "not both")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    code, _, err = run(["generate", "--batch-file", str(latin), "--model", str(tiny_llada), *FAST], capsys)
    assert_one_line(code, err, str(latin), "UTF-8")
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")  # what the terminal hands Python for bad bytes
    code, _, err = run(["generate", undecodable, "--model", str(tiny_llada), *FAST], capsys)
    assert_one_line(code, err, "prompt", "UTF-8")
    code, _, err = run(["generate", "hi", "--system", undecodable, "--model", str(tiny_llada), *FAST], capsys)
    assert_one_line(code, err, "--system", "UTF-8")


def broken_copy(source, target, config_change=None, files=None):
    folder = shutil.copytree(source, target)
    if config_change is not None:
        raw = json.loads((folder / "config.json").read_text())
        config_change(raw)
        (folder / "config.json").write_text(json.dumps(raw))
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    return folder


@pytest.mark.parametrize("name,change,files,needles", [
    ("heads-0", lambda c: c.update(n_heads=0), None, ["n_heads", "positive"]),
    ("null-d", lambda c: c.update(d_model=None), None, ["d_model", "null"]),
    ("layers-neg", lambda c: c.update(n_layers=-3), None, ["n_layers", "-3"]),
    ("array", None, {"config.json": b"[1, 2, 3]"}, ["config.json", "JSON object"]),
    ("binary", None, {"config.json": b"\x89PNG\r\n\x1a\n\xff\x00"}, ["config.json", "UTF"]),
    ("bad-index", None, {"model.safetensors.index.json": b"{not json"}, ["model.safetensors.index.json"]),
])
def test_broken_configs_are_one_line_naming_the_file_and_never_remembered(name, change, files, needles, tiny_llada,
                                                                           tmp_path, capsys):
    folder = broken_copy(tiny_llada, tmp_path / name, change, files)
    remember_model(str(tiny_llada.resolve()))
    code, _, err = run(["generate", "hi", "--model", str(folder), *FAST], capsys)
    assert_one_line(code, err, *needles)
    assert load_app_settings()["last_model"] == str(tiny_llada.resolve())


def test_models_lists_the_good_repos_beside_broken_ones(fake_hub, tiny_llada, tmp_path, capsys):
    fake_hub.add_repo("tiny/good", tiny_llada)
    assert hub.pull("tiny/good")
    for bad, raw in (("tiny/zero-heads", {"n_heads": 0}), ("tiny/null-d", {"d_model": None})):
        fake_hub.add_repo(bad, tiny_llada)
        hub.pull(bad)
        snapshot = next(hub.HubEnv.current().storage(bad).glob("snapshots/*"))
        config = snapshot / "config.json"
        data = json.loads(config.read_text())
        data.update(raw)
        config.unlink()  # a symlink into blobs: replace the link, not the shared blob
        config.write_text(json.dumps(data))
    code, out, err = run(["models"], capsys)
    assert code == 0 and "Traceback" not in err
    assert "tiny/good" in out and "tiny/zero-heads" not in out and "tiny/null-d" not in out


def test_a_remembered_model_that_is_gone_falls_back_to_the_bundled_one(tmp_path, capsys):
    assert hub.bundled_model_path() is not None, "the bundled model is missing from the package"
    remember_model(str(tmp_path / "deleted-model"))
    code, out, err = run(["generate", "hi", *FAST, "--json"], capsys)
    assert code == 0, err
    assert "deleted-model" in err and "settings.json" in err and "bundled" in err
    assert json.loads(out)["model"] == str(hub.bundled_model_path())


def unwritable(tmp_path, name: str):
    """A folder path under which nothing can be created, even by root (its parent is a regular file); what a
    read-only, empty home looks like to the app."""
    blocker = tmp_path / f"{name}-is-a-file"
    blocker.write_text("")
    return blocker / name


def test_a_read_only_empty_home_still_generates(tiny_llada, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLASH_DLLM_HOME", str(unwritable(tmp_path, "home")))
    code, out, err = run(["generate", "hi", "--model", str(tiny_llada), *FAST], capsys)
    assert code == 0, err
    assert out.strip()


def test_a_stalled_hub_fails_pull_and_generate_with_one_line(fake_hub, tiny_llada, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
    fake_hub.add_repo("tiny/llada", tiny_llada)
    fake_hub.stall()
    for argv in (["pull", "tiny/llada"], ["generate", "hi", "--model", "tiny/llada", *FAST]):
        started = time.monotonic()
        code, _, err = run(argv, capsys)
        assert time.monotonic() - started < 30
        assert_one_line(code, err, "did not answer within 1 s", "tiny/llada")


def test_launcher_flags_are_checked_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from flash_dllm.engine import Engine

    monkeypatch.setattr(Engine, "load", classmethod(lambda *a, **k: pytest.fail("loaded a model")))
    binary_auth = tmp_path / "auth.bin"
    binary_auth.write_bytes(b"\xff\xfeann:\x00secret")
    cases = [
        (["--auth", ""], ["--auth", "empty"]),
        (["--auth", "   "], ["--auth", "empty"]),
        (["--auth", str(binary_auth)], [str(binary_auth), "UTF-8"]),
        (["--port", "99999"], ["--port", "65535"]),
        (["--port", "0"], ["--port"]),
        (["--host", "no-such-host.invalid"], ["--host", "no-such-host.invalid"]),
        (["--host", "203.0.113.7"], ["--host", "not an address of this machine"]),
        (["--device", "gpu0"], ["--device", "unknown device"]),
        (["--dtype", "bf61"], ["--dtype", "'bf16', 'fp16'"]),  # the five load flags are generate's, with its choices
        (["--kernels", "cuda"], ["--kernels", "triton"]),
    ]
    for flags, needles in cases:
        code, _, err = run(["--no-browser", *flags], capsys)
        assert_one_line(code, err, *needles)
    for flags, needles in cases[-2:]:
        code, _, err = run(["serve", *flags], capsys)
        assert_one_line(code, err, *needles)
    home = unwritable(tmp_path, "ro-home")
    monkeypatch.setenv("FLASH_DLLM_HOME", str(home))
    code, _, err = run(["--no-browser"], capsys)
    assert_one_line(code, err, "cannot write", str(home / "data"), "FLASH_DLLM_HOME")
