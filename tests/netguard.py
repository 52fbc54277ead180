"""Keeps the tests on this machine: a connection or a name lookup beyond loopback fails.

:func:`install` patches the socket module for the whole process (forked servers inherit
it). Loopback addresses (127.0.0.0/8, ::1), ``localhost``, Unix sockets and IP literals
without a connection are allowed. Anything else raises :class:`NetworkBlocked` before
any packet or DNS query leaves the box: ``socket.getaddrinfo`` refuses names it would
have to ask a resolver about, which also covers asyncio's ``loop.getaddrinfo`` (and so
httpx and anyio); ``socket.create_connection`` and asyncio's ``loop.create_connection``
are checked before they resolve anything.

NetworkBlocked is deliberately not an OSError, so code that handles connection errors
does not mistake it for a refused connection; and every attempt is recorded in
:data:`violations`, so the suite can fail a test whose code swallowed the exception.

Not covered: C libraries that open their own sockets (libpq for a synchronous psycopg
connection, Chromium), and subprocesses started with exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import Any

LOCAL_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost", "ip6-loopback"})


class NetworkBlocked(RuntimeError):
    """A test tried to reach beyond loopback."""


violations: list[str] = []
_lock = threading.Lock()
_originals: dict[str, Any] = {}
_expecting = 0


def _text(host: object) -> str | None:
    if isinstance(host, bytes):
        return host.decode("ascii", "replace")
    if isinstance(host, str):
        return host
    return None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None


def _is_loopback_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _is_local_name(host: str) -> bool:
    return host.lower() in LOCAL_NAMES


def _block(what: str) -> NetworkBlocked:
    message = (
        f"network guard: {what} is not loopback; tests must not leave this machine "
        "(use tests.fakeopenai or a server on 127.0.0.1)"
    )
    if not _expecting:
        with _lock:
            violations.append(message)
    return NetworkBlocked(message)


def check_address(family: int, address: object, action: str = "connect to") -> None:
    """Raise NetworkBlocked unless ``address`` (a socket address of ``family``) is local."""
    if family not in (socket.AF_INET, socket.AF_INET6):
        return  # Unix sockets, netlink...: never leave the machine
    if not isinstance(address, tuple) or not address:
        return  # a malformed address: let the socket call reject it
    host = _text(address[0])
    if host is None or _is_local(host):
        return
    raise _block(f"{action} {address!r}")


def check_lookup(host: object, action: str = "name lookup of") -> None:
    """Raise NetworkBlocked if resolving ``host`` could ask a DNS server."""
    text = _text(host)
    if text is None or text == "":
        return  # None or "": the wildcard / local address, no lookup
    if _ip(text) is not None or _is_local_name(text):
        return  # a literal needs no resolver; localhost comes from /etc/hosts
    raise _block(f"{action} {text!r}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    check_address(self.family, address)
    return _originals["connect"](self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    check_address(self.family, address)
    return _originals["connect_ex"](self, address)


def _guarded_sendto(self: socket.socket, data: Any, *args: Any) -> int:
    if args:
        check_address(self.family, args[-1], "send to")
    return _originals["sendto"](self, data, *args)


def _is_local(host: str) -> bool:
    ip = _ip(host)
    return _is_loopback_ip(ip) if ip is not None else _is_local_name(host)


def _guarded_create_connection(address: Any, *args: Any, **kwargs: Any) -> socket.socket:
    host = _text(address[0]) if isinstance(address, tuple) and address else None
    if host is not None and not _is_local(host):
        raise _block(f"create_connection to {address!r}")
    return _originals["create_connection"](address, *args, **kwargs)


async def _guarded_loop_create_connection(
    self: asyncio.AbstractEventLoop,
    protocol_factory: Any,
    host: Any = None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    # Checked up front: with happy_eyeballs_delay, asyncio loses a non-OSError raised by
    # sock.connect and reports an IndexError instead.
    text = _text(host)
    if text is not None and not _is_local(text):
        port = args[0] if args else kwargs.get("port")
        raise _block(f"create_connection to {(text, port)!r}")
    return await _originals["loop.create_connection"](self, protocol_factory, host, *args, **kwargs)


def _guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    check_lookup(host)
    return _originals["getaddrinfo"](host, *args, **kwargs)


def _guarded_gethostbyname(host: Any) -> str:
    check_lookup(host)
    return _originals["gethostbyname"](host)


def _guarded_gethostbyname_ex(host: Any) -> Any:
    check_lookup(host)
    return _originals["gethostbyname_ex"](host)


_SOCKET_METHODS = {
    "connect": _guarded_connect,
    "connect_ex": _guarded_connect_ex,
    "sendto": _guarded_sendto,
}
_MODULE_FUNCTIONS = {
    "create_connection": _guarded_create_connection,
    "getaddrinfo": _guarded_getaddrinfo,
    "gethostbyname": _guarded_gethostbyname,
    "gethostbyname_ex": _guarded_gethostbyname_ex,
}


def install() -> None:
    """Patch the socket module (idempotent)."""
    if _originals:
        return
    for name, guarded in _SOCKET_METHODS.items():
        _originals[name] = getattr(socket.socket, name)
        setattr(socket.socket, name, guarded)
    for name, guarded in _MODULE_FUNCTIONS.items():
        _originals[name] = getattr(socket, name)
        setattr(socket, name, guarded)
    _originals["loop.create_connection"] = asyncio.BaseEventLoop.create_connection
    asyncio.BaseEventLoop.create_connection = _guarded_loop_create_connection  # type: ignore[method-assign]


def uninstall() -> None:
    for name in _SOCKET_METHODS:
        if name in _originals:
            _originals.pop(name)
            delattr(socket.socket, name)  # inherited from _socket.socket again
    for name in _MODULE_FUNCTIONS:
        if name in _originals:
            setattr(socket, name, _originals.pop(name))
    if "loop.create_connection" in _originals:
        asyncio.BaseEventLoop.create_connection = _originals.pop("loop.create_connection")  # type: ignore[method-assign]


def installed() -> bool:
    return bool(_originals)


def take_violations() -> list[str]:
    """The attempts recorded since the last call (and forget them)."""
    with _lock:
        taken = list(violations)
        violations.clear()
    return taken


@contextlib.contextmanager
def expect_blocked() -> Iterator[None]:
    """Attempts inside the block still raise but are not recorded as violations
    (for the guard's own tests)."""
    global _expecting
    with _lock:
        _expecting += 1
    try:
        yield
    finally:
        with _lock:
            _expecting -= 1
