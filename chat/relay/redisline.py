"""The relay's admissions to Redis over one pipelined connection per event loop.

An admission is one ``EVALSHA`` of the limits' script (``limits._ADMIT``). With redis-py's
synchronous client each admission starting while others waited for their answers took a
connection of its own: a burst of a hundred requests opened a hundred connections, each
with four blocking round trips of set-up commands in the event loop and about 0.3 ms of
CPU. Here the commands are written as
they come, one after the other on one connection (asyncio's transport, so nothing blocks
the loop), and the protocol reads the answers in order and hands each to the callback
that sent its command. Redis runs each script atomically and in the order sent, so the
limits hold as before.

``redis://`` and ``unix://`` URLs (with their password, user and database); anything else
(``rediss://``) is not served here: :func:`line_for` answers None and the caller admits
the usual way.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from collections.abc import Callable
from typing import Any

CONNECT_TIMEOUT = 5.0  # seconds, as the synchronous client's socket timeout
REPLY_TIMEOUT = 5.0  # no answer for this long while commands wait: the connection is dropped

Reply = Any  # bytes, int, list, ReplyError, or the Unavailable raised for a lost connection


class Unavailable(Exception):
    """Redis could not be reached, or the connection was lost before the answer came."""


class ReplyError(Exception):
    """An error reply (``-ERR ...``, ``-NOSCRIPT ...``)."""


def encode(*parts: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


_INCOMPLETE = object()


def parse(buffer: bytes | bytearray, pos: int) -> tuple[Any, int]:
    """One RESP2 reply from ``pos``: (value, next position), or (_INCOMPLETE, pos)."""
    end = buffer.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE, pos
    kind, line, after = buffer[pos], bytes(buffer[pos + 1 : end]), end + 2
    if kind == 0x2B:  # +
        return line, after
    if kind == 0x2D:  # -
        return ReplyError(line.decode("utf-8", "replace")), after
    if kind == 0x3A:  # :
        return int(line), after
    if kind == 0x24:  # $
        size = int(line)
        if size < 0:
            return None, after
        if len(buffer) < after + size + 2:
            return _INCOMPLETE, pos
        return bytes(buffer[after : after + size]), after + size + 2
    if kind == 0x2A:  # *
        count = int(line)
        if count < 0:
            return None, after
        items = []
        for _ in range(count):
            item, after = parse(buffer, after)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, after
    raise ValueError(f"not a RESP reply: {bytes(buffer[pos : pos + 20])!r}")


class _Line(asyncio.Protocol):
    """One connection: commands written in order, answers handed to their callbacks in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._waiting: collections.deque[Callable[[Reply], None]] = collections.deque()
        self._progress = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, payload: bytes, on_reply: Callable[[Reply], None]) -> None:
        if self.closed or self.transport is None:
            on_reply(Unavailable("the connection to Redis is closed"))
            return
        if not self._waiting:
            self._progress = self._loop.time()
            if self._timer is None:
                self._timer = self._loop.call_later(REPLY_TIMEOUT, self._check)
        self._waiting.append(on_reply)
        self.transport.write(payload)

    def _check(self) -> None:
        self._timer = None
        if not self._waiting or self.closed:
            return
        idle = self._loop.time() - self._progress
        if idle >= REPLY_TIMEOUT:
            self.abort(Unavailable(f"Redis did not answer in {REPLY_TIMEOUT:g} s"))
        else:
            self._timer = self._loop.call_later(REPLY_TIMEOUT - idle, self._check)

    def data_received(self, data: bytes) -> None:
        self._progress = self._loop.time()
        buffer = self._buffer
        buffer += data
        pos = 0
        try:
            while pos < len(buffer) and self._waiting:
                value, pos_after = parse(buffer, pos)
                if value is _INCOMPLETE:
                    break
                pos = pos_after
                self._waiting.popleft()(value)
        except ValueError as exc:
            del buffer[:pos]
            self.abort(Unavailable(f"Redis sent something unreadable ({exc})"))
            return
        del buffer[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(Unavailable(f"the connection to Redis was lost ({exc or 'closed'})"))

    def abort(self, error: Unavailable) -> None:
        self._fail(error)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: Unavailable) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting, self._waiting = self._waiting, collections.deque()
        for on_reply in waiting:
            on_reply(error)


class Connection:
    """This loop's connection to one Redis URL, made when first needed and again after a loss."""

    def __init__(self, loop: asyncio.AbstractEventLoop, options: dict[str, Any]) -> None:
        self._loop = loop
        self._options = options
        self._line: _Line | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._queued: list[tuple[bytes, Callable[[Reply], None]]] = []

    def send(self, payload: bytes, on_reply: Callable[[Reply], None]) -> None:
        """Write ``payload`` (one command, RESP-encoded); ``on_reply`` gets its answer, a
        :class:`ReplyError`, or :class:`Unavailable` (in the loop, later or at once)."""
        line = self._line
        if line is not None and not line.closed:
            line.send(payload, on_reply)
            return
        self._queued.append((payload, on_reply))
        if self._connecting is None:
            self._connecting = self._loop.create_task(self._connect())

    async def _connect(self) -> None:
        options = self._options
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                if options.get("path"):
                    _transport, line = await self._loop.create_unix_connection(
                        lambda: _Line(self._loop), options["path"]
                    )
                else:
                    _transport, line = await self._loop.create_connection(
                        lambda: _Line(self._loop),
                        options.get("host", "localhost"),
                        options.get("port", 6379),
                    )
        except (OSError, TimeoutError) as exc:
            queued, self._queued = self._queued, []
            self._connecting = None
            error = Unavailable(f"Redis could not be reached ({type(exc).__name__}: {exc})")
            for _payload, on_reply in queued:
                on_reply(error)
            return
        self._connecting = None
        if options.get("password"):
            auth = [options["username"]] if options.get("username") else []
            line.send(encode("AUTH", *auth, options["password"]), _must_be_ok(line))
        if options.get("db"):
            line.send(encode("SELECT", options["db"]), _must_be_ok(line))
        self._line = line
        queued, self._queued = self._queued, []
        for payload, on_reply in queued:
            line.send(payload, on_reply)

    def close(self) -> None:
        if self._line is not None:
            self._line.abort(Unavailable("closed"))
            self._line = None


def _must_be_ok(line: _Line) -> Callable[[Reply], None]:
    def check(reply: Reply) -> None:
        if isinstance(reply, ReplyError):
            line.abort(Unavailable(f"Redis refused the connection's setup: {reply}"))

    return check


_connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Connection]] = (
    weakref.WeakKeyDictionary()
)


def line_for(url: str) -> Connection | None:
    """This event loop's connection to ``url`` (call from the loop), or None for a URL not
    served here (TLS)."""
    loop = asyncio.get_running_loop()
    kept = _connections.get(loop)
    if kept is None:
        kept = _connections[loop] = {}
    connection = kept.get(url)
    if connection is None:
        if not url.startswith(("redis://", "unix://")):
            return None
        from redis.connection import parse_url

        connection = kept[url] = Connection(loop, parse_url(url))
    return connection


def close_all() -> None:
    """Drop this process's connections (tests)."""
    for kept in list(_connections.values()):
        for connection in kept.values():
            connection.close()
    _connections.clear()
