"""API keys: which key the /v1 routes want, and the middleware that asks for it.

``--api-key KEY`` (or the environment variable FLASH_DLLM_API_KEY) makes every /v1 route want
``Authorization: Bearer KEY``. A shared app (a share link, or listening beyond this machine) always wants one:
when none is given, one is generated and printed at start, since anyone who can reach the app could otherwise
use the GPU through the API (the page's --auth login does not cover the API). The key is compared in constant
time and never echoed back.
"""
from __future__ import annotations

import os
import secrets

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

ENV_VAR = "FLASH_DLLM_API_KEY"


class ApiKeyError(ValueError):
    """An unusable --api-key (empty: an unset variable)."""


def api_key_for(given: str | None, shared: bool, environ=os.environ) -> tuple[str | None, bool]:
    """(the key the API wants or None, whether it was generated here). ``given`` is --api-key; an empty one is
    refused (``--api-key "$KEY"`` with KEY unset would otherwise open the API), an empty variable is unset."""
    if given is not None and not given.strip():
        raise ApiKeyError("--api-key is empty (an unset variable?); give a key, or leave the flag out")
    key = given.strip() if given is not None else (environ.get(ENV_VAR) or "").strip() or None
    if key is None and shared:
        return secrets.token_urlsafe(24), True
    return key, False


def bearer_token(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def refusal(message: str, code: str | None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


class BearerKey:
    """ASGI middleware: with a ``key``, an HTTP request without ``Authorization: Bearer <key>`` gets 401."""

    def __init__(self, app, key: str | None):
        self.app = app
        self.key = key.encode() if key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.key is not None:
            headers = Headers(scope=scope)
            token = bearer_token(headers)
            if token is None:
                message = ("no API key given: send the header 'Authorization: Bearer KEY' with the key the server "
                           f"was started with (--api-key or {ENV_VAR}, or the one it printed)")
                return await refusal(message, None)(scope, receive, send)
            if not secrets.compare_digest(token.encode(), self.key):
                return await refusal("incorrect API key", "invalid_api_key")(scope, receive, send)
        await self.app(scope, receive, send)
