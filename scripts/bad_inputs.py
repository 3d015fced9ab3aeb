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


# ---------------------------------------------------------------------------- served app: API, HTTP, page
def serve_app(model: Path):
    import torch

    from flash_dllm.app.chats import ChatStore
    from flash_dllm.app.launch import serve
    from flash_dllm.app.models import LoadOptions, ModelHost
    from flash_dllm.app.turns import AppContext
    from flash_dllm.engine import Engine

    torch.set_num_threads(1)
    ctx = AppContext(ModelHost(Engine.load(str(model), device="cpu"), LoadOptions(device="cpu"), name=str(model),
                               shelf_only=True), ChatStore(HOME / "app-chats"))
    return ctx, serve(ctx, port=None, auth=None)


def api_case(client, case: str, api_name: str, *args, **kwargs) -> None:
    from gradio_client.exceptions import AppError

    try:
        outputs = client.predict(*args, api_name=api_name, **kwargs)
    except AppError as err:  # Gradio's own check of a component's value
        record("api", case, "one line", str(err).splitlines()[0])
        return
    except Exception as err:  # noqa: BLE001
        record("api", case, "TRACEBACK", f"{type(err).__name__}: {err}")
        return
    text = " ".join(str(o) for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs]))
    if "fd-error" in text or "fd-warn" in text:
        note = text.split('class="fd-note', 1)[1].split(">", 1)[1].split("</div>", 1)[0]
        record("api", case, "one line", note)
    else:
        record("api", case, "ACCEPTED", text[:150])


def api_cases(url: str, ctx) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    short = dict(gen_length=32, block_length=16)
    for case, kwargs in [
        ("empty message", dict(message="")), ("whitespace message", dict(message=" \n\t ")),
        ("message over the size limit", dict(message="x" * 40_000)),
        ("message longer than the context", dict(message="word " * 3000)),
        ("gen length not a multiple of block", dict(message="hi", gen_length=48, block_length=32)),
        ("gen length 0", dict(message="hi", gen_length=0)), ("gen length negative", dict(message="hi", gen_length=-32)),
        ("block length 0", dict(message="hi", block_length=0)), ("threshold 0", dict(message="hi", threshold=0)),
        ("threshold 5", dict(message="hi", threshold=5)), ("gamma 0", dict(message="hi", gamma=0)),
        ("temperature -1", dict(message="hi", temperature=-1)),
        ("temperature 1e-9", dict(message="hi", temperature=1e-9)), ("seed 1.5", dict(message="hi", seed=1.5)),
        ("seed -5", dict(message="hi", seed=-5)), ("seed 2**70", dict(message="hi", seed=2**70)),
        ("window 0", dict(message="hi", window=0)), ("track -5", dict(message="hi", track=-5)),
        ("steps 7 (not a multiple)", dict(message="hi", steps=7)),
        ("max candidates -3", dict(message="hi", max_candidates=-3)),
        ("method unknown", dict(message="hi", method="nonsense")), ("method_b unknown (side by side)",
                                                                    dict(message="hi", side_by_side=True,
                                                                         method_b="nope")),
        ("gen length text", dict(message="hi", gen_length="abc")), ("gen length list", dict(message="hi",
                                                                                            gen_length=[32])),
    ]:
        api_case(client, f"chat: {case}", "/chat", **{**short, **kwargs})
    before = len(ctx.store.list())
    for case, chat_id in [("unknown id", "0" * 32), ("garbage id", "../x"), ("empty id", ""),
                          ("very long id", "a" * 5000)]:
        api_case(client, f"regenerate: {case}", "/regenerate", chat_id=chat_id, **short)
    if len(ctx.store.list()) != before:
        record("api", "regenerate created chats", "ACCEPTED", "a chat appeared")
    for case, args in [("rename unknown chat", ("0" * 32, "x")), ("rename to blank", ("0" * 32, "   ")),
                       ("rename garbage id", ("../..", "x"))]:
        api_case(client, case, "/rename_chat", *args)
    for case, args in [("delete unknown chat", ("0" * 32,)), ("delete nothing chosen", ("",)),
                       ("export unknown chat", ("0" * 32, "md"))]:
        api_case(client, case, {"d": "/delete_chat", "e": "/export_chat"}[case[0]], *args)
    for case, name in [("a server path", "/etc"), ("a missing path", str(HOME / "secret")),
                       ("a relative path up", "../.."), ("home", "~"), ("empty", ""),
                       ("a file", str(HOME / "batch.txt")), ("an uncached repo id", "org/absent")]:
        api_case(client, f"load_model: {case}", "/load_model", name)
    for case, name in [("a path", "/etc"), ("not a repo id", "not a repo"), ("../ repo id", "org/.."),
                       ("uncached repo offline", "org/absent"), ("empty", "")]:
        api_case(client, f"download_model: {case}", "/download_model", name)
    api_case(client, "export canvas before any answer", "/export_gif")
    api_case(client, "preset unknown", "/preset", "turbo", 128)


