"""Lyceum's own HTTP/1.1 client for its upstreams: one request, its response head, its
body in as few pieces as the network delivers it. Used by the relay (``chat/relay/service.py``)
and by the OpenAI-compatible provider (``chat/llm/openai.py``).

httpx (on httpcore and h11) turned a streamed body into one h11 event per HTTP chunk, each
passed up through four async generators: for a 200-token stream about 200 events where the
caller reads the network about 50 times (paced reads), a third of the relay's CPU per
streamed token. Here a read of the network is de-chunked in one pass and handed on whole.
The connections are ``chat.llm.netbackend``'s (plain asyncio, TLS with ``start_tls``, reads
that can be paced), kept alive per host and port in a small pool; a kept connection that
the server closed meanwhile is noticed before it is used (the event loop has seen its end)
or, when the request fails before any byte of an answer, the request is sent again once on
a new connection.

Only what the two callers send is done: ``POST`` with a body in memory and ``GET``, answers
framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the end of the connection,
``1xx`` answers skipped; no redirects followed, no content decoded (the callers ask for
``identity``). When the environment configures a proxy for the upstream's URL the relay's
:class:`Client` sends the request through httpx instead (:class:`_HttpxResponse`, the same
interface), which knows how to use it; the provider keeps its own httpx client for that.
Errors are :class:`UpstreamError`, named by their subclass after httpx's (``ConnectError``,
``ConnectTimeout``, ``ReadError``, ``RemoteProtocolError``, ``InvalidURL``), with the
network's own exception as their cause.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import re
import ssl
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from chat.llm.netbackend import AsyncioBackend, AsyncioStream, environment_proxy_for

MAX_HEAD = 64 * 1024  # bytes of status line and headers
READ_SIZE = 256 * 1024
KEEPALIVE_SECONDS = 5.0  # an idle kept connection older than this is closed, not reused
MAX_IDLE_PER_HOST = 200
MAX_SPARES = 8  # spare connections per origin (Pool's spare_when)


class UpstreamError(Exception):
    """The upstream could not be reached, or the connection failed or ended early."""


class ConnectError(UpstreamError):
    """No connection to the upstream (refused, unresolved, TLS refused)."""


class ConnectTimeout(ConnectError):
    """Connecting (TCP or the TLS handshake) took longer than the connect timeout."""


class InvalidURL(UpstreamError):
    """Not an http(s) URL with a host (and a valid port)."""


class ReadError(UpstreamError):
    """Reading the connection failed (reset, say)."""


class RemoteProtocolError(UpstreamError):
    """The upstream broke HTTP: a malformed answer, or the connection closed before its end."""


class Response:
    """One upstream answer on a connection of the pool: status and headers read."""

    def __init__(
        self,
        pool: Pool,
        origin: tuple[str, str, int],
        stream: AsyncioStream,
        status: int,
        headers: dict[str, str],
        rest: bytes,
        reusable: bool,
    ) -> None:
        self._pool, self._origin, self.network = pool, origin, stream
        self.status_code = status
        self.headers = headers  # names in lower case
        self._raw = rest  # received, not yet decoded
        self._reusable = reusable
        self._closed = False
        self.complete = False
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left = -1  # bytes left in the current chunk (chunked) or the body (length)
        self._close_delimited = False
        if self._chunked:
            self._left = 0
            self._need_size = True
        elif length is not None:
            try:
                self._left = int(length)
            except ValueError:
                raise RemoteProtocolError("bad Content-Length") from None
            self._need_size = False
            if self._left <= 0:
                self.complete = True
        else:
            self._close_delimited = True
            self._reusable = False
            self._need_size = False
        if status in (204, 304):
            self.complete = True

    def pending(self) -> bool:
        """Would the next read return at once (bytes received and not read yet)?"""
        return bool(self.network.buffered())

    def _decode(self) -> bytes:
        """The body bytes in ``_raw`` that can be told apart now (consumed from it)."""
        raw = self._raw
        if self._close_delimited:
            self._raw = b""
            return raw
        if not self._chunked:
            take = raw[: self._left]
            self._raw = raw[self._left :]
            self._left -= len(take)
            if self._left == 0:
                self.complete = True
            return take
        out: list[bytes] = []
        pos = 0
        size = len(raw)
        while pos < size:
            if self._left > 0:
                end = min(size, pos + self._left)
                out.append(raw[pos:end])
                self._left -= end - pos
                pos = end
                if self._left:
                    break
                self._left = -2  # the chunk's CRLF next
            if self._left == -2:
                if size - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    raise RemoteProtocolError("a chunk did not end with CRLF")
                pos += 2
                self._left = 0
                continue
            if self._left == -3:  # after the last chunk: trailers up to an empty line
                end = raw.find(b"\r\n", pos)
                if end < 0:
                    break
                empty = end == pos
                pos = end + 2
                if empty:
                    self.complete = True
                    break
                continue
            end = raw.find(b"\r\n", pos)
            if end < 0:
                if size - pos > 1024:
                    raise RemoteProtocolError("a chunk size line is too long")
                break
            try:
                chunk = int(raw[pos:end].split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise RemoteProtocolError("a bad chunk size") from None
            if chunk < 0:
                raise RemoteProtocolError("a bad chunk size")
            pos = end + 2
            self._left = chunk if chunk else -3
        self._raw = raw[pos:]
        return b"".join(out)

    async def aiter_body(self, idle: float | None = None) -> AsyncIterator[bytes]:
        """The body, one piece per network read (empty pieces skipped); ``TimeoutError``
        when nothing arrives for ``idle`` seconds (the timer is set only for a read
        that has to wait)."""
        if self._raw or self.complete:
            data = self._decode()
            if data:
                yield data
        while not self.complete:
            try:
                received = await self.network.read(READ_SIZE, idle)
            except httpcore.ReadTimeout as exc:
                raise TimeoutError("the upstream sent nothing for too long") from exc
            except Exception as exc:  # httpcore's ReadError
                raise ReadError(f"reading the upstream failed: {exc}") from exc
            if not received:
                if self._close_delimited:
                    self.complete = True
                    return
                raise RemoteProtocolError(
                    "the upstream closed the connection before the body ended"
                )
            self._raw += received
            data = self._decode()
            if data:
                yield data

    async def aread(self) -> bytes:
        parts = [piece async for piece in self.aiter_body()]
        return b"".join(parts)

    async def aclose(self) -> None:
        """Give the connection back for the next request (a whole body read, keep-alive),
        else close it."""
        if self._closed:
            return
        self._closed = True
        if self.complete and self._reusable and not self._raw:
            self.network.pace_reads(0.0)
            self._pool.release(self._origin, self.network)
        else:
            await self.network.aclose()


class Pool:
    """Kept-alive connections per (scheme, host, port), for one event loop.

    With ``spare_when`` (the relay's), an answer that closes its connection
    (``Connection: close``, or no keep-alive at all) has a spare connection to the same
    origin opened in its place, once ``spare_when()`` returns (the relay: a moment when no
    request is starting), so the next request finds one ready instead of connecting (and
    shaking hands over TLS) before it can send. At most ``MAX_SPARES`` per origin, only
    on the heels of such an answer, and closed like any kept connection once idle for
    ``KEEPALIVE_SECONDS``: no traffic, no spares.
    """

    def __init__(
        self,
        connect_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        spare_when: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        # Per origin, oldest first; the newest is reused first (it is the likeliest open).
        self._idle: dict[tuple[str, str, int], collections.deque[tuple[AsyncioStream, float]]] = {}
        self._backend = AsyncioBackend()
        self._connect_timeout = connect_timeout
        self._ssl: ssl.SSLContext | None = ssl_context  # built at the first https connection
        self._spare_when = spare_when
        self._opening: dict[tuple[str, str, int], int] = {}  # spares being opened, per origin
        self._tasks: set[asyncio.Task[None]] = set()

    def _spare(self, origin: tuple[str, str, int]) -> None:
        """Open a spare connection to ``origin`` soon (see the class)."""
        idle = self._idle.get(origin)
        opening = self._opening.get(origin, 0)
        if opening + (len(idle) if idle else 0) >= MAX_SPARES:
            return
        self._opening[origin] = opening + 1
        # A context of its own: not the request's (its task may be cancelled, its
        # context variables are its own).
        task = asyncio.get_running_loop().create_task(
            self._open_spare(origin), context=contextvars.Context()
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_spare(self, origin: tuple[str, str, int]) -> None:
        try:
            assert self._spare_when is not None
            await self._spare_when()
            stream = await self._connect(origin)
        except UpstreamError:
            return  # the next request connects, and finds what is wrong
        finally:
            self._opening[origin] -= 1
        self.release(origin, stream)
        # Closed when idle too long even if no request comes to prune it.
        asyncio.get_running_loop().call_later(KEEPALIVE_SECONDS + 0.1, self._prune_origin, origin)

    def _prune_origin(self, origin: tuple[str, str, int]) -> None:
        idle = self._idle.get(origin)
        if idle:
            _prune(idle, time.monotonic())

    def release(self, origin: tuple[str, str, int], stream: AsyncioStream) -> None:
        idle = self._idle.setdefault(origin, collections.deque())
        now = time.monotonic()
        _prune(idle, now)
        if len(idle) < MAX_IDLE_PER_HOST:
            idle.append((stream, now))
        else:
            _abort(stream)

    def _kept(self, origin: tuple[str, str, int]) -> AsyncioStream | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        if idle:
            _prune(idle, now)
        while idle:
            stream, since = idle.pop()
            if now - since < KEEPALIVE_SECONDS and not stream.get_extra_info("is_readable"):
                return stream
            _abort(stream)  # closed by the server (or sent something unasked), or too old
        return None

    async def _connect(self, origin: tuple[str, str, int]) -> AsyncioStream:
        scheme, host, port = origin
        try:
            stream: Any = await self._backend.connect_tcp(host, port, self._connect_timeout)
            if scheme == "https":
                if self._ssl is None:
                    self._ssl = httpx.create_ssl_context()
                stream = await stream.start_tls(self._ssl, host, self._connect_timeout)
        except httpcore.ConnectTimeout as exc:
            raise ConnectTimeout("connecting to the upstream timed out") from exc
        except Exception as exc:  # httpcore's ConnectError
            raise ConnectError(f"connecting to the upstream failed: {type(exc).__name__}") from exc
        return typing.cast(AsyncioStream, stream)

    async def warm(self, url: str) -> None:
        """Have a connection to ``url``'s host ready for the next request (connect now
        unless one is kept). A failure is left for that request to find."""
        try:
            origin = _origin(urlsplit(url))
        except UpstreamError:
            return
        idle = self._idle.get(origin)
        if idle and not idle[-1][0].get_extra_info("is_readable"):
            return
        try:
            stream = await self._connect(origin)
        except UpstreamError:
            return
        self.release(origin, stream)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Response:
        return await self.request("POST", url, body, headers)

    async def request(
        self, method: str, url: str, body: bytes | None, headers: dict[str, str]
    ) -> Response:
        """Send ``method`` to ``url`` (``body`` None: no body, no ``Content-Length``); the
        answer with its status and headers read, its body still to read."""
        parts = urlsplit(url)
        origin = _origin(parts)
        host = parts.netloc.rpartition("@")[2]
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        if _UNSAFE.search(path):  # spaces, controls, non-ASCII: percent-encoded as httpx does
            path = _UNSAFE.sub(
                lambda found: "".join(f"%{byte:02X}" for byte in found[0].encode()), path
            )
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError:
                raise InvalidURL("a host name that cannot be encoded") from None
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if any(_BREAKS.search(line) for line in lines):  # as h11 refuses them
            raise InvalidURL("a line break in the URL or a header")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        try:
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        except UnicodeEncodeError:
            raise InvalidURL("a header or the URL is not Latin-1") from None
        request = head + body if body else head
        stream = self._kept(origin)
        if stream is not None:
            try:
                return await self._exchange(origin, stream, request)
            except _NothingBack:
                pass  # the server closed the kept connection meanwhile: once more, anew
        stream = await self._connect(origin)
        try:
            return await self._exchange(origin, stream, request)
        except _NothingBack as exc:
            raise RemoteProtocolError(str(exc)) from exc.__cause__

    async def aclose(self) -> None:
        """Close every kept connection (the pool stays usable)."""
        for task in list(self._tasks):
            task.cancel()
        idle, self._idle = self._idle, {}
        for kept in idle.values():
            for stream, _since in kept:
                await stream.aclose()

    async def _exchange(
        self, origin: tuple[str, str, int], stream: AsyncioStream, request: bytes
    ) -> Response:
        try:
            try:
                await stream.write(request)
            except Exception as exc:  # httpcore's WriteError
                raise _NothingBack(f"sending to the upstream failed: {exc}") from exc
            buf = b""
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    status, headers, reusable = _parse_head(buf[:end])
                    buf = buf[end + 4 :]
                    if 100 <= status < 200:
                        continue  # 100 Continue and the like: the real answer follows
                    response = Response(self, origin, stream, status, headers, buf, reusable)
                    if self._spare_when is not None and not response._reusable:
                        self._spare(origin)  # this connection will not come back
                    return response
                if len(buf) > MAX_HEAD:
                    raise RemoteProtocolError("the upstream's response head is too long")
                try:
                    received = await stream.read(READ_SIZE)
                except Exception as exc:  # httpcore's ReadError
                    if not buf:
                        raise _NothingBack(f"the upstream did not answer: {exc}") from exc
                    raise ReadError(f"reading the upstream failed: {exc}") from exc
                if not received:
                    if not buf:
                        raise _NothingBack("the upstream closed the connection without answering")
                    raise RemoteProtocolError("the upstream closed the connection mid-answer")
                buf += received
        except BaseException:
            await stream.aclose()
            raise


class _NothingBack(RemoteProtocolError):
    """The request failed before any byte of an answer came back."""


_BREAKS = re.compile(r"[\r\n\0]")
_UNSAFE = re.compile(r"[^\x21-\x7e]")


def _origin(parts: Any) -> tuple[str, str, int]:
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise InvalidURL(f"not an http(s) URL: {scheme}")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise InvalidURL("a bad port in the URL") from None
    return scheme, parts.hostname, port


def _prune(idle: collections.deque[tuple[AsyncioStream, float]], now: float) -> None:
    """Close the kept connections idle too long (left over from a burst, say): a server
    that closed one leaves it half-open here until it is closed."""
    while idle and now - idle[0][1] >= KEEPALIVE_SECONDS:
        _abort(idle.popleft()[0])


def _abort(stream: AsyncioStream) -> None:
    transport = stream._transport  # noqa: SLF001 - closing without awaiting
    stream._closed = True  # noqa: SLF001
    transport.abort()


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest.partition(" ")[0]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise RemoteProtocolError("a malformed status line from the upstream")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise RemoteProtocolError("a malformed header line from the upstream")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection", "").lower()
    reusable = version == "HTTP/1.1" and "close" not in connection
    return int(code), headers, reusable


# --- the proxy case: httpx ------------------------------------------------------------------


class _HttpxResponse:
    """An httpx response behind :class:`Response`'s interface (a proxy in the environment)."""

    network: Any = None
    complete = False

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.headers = {name.lower(): value for name, value in response.headers.items()}

    def pending(self) -> bool:
        return False

    async def aiter_body(self, idle: float | None = None) -> AsyncIterator[bytes]:
        pieces = self._response.aiter_raw().__aiter__()
        while True:
            try:
                async with asyncio.timeout(idle):
                    piece = await pieces.__anext__()
            except StopAsyncIteration:
                return
            except httpx.HTTPError as exc:
                raise UpstreamError(type(exc).__name__) from exc
            yield piece

    async def aread(self) -> bytes:
        return b"".join([piece async for piece in self.aiter_body()])

    async def aclose(self) -> None:
        await self._response.aclose()


