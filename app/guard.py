"""Who may talk to the served app: the Host it is addressed as, the Origin of the page that asks, and how fast
wrong passwords may be tried.

- **DNS rebinding.** A web page on evil.example can make its own name resolve to 127.0.0.1 and then read the
  app as same-origin: its requests carry ``Host: evil.example``. Only requests addressed to a name the app is
  served as pass (localhost, the share link's host, the machine's names when it listens on the network);
  an IP literal cannot be rebound, so any IP literal passes.
- **Cross-origin pages.** Gradio answers CORS for every localhost origin, so a page on another local port
  could read the app. A request that carries an Origin must come from the app's own origin (scheme-less:
  the Origin's host and port must be the Host it asks); ``Origin: null`` (sandboxed frames, files) never
  passes. Navigations without an Origin (typing the address, following a link) are unaffected.
- **Password guessing.** At most `LOGIN_FAILURES` failed logins per client per `LOGIN_WINDOW_S`; after that,
  /login answers 429 until the oldest failure leaves the window. Behind the share tunnel every client comes
  from the tunnel's one address, so the limit is then global: guessing stays slow for everyone.
"""
from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
LOGIN_FAILURES = 5
LOGIN_WINDOW_S = 60.0
LOGIN_PATHS = ("/login", "/login/")
API_PREFIX = "/v1/"  # the OpenAI-compatible API (app/api.py)


def split_host(value: str) -> tuple[str, int | None]:
    """``host[:port]`` (or ``[v6]:port``) -> (lower-case host without brackets, port or None); ("", None) if
    it does not parse."""
    try:
        parts = urlsplit("//" + value.strip())
        return (parts.hostname or "").lower().rstrip("."), parts.port
    except ValueError:  # a port that is no number, a bracket left open
        return "", None


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass
class LoginLimiter:
    """Failed logins per client in a sliding window."""

    failures: int = LOGIN_FAILURES
    window_s: float = LOGIN_WINDOW_S
    _seen: dict[str, deque] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_s(self, client: str, now: float | None = None) -> float:
        """Seconds until ``client`` may try again (0: now)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._seen.get(client)
            if not times:
                return 0.0
            while times and now - times[0] >= self.window_s:
                times.popleft()
            return 0.0 if len(times) < self.failures else self.window_s - (now - times[0])

    def failed(self, client: str, now: float | None = None) -> None:
        with self._lock:
            self._seen.setdefault(client, deque()).append(time.monotonic() if now is None else now)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._seen.pop(client, None)


@dataclass
class AccessPolicy:
    """The names the app answers to; `add_host` takes the share link's host once the tunnel is up."""

    hosts: set[str] = field(default_factory=lambda: set(LOOPBACK_NAMES))
    logins: LoginLimiter = field(default_factory=LoginLimiter)

    @classmethod
    def for_address(cls, listen_host: str) -> "AccessPolicy":
        policy = cls()
        policy.add_host(listen_host)
        host = listen_host.strip().lower()
        if not (host in LOOPBACK_NAMES or (is_ip_literal(host) and ipaddress.ip_address(host).is_loopback)):
            for name in {socket.gethostname(), socket.getfqdn()}:  # on the network: the machine's own names
                policy.add_host(name)
        return policy

    def add_host(self, host_or_url: str | None) -> None:
        if host_or_url:
            name = urlsplit(host_or_url).hostname if "://" in host_or_url else split_host(host_or_url)[0]
            if name:
                self.hosts.add(name.lower().rstrip("."))

    def host_allowed(self, host_header: str) -> bool:
        name, _ = split_host(host_header)
        return bool(name) and (name in self.hosts or is_ip_literal(name))

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        """Same origin: the Origin's host and port are the Host the request was sent to."""
        parts = urlsplit(origin.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False
        try:
            origin_port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        host, port = split_host(host_header)
        default = 443 if parts.scheme == "https" else 80
        return parts.hostname.lower().rstrip(".") == host and origin_port == (port or default)


class GuardMiddleware:
    """ASGI middleware enforcing an `AccessPolicy` (installed through Gradio's ``app_kwargs``)."""

    def __init__(self, app, policy: AccessPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        host = headers.get("host", "")
        if not self.policy.host_allowed(host):
            return await refuse(scope, receive, send, 421, f"this app is not served as {host or 'an empty Host'}")
        origin = headers.get("origin")
        if origin is not None and not self.policy.origin_allowed(origin, host):
            return await refuse(scope, receive, send, 403, f"requests from {origin} are not accepted")
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in LOGIN_PATHS:
            return await self.login(scope, receive, send)
        return await self.app(scope, receive, send)

    async def login(self, scope, receive, send):
        client = (scope.get("client") or ("?", 0))[0]
        wait = self.policy.logins.wait_s(client)
        if wait > 0:
            return await refuse(scope, receive, send, 429, f"too many failed logins: try again in {wait:.0f} s",
                                [(b"retry-after", str(int(wait) + 1).encode())])
        status = {}

        async def watch(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if status.get("code") == 200:
            self.policy.logins.succeeded(client)
        elif status.get("code") in (400, 401, 403):
            self.policy.logins.failed(client)


async def refuse(scope, receive, send, status: int, message: str, extra_headers=()):
    if scope["type"] == "websocket":
        await receive()  # the connect message
        await send({"type": "websocket.close", "code": 1008})
        return
    if scope.get("path", "").startswith(API_PREFIX):  # API clients read OpenAI's error shape
        code = {421: "host_not_allowed", 403: "origin_not_allowed"}.get(status)
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": code}}).encode()
    else:
        body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra_headers]})
    await send({"type": "http.response.body", "body": body})
