"""What a request may cost before the service has decided to serve it: plain ASGI
middleware, so that it also covers chunked bodies and clients that stall.

:class:`RequestGuard`, in this order, before any of the body is read:

1. A body declared (``Content-Length``) over ``max_body_bytes`` → 413.
2. With tokens configured, a request that carries a body (POST) and no valid bearer
   token → 401 at once. Its body is never read: an unauthenticated client cannot make
   the service hold its bytes.

Then, while the route reads the body:

3. More than ``max_body_bytes`` arriving (chunked) → 413.
4. The body not complete within ``body_timeout`` seconds of the request's start → 408.

A refusal before the body was read whole closes the connection (``Connection: close``):
its unread remainder would otherwise be taken for the next request. So a client that
sends headers and stalls is disconnected after at most ``body_timeout`` seconds
(``NNDX_BODY_TIMEOUT``, default 15), or at once when it has no valid token.

:class:`SecurityHeaders` adds to every answer the headers that keep pages inert when
they are framed or sniffed (``CONTENT_SECURITY_POLICY`` below).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Scripts, styles, images and fonts from the service itself only: no CDN, no inline
#: script or style, no eval, no plugins, no framing, no form posts elsewhere. The pages
#: are built for it (nndx/api/routers/pages.py) and tested under it in a real browser;
#: 'report-sample' names a blocked style in the violation report (plotly.js's map
#: module tries one inline <style> on load, which nndx does not need).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'report-sample'; img-src 'self'; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
]

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
UNAUTHENTICATED_PATHS = frozenset({"/healthz"})


class BodyRefused(Exception):
    """Raised from ``receive`` while the route reads the body; RequestGuard answers it."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout: float,
        is_authorized: Callable[[str | None], bool] | None = None,
    ) -> None:
        """``is_authorized(authorization_header)``: None when the service is open."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.is_authorized = is_authorized

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # when the request arrived, for deadlines that count from it (explain's)
        scope.setdefault("state", {})["received_at"] = asyncio.get_running_loop().time()
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _refuse(send, 413, f"request body larger than the limit of {self.max_body_bytes} bytes")
            return
        if (
            self.is_authorized is not None
            and scope["method"] in BODY_METHODS
            and scope["path"] not in UNAUTHENTICATED_PATHS
            and not self.is_authorized(_header(scope, b"authorization"))
        ):
            await _refuse(send, 401, "a valid bearer token is required", [(b"www-authenticate", b"Bearer")])
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, self._guarded(receive), send_tracking)
        except BodyRefused as refused:
            if not started:
                await _refuse(send, refused.status, refused.detail)

    def _guarded(self, receive: Receive) -> Receive:
        """``receive`` with the size limit and the body deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        received = 0
        complete = False

        async def guarded() -> Message:
            nonlocal received, complete
            if complete:  # after the body: only a disconnect can come, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise BodyRefused(408, f"the request body did not arrive within {self.body_timeout:g} s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyRefused(413, f"request body larger than the limit of {self.max_body_bytes} bytes")
                complete = not message.get("more_body", False)
            return message

        return guarded


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every HTTP answer that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in SECURITY_HEADERS if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _refuse(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """A JSON error that closes the connection (the body was not read)."""
    content = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(content)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None
