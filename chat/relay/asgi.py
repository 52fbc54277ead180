"""The relay's two routes as a raw ASGI app, in front of Django's handler.

``chatsite/asgi.py`` sends ``/api/v1/relay/chat/completions`` and ``/api/v1/relay/models``
here and everything else to Django. A streamed chunk then costs one ``send`` of the
upstream's bytes, not a trip through ``StreamingHttpResponse`` and Django's request
handler and middleware; the request itself skips the middleware chain (sessions, CSRF,
messages: none of which a Bearer-authenticated API uses). What Django's stack did that
the relay needs is done here: the Host check against ``ALLOWED_HOSTS``, the HTTPS
redirect, the body size limit, ``nosniff`` and ``X-Frame-Options``, a client that goes
away (the upstream call is cancelled and recorded). Auth, errors in OpenAI's shape,
limits and usage are the same code as the Django views (``views.py``, still routed for
anything that calls Django directly).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from chat import throttle
from chat.relay import quiet, service
from chat.relay.service import RelayError

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PREFIX = "/api/v1/relay/"
ROUTES = {f"{PREFIX}chat/completions": "POST", f"{PREFIX}models": "GET"}
BASE_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY")]


def handles(path: str) -> bool:
    return path in ROUTES


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers") or ()}


async def _json(
    send: Send, status: int, body: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    raw = json.dumps(body).encode("utf-8")
    await _respond(send, status, raw, b"application/json", extra)


async def _respond(
    send: Send,
    status: int,
    raw: bytes,
    content_type: bytes,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(raw)).encode()),
        *BASE_HEADERS,
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


async def _error(
    send: Send, error: RelayError, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = list(extra or [])
    if error.retry_after is not None:
        headers.append((b"retry-after", str(error.retry_after).encode()))
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await _json(send, error.status, error.body(), headers)


def _host_allowed(headers: dict[bytes, bytes]) -> bool:
    host = headers.get(b"host", b"").decode("latin-1")
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _is_secure(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    if scope.get("scheme") == "https":
        return True
    proxy = settings.SECURE_PROXY_SSL_HEADER
    if proxy:
        name, expected = proxy
        name = name.removeprefix("HTTP_").replace("_", "-").lower()
        value = headers.get(name.encode("latin-1"), b"").decode("latin-1")
        return value.split(",")[0].strip() == expected
    return False


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RelayError(413, "The request body is too large.", code="request_too_large")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI app of the relay's two routes (``scope["type"] == "http"``)."""
    path = scope["path"]
    method = ROUTES[path]
    headers = _headers(scope)
    if not _host_allowed(headers):
        await _error(send, RelayError(400, "Invalid Host header.", code="invalid_host"))
        return
    if settings.SECURE_SSL_REDIRECT and not _is_secure(scope, headers):
        host = headers.get(b"host", b"").decode("latin-1")
        query = scope.get("query_string", b"").decode("latin-1")
        location = f"https://{host}{path}" + (f"?{query}" if query else "")
        await _respond(send, 301, b"", b"text/plain", [(b"location", location.encode("latin-1"))])
        return
    starting = quiet.Starting()
    try:
        if scope["method"] != method:
            raise _MethodNotAllowed(method)
        scheme, _, raw = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        raw = raw.strip() if scheme.lower() == "bearer" else ""
        api_key = await service.authenticated(raw, throttle.scope_address(scope, headers))
        if method == "GET":
            await _models(send)
        else:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            limit = service.MAX_BODY_BYTES if limit is None else limit
            body = await _read_body(receive, limit)
            await _chat_completions(api_key, body, receive, send, starting)
    except _MethodNotAllowed as exc:
        error = RelayError(405, f"Use {exc.method}.", code="method_not_allowed")
        await _error(send, error, [(b"allow", exc.method.encode())])
    except RelayError as exc:
        await _error(send, exc)
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("relay request failed")
        await _error(
            send, RelayError(500, "The relay failed; try again.", "api_error", "internal_error")
        )
    finally:
        starting.done()


class _MethodNotAllowed(Exception):
    def __init__(self, method: str) -> None:
        super().__init__(method)
        self.method = method


async def _models(send: Send) -> None:
    from channels.db import database_sync_to_async

    data = await database_sync_to_async(service.list_models)()
    await _json(send, 200, {"object": "list", "data": data})


async def _chat_completions(
    api_key: Any, body: bytes, receive: Receive, send: Send, starting: quiet.Starting
) -> None:
    data = service.parse_body(body)
    prep = await service.prepared(api_key, data)
    outcome = service.Outcome()
    upstream = await service.open_upstream_recorded(prep, outcome)
    if not prep.stream:
        try:
            raw = await service.relay_once(prep, upstream, outcome)
        except RelayError as exc:
            outcome.http_status, outcome.error = exc.status, exc.message
            raise
        finally:
            service.finish(prep, outcome)
        await _respond(send, 200, raw, b"application/json")
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
                *BASE_HEADERS,
            ],
        }
    )
    stream = _stream(prep, upstream, outcome, send, starting)
    streaming = asyncio.ensure_future(stream)
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait([streaming, watching], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (streaming, watching):
            if not task.done():
                task.cancel()
        await asyncio.gather(streaming, watching, return_exceptions=True)
    if streaming.cancelled():
        return
    failure = streaming.exception()
    if failure is not None:  # the response has started: nothing to answer, only to log
        logger.error("relay stream failed", exc_info=failure)
        return
    await send({"type": "http.response.body", "body": b""})


async def _stream(
    prep: service.Prepared,
    upstream: Any,
    outcome: service.Outcome,
    send: Send,
    starting: quiet.Starting,
) -> None:
    chunks = service.relay_stream(prep, upstream, outcome)
    try:
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            starting.done()
    finally:
        await chunks.aclose()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