def http_cases(port: int) -> None:
    import http.client

    def ask(case, method, path, headers, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read()[:200].decode("utf-8", "replace")
        except Exception as err:  # noqa: BLE001
            record("http", case, "TRACEBACK", f"{type(err).__name__}: {err}")
            return
        finally:
            conn.close()
        ok = response.status >= 400
        record("http", case, "refused" if ok else "ACCEPTED", f"{response.status} {text}")

    local = f"127.0.0.1:{port}"
    for case, headers in [
        ("Host rebound to a foreign name", {"Host": f"evil.example:{port}"}),
        ("Host a subdomain trick", {"Host": f"127.0.0.1.evil.example:{port}"}),
        ("Host empty", {"Host": ""}), ("Host with a bad port", {"Host": "localhost:abc"}),
        ("Origin another localhost port", {"Host": local, "Origin": "http://localhost:3000"}),
        ("Origin 127.0.0.1 other port", {"Host": local, "Origin": f"http://127.0.0.1:{port + 1}"}),
        ("Origin null", {"Host": local, "Origin": "null"}),
        ("Origin a foreign site", {"Host": local, "Origin": "https://evil.example"}),
        ("Origin file://", {"Host": local, "Origin": "file://"}),
    ]:
        for path in ("/config", "/gradio_api/info"):
            ask(f"{case}: GET {path}", "GET", path, headers)
    # (Gradio answers a CORS preflight itself, before the guard; the request that follows it is refused here)
    ask("cross-origin POST queue/join", "POST", "/gradio_api/queue/join",
        {"Host": local, "Origin": "http://localhost:3000", "Content-Type": "application/json"}, b"{}")
    for path in ("/file=/etc/passwd", "/gradio_api/file=/etc/passwd", "/gradio_api/file=../../etc/passwd"):
        ask(f"file route {path}", "GET", path, {"Host": local})


def page_cases(url: str, ctx) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        record("page", "(playwright not installed: page cases skipped)", "refused", "")
        return
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("chromium not found: page cases skipped")
        return
    status = "() => (document.querySelector('#status') || {}).textContent || ''"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.goto(url)
        box = page.get_by_role("textbox", name="Message")
        box.wait_for(timeout=30_000)

        def typed(case, script, check, good="one line"):
            chats_before = len(ctx.store.list())
            page.evaluate(script)
            box.press("Enter")
            deadline = time.time() + 30
            while time.time() < deadline and not check(page.evaluate(status), ctx):
                time.sleep(0.25)
            note_text = page.evaluate(status).strip()
            if good == "one line" and len(ctx.store.list()) != chats_before:
                good = "ACCEPTED"  # a chat appeared for a message that was not sent
            record("page", case, good if check(note_text, ctx) else "ACCEPTED", note_text or "(nothing sent)")

        set_box = "() => { const b = document.querySelector('#message textarea'); b.value = %s; " \
                  "b.dispatchEvent(new Event('input', {bubbles: true})); }"
        kept = lambda note, ctx: any(m["content"] == "half \ufffd" for c in ctx.store.list() for m in c.messages)
        typed("lone surrogate in the message", set_box % "'half ' + String.fromCharCode(0xD800)", kept, "kept")
        page.wait_for_function(f"() => /Done|ready|Stopped/.test(({status})())", timeout=60_000)
        typed("empty message (Enter)", set_box % "''", lambda note, ctx: True)
        typed("whitespace message", set_box % "'   '", lambda note, ctx: True)
        typed("message over the size limit", set_box % "'x'.repeat(40000)", lambda note, ctx: "limit" in note)
        page.get_by_label("Chats").click()
        page.mouse.click(900, 30)
        time.sleep(1.0)
        note_text = page.evaluate(status)
        record("page", "open the Chats dropdown, click elsewhere",
               "ACCEPTED" if "no longer exists" in note_text else "one line", note_text.strip() or "(unchanged)")
        browser.close()


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
        ctx, demo = serve_app(model)
        try:
            api_cases(demo.local_url, ctx)
            http_cases(int(demo.local_url.rstrip("/").rsplit(":", 1)[1]))
            if not args.no_page:
                page_cases(demo.local_url, ctx)
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
