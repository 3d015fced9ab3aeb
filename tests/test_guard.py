"""app/guard.py: the Host/Origin checks against DNS rebinding and cross-origin pages, and the login rate
limit, on the policy alone and on a served app (plain HTTP, as a hostile page's browser would send it)."""
from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse

import pytest

from flash_dllm.app.guard import AccessPolicy, LoginLimiter, split_host
from app_testing import free_port  # noqa: E402

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def test_split_host_reads_names_ports_and_ipv6():
    assert split_host("LocalHost:7860") == ("localhost", 7860)
    assert split_host("[::1]:80") == ("::1", 80)
    assert split_host("127.0.0.1") == ("127.0.0.1", None)
    assert split_host("evil.example.:7860") == ("evil.example", 7860)
    assert split_host("host:notaport") == ("", None)


def test_hosts_the_app_is_served_as_pass_and_rebound_names_do_not():
    policy = AccessPolicy.for_address("127.0.0.1")
    for host in ("127.0.0.1:7860", "localhost:7860", "[::1]:7860", "LOCALHOST", "10.1.2.3:7860"):
        assert policy.host_allowed(host), host
    for host in ("evil.example:7860", "", "127.0.0.1.nip.io:7860", "localhost.evil.example", "host:bad"):
        assert not policy.host_allowed(host), host
    policy.add_host("https://abcd1234.gradio.live")
    assert policy.host_allowed("abcd1234.gradio.live") and not policy.host_allowed("other.gradio.live")


def test_an_origin_passes_only_when_it_is_the_app_itself():
    policy = AccessPolicy.for_address("127.0.0.1")
    assert policy.origin_allowed("http://127.0.0.1:7860", "127.0.0.1:7860")
    assert policy.origin_allowed("https://abcd.gradio.live", "abcd.gradio.live")
    for origin in ("http://localhost:3000", "http://127.0.0.1:7861", "null", "http://evil.example",
                   "http://localhost:7860", "file://", "http://127.0.0.1:99999"):
        assert not policy.origin_allowed(origin, "127.0.0.1:7860"), origin


def test_login_limiter_window():
    limiter = LoginLimiter(failures=3, window_s=10.0)
    for t in (0.0, 1.0, 2.0):
        assert limiter.wait_s("a", now=t) == 0
        limiter.failed("a", now=t)
    assert limiter.wait_s("a", now=3.0) == pytest.approx(7.0)
    assert limiter.wait_s("b", now=3.0) == 0  # per client
    assert limiter.wait_s("a", now=10.5) == 0  # the oldest failure left the window
    limiter.failed("a", now=11.0)
    limiter.succeeded("a")
    assert limiter.wait_s("a", now=11.5) == 0



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The page served with a login and no model (nothing here decodes)."""
    from flash_dllm.app.chats import ChatStore
    from flash_dllm.app.launch import serve
    from flash_dllm.app.models import ModelHost
    from flash_dllm.app.turns import AppContext

    ctx = AppContext(ModelHost(), ChatStore(tmp_path_factory.mktemp("chats")))
    port = free_port()
    policy = AccessPolicy.for_address("127.0.0.1")
    policy.logins = LoginLimiter(failures=5, window_s=3.0)  # the app's window is a minute; a test waits less
    demo = serve(ctx, port=port, auth=[("ann", "secret")], policy=policy)
    try:
        yield port
    finally:
        demo.close()


def request(port: int, method: str, path: str, headers: dict, body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def login(port: int, password: str, host: str | None = None, origin: str | None = None):
    headers = {"Host": host or f"127.0.0.1:{port}", "Content-Type": "application/x-www-form-urlencoded"}
    if origin:
        headers["Origin"] = origin
    return request(port, "POST", "/login", headers, urllib.parse.urlencode({"username": "ann",
                                                                             "password": password}).encode())


def test_a_rebound_host_and_foreign_origins_are_refused_before_anything_is_read(served):
    port = served
    status, _, body = request(served, "GET", "/config", {"Host": f"evil.example:{port}"})
    assert status == 421 and b"not served as" in body
    status, headers, body = request(served, "GET", "/config", {"Host": f"127.0.0.1:{port}",
                                                               "Origin": "http://localhost:3000"})
    assert status == 403 and b"not accepted" in body
    status, _, _ = request(served, "GET", "/config", {"Host": f"127.0.0.1:{port}", "Origin": "null"})
    assert status == 403
    status, _, _ = login(port, "secret", host=f"evil.example:{port}")
    assert status == 421  # not even a right password passes under a rebound name
    status, _, _ = request(served, "GET", "/config", {"Host": f"127.0.0.1:{port}"})
    assert status == 401  # the right host reaches Gradio, which asks for the login


def test_failed_logins_are_rate_limited_and_a_right_one_passes_afterwards(served):
    port = served
    same_origin = f"http://127.0.0.1:{port}"
    codes = [login(port, f"wrong{i}", origin=same_origin)[0] for i in range(8)]
    assert codes[:5] == [400] * 5 and codes[5:] == [429] * 3, codes
    status, headers, body = login(port, "secret", origin=same_origin)
    assert status == 429 and int(headers["retry-after"]) > 0 and b"try again" in body  # locked for everyone
    time.sleep(3.2)
    status, _, body = login(port, "secret", origin=same_origin)
    assert status == 200 and json.loads(body) == {"success": True}
