"""The served app's half of scripts/bad_inputs.py: bad values through its API (gradio_client), requests at its
HTTP door (Host, Origin, file routes) and inputs typed in the page (chromium). Each case is passed to
``record(surface, case, outcome, message)``; the outcomes are those of scripts/bad_inputs.py."""
from __future__ import annotations

import shutil
import time
from pathlib import Path


def serve_app(model: Path, home: Path):
    import torch

    from flash_dllm.app.chats import ChatStore
    from flash_dllm.app.launch import serve
    from flash_dllm.app.models import LoadOptions, ModelHost
    from flash_dllm.app.turns import AppContext
    from flash_dllm.engine import Engine

    torch.set_num_threads(1)
    ctx = AppContext(ModelHost(Engine.load(str(model), device="cpu"), LoadOptions(device="cpu"), name=str(model),
                               shelf_only=True), ChatStore(home / "app-chats"))
    return ctx, serve(ctx, port=None, auth=None)


def api_case(record, client, case: str, api_name: str, *args, **kwargs) -> None:
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


def api_cases(record, url: str, ctx, home: Path) -> None:
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
        api_case(record, client, f"chat: {case}", "/chat", **{**short, **kwargs})
    before = len(ctx.store.list())
    for case, chat_id in [("unknown id", "0" * 32), ("garbage id", "../x"), ("empty id", ""),
                          ("very long id", "a" * 5000)]:
        api_case(record, client, f"regenerate: {case}", "/regenerate", chat_id=chat_id, **short)
    if len(ctx.store.list()) != before:
        record("api", "regenerate created chats", "ACCEPTED", "a chat appeared")
    for case, args in [("rename unknown chat", ("0" * 32, "x")), ("rename to blank", ("0" * 32, "   ")),
                       ("rename garbage id", ("../..", "x"))]:
        api_case(record, client, case, "/rename_chat", *args)
    for case, args in [("delete unknown chat", ("0" * 32,)), ("delete nothing chosen", ("",)),
                       ("export unknown chat", ("0" * 32, "md"))]:
        api_case(record, client, case, {"d": "/delete_chat", "e": "/export_chat"}[case[0]], *args)
    for case, name in [("a server path", "/etc"), ("a missing path", str(home / "secret")),
                       ("a relative path up", "../.."), ("home", "~"), ("empty", ""),
                       ("a file", str(home / "batch.txt")), ("an uncached repo id", "org/absent")]:
        api_case(record, client, f"load_model: {case}", "/load_model", name)
    for case, name in [("a path", "/etc"), ("not a repo id", "not a repo"), ("../ repo id", "org/.."),
                       ("uncached repo offline", "org/absent"), ("empty", "")]:
        api_case(record, client, f"download_model: {case}", "/download_model", name)
    api_case(record, client, "export canvas before any answer", "/export_gif")
    api_case(record, client, "preset unknown", "/preset", "turbo", 128)


def http_cases(record, port: int) -> None:
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


def page_cases(record, url: str, ctx) -> None:
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