class Client:
    """The relay's way to its upstreams in one event loop: the pool, or httpx via a proxy."""

    def __init__(
        self,
        connect_timeout: float,
        timeout: float,
        spare_when: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.pool = Pool(connect_timeout, spare_when=spare_when)
        self._connect_timeout, self._timeout = connect_timeout, timeout
        self._httpx: httpx.AsyncClient | None = None
        self._proxied: dict[str, bool] = {}

    def _via_proxy(self, url: str) -> bool:
        origin = url.split("/", 3)[:3]
        name = "/".join(origin)
        known = self._proxied.get(name)
        if known is None:
            known = self._proxied[name] = environment_proxy_for(url)
        return known

    async def warm(self, url: str) -> None:
        """Connect to ``url``'s host ahead of a request (not through a proxy)."""
        if not self._via_proxy(url):
            await self.pool.warm(url)

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Response:
        if not self._via_proxy(url):
            return await self.pool.post(url, body, headers)
        if self._httpx is None or self._httpx.is_closed:
            self._httpx = httpx.AsyncClient(
                timeout=httpx.Timeout(self._timeout, connect=self._connect_timeout)
            )
        request = self._httpx.build_request("POST", url, content=body, headers=headers)
        try:
            response = await self._httpx.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamError(type(exc).__name__) from exc
        return _HttpxResponse(response)  # type: ignore[return-value]

    async def aclose(self) -> None:
        await self.pool.aclose()
        if self._httpx is not None:
            await self._httpx.aclose()
