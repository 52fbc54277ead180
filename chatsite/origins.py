"""The chat socket's Origin check: the full ``scheme://host:port``, compared exactly.

Channels' ``AllowedHostsOriginValidator`` compares host names only, so a page on
another port or scheme of the same host (or any subdomain, with a wildcard in
``ALLOWED_HOSTS``) could open a socket with the user's cookie. Browsers send the
cookie to every port of a host, and a socket has no CSRF check of its own: the
Origin is the only thing that tells the app's own page from another one.

A socket is accepted when its one ``Origin`` header is either

- listed in ``LYCEUM_TRUSTED_ORIGINS`` (by default ``CSRF_TRUSTED_ORIGINS``), or
- the origin the socket itself was opened on: its scheme (``wss`` is https; with
  ``LYCEUM_TRUST_X_FORWARDED_PROTO``, the proxy's ``X-Forwarded-Proto``) and its
  ``Host`` header, which must be one of ``ALLOWED_HOSTS``.

``null`` (sandboxed frames, ``file:`` pages), a missing or repeated Origin, and
anything that is not a bare http(s) origin are refused.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(value: str) -> str | None:
    """``scheme://host:port`` in lower case with the port spelled out; None if not an origin."""
    value = value.strip()
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    host = parts.hostname.lower()
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


def trusted_origins() -> set[str]:
    found = (normalize_origin(o) for o in settings.LYCEUM_TRUSTED_ORIGINS)
    return {origin for origin in found if origin}


def _header(scope: dict[str, Any], name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == name]


def own_origin(scope: dict[str, Any]) -> str | None:
    """The origin of the URL the socket was opened on, if its Host is an allowed one."""
    hosts = _header(scope, b"host")
    if len(hosts) != 1:
        return None
    domain, _port = split_domain_port(hosts[0])
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    if settings.LYCEUM_TRUST_X_FORWARDED_PROTO:
        forwarded = _header(scope, b"x-forwarded-proto")
        if forwarded and forwarded[-1].strip().lower() in DEFAULT_PORTS:
            scheme = forwarded[-1].strip().lower()
    return normalize_origin(f"{scheme}://{hosts[0]}")


def origin_allowed(scope: dict[str, Any]) -> bool:
    origins = _header(scope, b"origin")
    if len(origins) != 1:
        return False
    origin = normalize_origin(origins[0])
    if origin is None:  # "null", "file://", garbage
        return False
    return origin in trusted_origins() or origin == own_origin(scope)


class ExactOriginValidator:
    """ASGI middleware refusing a socket whose Origin is not exactly a trusted one."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
