"""The console's security: the token and its login cookie, the session cookie and the CSRF token
bound to it, the same-origin rule for POSTs, read-only mode and the headers every response carries.

A pure ASGI middleware (:class:`Guard`) runs before any route: it adds the security headers to
every response (streams included), gives a browser without one a random session cookie, refuses a
POST from another origin (``Origin`` not the console's own, or absent with ``Sec-Fetch-Site:
cross-site``) and, in read-only mode, every POST but the login's (403); with a token it answers a
request that carries neither the login cookie nor ``Authorization: Bearer TOKEN`` with 401 (the API:
JSON; a page: the login form). The CSRF token of a form is an HMAC of the session cookie under a
secret drawn when the app is made: a form field a page of another origin cannot read or forge.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AUTH_COOKIE", "HEADERS", "SESSION_COOKIE", "Guard", "Secrets"]

#: The cookie a login sets, and the session cookie the CSRF tokens are bound to.
AUTH_COOKIE, SESSION_COOKIE = "gfd_auth", "gfd_session"

#: On every response.
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)

#: Paths anyone may reach without the token (the login page and its assets).
_OPEN = ("/login", "/static/")


class Secrets:
    """The token (if any) and the app's secret: the login cookie's value and the CSRF tokens."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self._key = secrets.token_bytes(32)

    def _mac(self, what: str) -> str:
        return hmac.new(self._key, what.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def login_cookie(self) -> str:
        """The value of the login cookie (an HMAC of the token: the token itself is never stored)."""
        return self._mac(f"auth:{self.token}")

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the token (constant time)."""
        return self.token is not None and hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), self.token.encode("utf-8", "surrogatepass")
        )

    def authenticated(self, request: Request) -> bool:
        """No token configured, or the request carries the login cookie or the bearer token."""
        if self.token is None:
            return True
        cookie = request.cookies.get(AUTH_COOKIE)
        if cookie is not None and hmac.compare_digest(cookie, self.login_cookie()):
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(given.strip())

    def csrf(self, session: str) -> str:
        """The CSRF token of forms sent by the holder of session cookie ``session``."""
        return self._mac(f"csrf:{session}")

    def csrf_ok(self, session: str | None, given: object) -> bool:
        """Whether ``given`` (a form's ``csrf`` field) is the token of ``session``."""
        return (
            isinstance(given, str) and bool(session) and hmac.compare_digest(given, self.csrf(str(session)))
        )


def session_of(request: Request) -> str:
    """The session id the guard gave (or found on) this request."""
    return str(request.scope.get("state", {}).get("session", ""))


def same_origin(headers: Headers, scope: Scope) -> bool:
    """Whether a POST comes from the console's own pages: its ``Origin`` (when present) is the
    console's origin; without one, ``Sec-Fetch-Site`` does not say cross-site."""
    origin = headers.get("origin")
    if origin is None:
        return headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")
    host = headers.get("host")
    return host is not None and origin == f"{scope.get('scheme', 'http')}://{host}"


class Guard:
    """The middleware: headers, session cookie, origin and read-only refusals, the token's 401."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Secrets,
        read_only: bool,
        refuse: Callable[[Request, int, str], Any],
    ) -> None:
        self.app = app
        self.keys = keys
        self.read_only = read_only
        self.refuse = refuse  # (request, status, why) -> an ASGI response (a page, or JSON for /api/)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        state = scope.setdefault("state", {})
        session = request.cookies.get(SESSION_COOKIE)
        fresh = not session or len(session) > 100
        state["session"] = secrets.token_urlsafe(24) if fresh else session
        root = scope.get("root_path", "") or ""
        cookie = (
            f"{SESSION_COOKIE}={state['session']}; Path={root or '/'}; HttpOnly; SameSite=Strict"
            + ("; Secure" if scope.get("scheme") == "https" else "")
        ).encode("latin-1")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() not in dict(HEADERS)]
                headers.extend(HEADERS)
                if fresh:
                    headers.append((b"set-cookie", cookie))
                message["headers"] = headers
            await send(message)

        path = scope.get("path", "")[len(root) :] if scope.get("path", "").startswith(root) else scope["path"]
        response = None
        if request.method == "POST" and not same_origin(request.headers, scope):
            response = self.refuse(request, 403, "refused: this request came from another site's page")
        elif request.method == "POST" and self.read_only and path != "/login":
            response = self.refuse(request, 403, "refused: the console is read-only")
        elif not path.startswith(_OPEN) and not self.keys.authenticated(request):
            response = self.refuse(request, 401, "log in: this console needs its token")
        if response is not None:
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


def json_error(status: int, message: str) -> bytes:
    """The API's error body: ``{"error": message}``."""
    return json.dumps({"error": message, "status": status}).encode()
