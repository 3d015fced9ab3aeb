"""Try bad inputs on the command line, the served app's API, its HTTP door and the page, and print how each
was handled (the README's bad-input table is this script's summary):

    .venv/bin/python scripts/bad_inputs.py            # CLI + API + HTTP + page (chromium), a few minutes
    .venv/bin/python scripts/bad_inputs.py --no-page  # without the browser

Outcomes: ``one line`` (a single `error:` line and exit 2 on the CLI; a warning or error note in the page;
Gradio refusing a value outside a component's range), ``refused`` (an HTTP status that says no), ``kept``
(an odd input the app repairs and uses: a lone surrogate, a remembered model that is gone), and the
failures: ``TRACEBACK``, ``ACCEPTED`` (a bad input that ran as if it were fine) and ``HUNG`` (no answer within
its time limit). Everything runs on the CPU with random-weight tiny models in a temporary home.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = Path(tempfile.mkdtemp(prefix="flash-dllm-bad-inputs-"))
os.environ.update(FLASH_DLLM_HOME=str(HOME / "app"), HF_HOME=str(HOME / "hf"), HF_HUB_OFFLINE="1",
                  GRADIO_ANALYTICS_ENABLED="False", HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="1")
sys.path.insert(0, str(ROOT / "tests"))  # the fake Hub

from bad_inputs_app import api_cases, http_cases, page_cases, serve_app  # noqa: E402 (scripts/, beside this file)


@dataclass
class Outcome:
    surface: str
    case: str
    outcome: str
    message: str

    @property
    def handled(self) -> bool:
        return self.outcome in ("one line", "refused", "kept")


RESULTS: list[Outcome] = []


def record(surface: str, case: str, outcome: str, message: str) -> None:
    line = " ".join(str(message).split())
    RESULTS.append(Outcome(surface, case, outcome, line[:150]))
    print(f"{len(RESULTS):4d}  {surface:<5} {outcome:<10} {case[:60]:<60} {line[:110]}", flush=True)


# ---------------------------------------------------------------------------- command line
def run_cli(argv: list[str]) -> tuple[int, str, str]:
    from flash_dllm.app.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
        except BaseException as crash:  # noqa: BLE001 - that is what this script counts
            import traceback

            traceback.print_exc(file=err)
            code = f"raised {type(crash).__name__}"
    return code, out.getvalue(), err.getvalue()


def cli_case(case: str, argv: list[str]) -> None:
    code, out, err = run_cli(argv)
    lines = [line for line in err.strip().splitlines() if not line.startswith("note: ")]
    if "Traceback" in err or not isinstance(code, int):
        record("cli", case, "TRACEBACK", (err.strip().splitlines() or [str(code)])[-1])
    elif code == 0:
        record("cli", case, "ACCEPTED", out.strip().splitlines()[-1] if out.strip() else "(exit 0)")
    elif code == 2 and len(lines) == 1:
        record("cli", case, "one line", lines[0])
    else:
        record("cli", case, f"exit {code}", " | ".join(lines)[:150])


def broken_models(base: Path) -> dict[str, Path]:
    """Copies of a tiny model with one thing wrong each."""
    def variant(name, config=None, files=None, drop=()):
        folder = shutil.copytree(base, HOME / "broken" / name)
        if config is not None:
            raw = json.loads((folder / "config.json").read_text())
            config(raw)
            (folder / "config.json").write_text(json.dumps(raw))
        for file, data in (files or {}).items():
            (folder / file).write_bytes(data)
        for file in drop:
            (folder / file).unlink()
        return folder

    shard = sorted(base.glob("*.safetensors"))[0].name
    return {
        "n_heads 0": variant("heads0", lambda c: c.update(n_heads=0)),
        "d_model null": variant("dnull", lambda c: c.update(d_model=None)),
        "d_model text": variant("dtext", lambda c: c.update(d_model="big")),
        "n_layers -3": variant("layersneg", lambda c: c.update(n_layers=-3)),
        "n_kv_heads 3 of 4": variant("kv3", lambda c: c.update(n_kv_heads=3)),
        "vocab_size 0": variant("vocab0", lambda c: c.update(vocab_size=0, embedding_size=0)),
        "mask id outside vocab": variant("mask", lambda c: c.update(mask_token_id=10**9)),
        "rope_theta -1": variant("rope", lambda c: c.update(rope_theta=-1)),
        "model_type bert": variant("bert", lambda c: c.update(model_type="bert", architectures=["BertModel"])),
        "config a JSON array": variant("array", files={"config.json": b"[1, 2, 3]"}),
        "config binary": variant("binary", files={"config.json": b"\x89PNG\r\n\x1a\n\xff\x00"}),
        "config not JSON": variant("notjson", files={"config.json": b"{'single': quotes}"}),
        "config empty": variant("empty", files={"config.json": b""}),
        "no config": variant("noconfig", drop=["config.json"]),
        "bad index JSON": variant("index", files={"model.safetensors.index.json": b"{not json"}),
        "index names ../ shard": variant("indexup", files={"model.safetensors.index.json":
                                                           b'{"weight_map": {"a": "../../etc/passwd"}}'}),
        "truncated shard": variant("trunc", files={shard: (base / shard).read_bytes()[:1000]}),
        "missing shard": variant("noshard", drop=[shard]),
        "no tokenizer": variant("notok", drop=["tokenizer.json", "tokenizer_config.json"]),
    }


def cli_cases(model: Path) -> None:
    fast = ["--method", "llada", "--gen-length", "8", "--block-length", "8"]
    gen = ["generate", "hi", "--model", str(model), *fast]
    for flag, values in {
        "--temperature": ["nan", "inf", "-inf", "1e-320", "-1", "abc", ""],
        "--gamma": ["nan", "inf", "0", "-0.5"],
        "--cfg-scale": ["nan", "inf", "-1"],
        "--threshold": ["nan", "0", "1.5", "-1", "inf"],
        "--seed": [str(2**64), str(2**80), "-1", "1.5", "x"],
        "--gen-length": ["0", "-8", "7", "eight", str(10**9)],
        "--block-length": ["0", "-1", "3"],
        "--steps": ["0", "-1", "100"],
        "--window": ["0", "-1"], "--lookahead": ["-1"], "--track": ["-2"],
        "--device": ["gpu0", "mps", "meta", "cuda:x", "cpu:abc", "xpu", "cuda"],
        "--dtype": ["fp8", "int4", ""], "--kernels": ["cuda", "", "triton"],
        "--method": ["nonsense", ""], "--acceptance": ["maybe"], "--cache-mode": ["none"],
    }.items():
        for value in values:
            cli_case(f"generate {flag} {value!r}", [*gen, flag, value])
    batch = HOME / "batch.txt"
    batch.write_text("one\ntwo\n")
    latin = HOME / "latin1.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    blank = HOME / "blank.txt"
    blank.write_text("\n  \n")
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")
    for case, argv in [
        ("generate PROMPT --batch-file F", ["generate", "x", "--batch-file", str(batch), "--model", str(model), *fast]),
        ("--batch-file latin-1", ["generate", "--batch-file", str(latin), "--model", str(model), *fast]),
        ("--batch-file blank lines only", ["generate", "--batch-file", str(blank), "--model", str(model), *fast]),
        ("--batch-file missing", ["generate", "--batch-file", str(HOME / "nope.txt"), "--model", str(model)]),
        ("--batch-file is a folder", ["generate", "--batch-file", str(HOME), "--model", str(model)]),
        ("--prompt and PROMPT", ["generate", "a", "--prompt", "b", "--model", str(model)]),
        ("--prompt and --batch-file", ["generate", "--prompt", "a", "--batch-file", str(batch)]),
        ("empty prompt", ["generate", "", "--model", str(model), *fast]),
        ("whitespace prompt", ["generate", " \t\n", "--model", str(model), *fast]),
        ("no prompt", ["generate", "--model", str(model)]),
        ("non-UTF-8 prompt bytes", ["generate", undecodable, "--model", str(model), *fast]),
        ("non-UTF-8 --system", ["generate", "hi", "--system", undecodable, "--model", str(model), *fast]),
        ("prompt longer than the context", ["generate", "word " * 3000, "--model", str(model), *fast]),
        ("--model missing folder", ["generate", "hi", "--model", str(HOME / "missing"), *fast]),
        ("--model a file", ["generate", "hi", "--model", str(batch), *fast]),
        ("--model not a repo id", ["generate", "hi", "--model", "a/b/c", *fast]),
        ("--model ../ repo id", ["generate", "hi", "--model", "org/..", *fast]),
        ("--model uncached repo offline", ["generate", "hi", "--model", "org/absent", *fast]),
        ("--model ''", ["generate", "hi", "--model", " ", *fast]),
        ("unknown flag", ["generate", "hi", "--bogus"]),
        ("unknown command", ["frobnicate"]),
        ("pull not a repo id", ["pull", "not a repo"]),
        ("pull ../", ["pull", "../.."]),
        ("pull offline, uncached", ["pull", "org/absent"]),
    ]:
        cli_case(case, argv)
    for name, folder in broken_models(model).items():
        cli_case(f"generate --model <{name}>", ["generate", "hi", "--model", str(folder), *fast])
    launcher_cases(model)
    hub_cases(model, fast)


def launcher_cases(model: Path) -> None:
    from flash_dllm.app import launch

    binary = HOME / "auth.bin"
    binary.write_bytes(b"\xff\xfeann:\x00")
    empty = HOME / "auth-empty.txt"
    empty.write_text("# nobody\n")
    nocolon = HOME / "auth-nocolon.txt"
    nocolon.write_text("ann\n")
    blocker = HOME / "a-file"
    blocker.write_text("")
    base = ["--no-browser", "--model", str(model)]

    def served(*args, **kwargs):  # a case that got past every check would serve the page: count it, stop there
        raise RuntimeError("ACCEPTED: the app started")

    original, launch.serve = launch.serve, served
    try:
        for case, flags in [
            ("--auth ''", ["--auth", ""]), ("--auth '   '", ["--auth", "   "]), ("--auth no-colon", ["--auth", "ann"]),
            ("--auth :pw", ["--auth", ":pw"]), ("--auth user:", ["--auth", "ann:"]),
            ("--auth binary file", ["--auth", str(binary)]), ("--auth file without users", ["--auth", str(empty)]),
            ("--auth file line without colon", ["--auth", str(nocolon)]), ("--port 99999", ["--port", "99999"]),
            ("--port 0", ["--port", "0"]), ("--port -1", ["--port", "-1"]), ("--port abc", ["--port", "abc"]),
            ("--host unresolvable", ["--host", "no-such-host.invalid"]),
            ("--host foreign IP", ["--host", "203.0.113.7"]), ("--host ''", ["--host", ""]),
            ("--device gpu0", ["--device", "gpu0"]), ("--device mps", ["--device", "mps"]),
        ]:
            cli_case(f"app {case}", [*base, *flags])
        os.environ["FLASH_DLLM_HOME"] = str(blocker / "home")  # nothing can be created there, even by root
        cli_case("app with an unwritable data folder", base)
    finally:
        launch.serve = original
    code, out, err = run_cli(["generate", "hi", "--model", str(model), "--method", "llada", "--gen-length", "8",
                              "--block-length", "8"])
    record("cli", "generate with an unwritable home (must work)", "kept" if code == 0 else "TRACEBACK",
           "answered" if code == 0 else err)
    os.environ["FLASH_DLLM_HOME"] = str(HOME / "app")
    from flash_dllm.app.paths import remember_model

    remember_model(str(HOME / "deleted-model"))
    code, out, err = run_cli(["generate", "hi", "--method", "llada", "--gen-length", "8", "--block-length", "8"])
    record("cli", "remembered last model deleted (falls back)", "kept" if code == 0 and "bundled" in err
           else "TRACEBACK" if "Traceback" in err else "ACCEPTED", err.strip())


def hub_cases(model: Path, fast: list[str]) -> None:
    from fakehub import FakeHub

    hub = FakeHub(root=HOME / "hub-root").start()
    saved = dict(os.environ)
    os.environ.update(HF_ENDPOINT=hub.endpoint, HF_HUB_DOWNLOAD_TIMEOUT="2", HF_HOME=str(HOME / "hf-online"))
    os.environ.pop("HF_HUB_OFFLINE", None)
    try:
        hub.add_repo("tiny/model", model)
        hub.add_repo("org/bert", extra={"config.json": b'{"model_type": "bert"}', "model.safetensors": b"0" * 100})
        hub.add_repo("org/pickles", extra={"config.json": (model / "config.json").read_bytes(),
                                           "pytorch_model.bin": b"x" * 100})
        cli_case("pull unsupported repo", ["pull", "org/bert"])
        cli_case("pull pickle-only repo", ["pull", "org/pickles"])
        cli_case("pull unknown repo", ["pull", "org/nothing"])
        hub.stall()
        for case, argv in [("pull, Hub stalled", ["pull", "tiny/model"]),
                           ("generate --model org/name, Hub stalled", ["generate", "hi", "--model", "tiny/model",
                                                                        *fast])]:
            started = time.monotonic()
            cli_case(case, argv)
            if time.monotonic() - started > 60:
                RESULTS[-1].outcome = "HUNG"
    finally:
        hub.stop()
        os.environ.clear()
        os.environ.update(saved)


# ---------------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-page", action="store_true", help="skip the real-browser cases")
    args = parser.parse_args()
    from flash_dllm.engine.tiny import TinySpec, write_tiny_model

    model = write_tiny_model(HOME / "models" / "tiny-llada", TinySpec("llada"))
    started = time.monotonic()
    try:
        cli_cases(model)
        ctx, demo = serve_app(model, HOME)
        try:
            api_cases(record, demo.local_url, ctx, HOME)
            http_cases(record, int(demo.local_url.rstrip("/").rsplit(":", 1)[1]))
            if not args.no_page:
                page_cases(record, demo.local_url, ctx)
        finally:
            demo.close()
    finally:
        shutil.rmtree(HOME, ignore_errors=True)
    print(f"\n{len(RESULTS)} bad inputs in {time.monotonic() - started:.0f} s")
    for surface in ("cli", "api", "http", "page"):
        mine = [r for r in RESULTS if r.surface == surface]
        if mine:
            print(f"  {surface:<5} {len(mine):4d} tried, {sum(r.handled for r in mine):4d} handled")
    failures = [r for r in RESULTS if not r.handled]
    for r in failures:
        print(f"  NOT HANDLED [{r.surface}] {r.case}: {r.outcome} {r.message}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
