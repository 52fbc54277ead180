"""An httpcore network backend written directly on asyncio, and an httpx transport using it.

Why: a streamed LLM reply arrives as one token per TCP segment, so the client does one
network read per token. httpcore's default backend on asyncio is anyio, whose socket
stream calls ``transport.resume_reading()`` before and ``pause_reading()`` after every
read (two ``epoll_ctl`` syscalls), yields to the event loop once more per read (its
checkpoint), and wraps every read in a ``fail_after`` cancel scope and exception-mapping
context managers. Measured on one-token reads, that backend alone costs about twice the
CPU of a raw asyncio socket (~0.2 against ~0.1 ms per read); this one costs what the
socket costs. What remains between bare httpx and a raw socket is httpcore, h11 and httpx
themselves (``bench/bench_provider.py``, paced rows).

Here a plain ``asyncio.Protocol`` buffers whatever arrives and a read returns the buffer
at once, or waits on a single future. Reading is paused only when the buffer grows past
``READ_HIGH_WATER`` (a reader that stopped reading) and resumed when it drains below.
``asyncio.timeout`` is used only when a timeout is given and only when the read has to
wait. Writes honour the transport's flow control (``pause_writing``/``resume_writing``).

Errors are httpcore's own (``ConnectError``, ``ConnectTimeout``, ``ReadError``,
``ReadTimeout``, ``WriteError``, ``WriteTimeout``) raised in the same situations as its
anyio backend, so httpx maps them to the same httpx exceptions. Reading at the end of the
stream returns ``b""``.

Known differences from the anyio backend:

* TLS is asyncio's ``loop.start_tls`` (``sslproto``) instead of anyio's ``TLSStream``. Without
  a timeout, asyncio still gives up on a handshake after its default 60 s (``ConnectError``).
  Closing sends ``close_notify`` best effort and then closes at once, without waiting for
  the peer's answer (anyio, as httpcore uses it, sends none).
  asyncio's TLS layer also keeps a 256 KiB receive buffer per open TLS connection.
* ``get_extra_info("is_readable")`` answers from what the event loop has already received
  (data, EOF or a lost connection) instead of polling the socket with a syscall.
* ``get_extra_info("socket")`` is asyncio's ``TransportSocket`` wrapper, not the bare socket.
* A write to a connection that is already lost raises ``WriteError`` (anyio drops it
  silently when the peer closed cleanly); httpcore ignores write errors while sending a
  request and reports what the response read finds, so requests end the same way.
* Unix sockets are delegated to httpcore's ``AnyIOBackend``.

:class:`AsyncioTransport` is httpx's ``AsyncHTTPTransport`` with its connection pool on
this backend. It does not do proxies: an httpx client given a ``transport=`` ignores
HTTP(S)_PROXY from the environment, so :func:`environment_proxy_for` tells the caller when
to keep httpx's stock transport instead.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import ssl
import typing
import urllib.request

import httpcore
import httpx

READ_HIGH_WATER = 256 * 1024  # pause reading above this many buffered bytes
# Paced reads wake on this grid of the event loop's clock (the due time rounded to the
# nearest step), so the streams of a process read in a few shared turns of the loop
# instead of each in its own: a turn that blocks in epoll costs more than a read's
# parsing (bench/README.md, seventh round). The interval stays the same on average.
PACE_GRID = 0.01
HAPPY_EYEBALLS_DELAY = 0.25  # as anyio.connect_tcp, which httpcore's default backend uses

# httpx's own defaults (httpx._config.DEFAULT_LIMITS), so swapping the transport changes
# nothing about pooling.
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)


class _StreamProtocol(asyncio.Protocol):
    """Buffers received bytes and wakes the one waiting reader; tracks write flow control."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.eof = False
        self.lost = False
        self.exception: BaseException | None = None
        self.tls = False
        self.reading_paused = False
        self.pace_paused = False  # held back until the next paced read
        self.writing_paused = False
        self.read_waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None

    # --- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size > READ_HIGH_WATER and not self.reading_paused:
            self.update_reading()
        self._wake(self.read_waiter)

    def eof_received(self) -> bool | None:
        self.eof = True
        self._wake(self.read_waiter)
        # Keep a TCP connection half-open, as anyio does: httpcore closes it when it is
        # done. asyncio's TLS layer closes by itself and warns if asked to keep it open.
        return None if self.tls else True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.exception = exc
        self._wake(self.read_waiter)
        self._wake(self.drain_waiter)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake(self.drain_waiter)

    # --- used by the stream ---------------------------------------------------------------

    def take(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` buffered bytes (the buffer is not empty)."""
        chunks = self.chunks
        if self.size <= max_bytes:
            data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
        else:
            parts: list[bytes] = []
            room = max_bytes
            while room:
                chunk = chunks[0]
                if len(chunk) <= room:
                    parts.append(chunks.popleft())
                    room -= len(chunk)
                else:
                    parts.append(chunk[:room])
                    chunks[0] = chunk[room:]
                    room = 0
            data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.size -= len(data)
        if self.reading_paused:
            self.update_reading()
        return data

    def update_reading(self) -> None:
        """Pause the socket while the buffer is full or a paced read is not due yet."""
        paused = self.pace_paused or self.size > READ_HIGH_WATER
        if paused != self.reading_paused and self.transport is not None and not self.lost:
            self.reading_paused = paused
            if paused:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    @staticmethod
    def _wake(waiter: asyncio.Future[None] | None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


async def _sleep_until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    """``asyncio.sleep`` to an absolute time of the loop's clock (``sleep`` adds its delay
    to a later reading of the clock: the wake would be off the grid by that much)."""
    waiter = loop.create_future()
    timer = loop.call_at(when, _wake_sleeper, waiter)
    try:
        await waiter
    finally:
        timer.cancel()


def _wake_sleeper(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _wait(
    waiter: asyncio.Future[None], timeout: float | None, timeout_error: type[Exception]
) -> None:
    """Wait for ``waiter``; past ``timeout`` raise httpcore's ``timeout_error``."""
    if timeout is None:
        await waiter
        return
    try:
        async with asyncio.timeout(timeout):
            await waiter
    except TimeoutError as exc:
        raise timeout_error(exc) from exc


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One TCP (or TLS) connection as httpcore sees it."""

    def __init__(self, transport: asyncio.Transport, protocol: _StreamProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closed = False
        self._read_interval = 0.0
        self._next_read_at = 0.0

    def pace_reads(self, interval: float) -> None:
        """Read the network about once per ``interval`` seconds (0: as data arrives); a
        read is due on ``PACE_GRID``, so two reads may be up to half a step closer.

        Between paced reads the socket is not even watched: what arrives waits in the
        kernel, and the next read takes it all at once.
        """
        self._read_interval = interval
        if not interval:
            self._hold_back(False)

    def buffered(self) -> int:
        """Bytes received and not read yet (the next read returns without waiting)."""
        return int(self._protocol.size)

    def _hold_back(self, hold: bool) -> None:
        protocol = self._protocol
        if protocol.pace_paused != hold:
            protocol.pace_paused = hold
            protocol.update_reading()

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        if self._read_interval and not protocol.size:
            loop = asyncio.get_running_loop()
            due = round(self._next_read_at / PACE_GRID) * PACE_GRID
            if due > loop.time():
                await _sleep_until(loop, due)
            data = self._take_paused(max_bytes)
            if data:
                self._next_read_at = asyncio.get_running_loop().time() + self._read_interval
                return data
            self._hold_back(False)
        if not protocol.size and not (protocol.eof or protocol.lost or self._closed):
            if protocol.read_waiter is not None:
                raise RuntimeError("another task is already reading from this stream")
            waiter = protocol.read_waiter = asyncio.get_running_loop().create_future()
            try:
                await _wait(waiter, timeout, httpcore.ReadTimeout)
            finally:
                protocol.read_waiter = None
        # Like anyio: bytes that arrived before a close or an error are still delivered.
        if protocol.size:
            data = protocol.take(max_bytes)
            if self._read_interval and not protocol.size:
                self._next_read_at = asyncio.get_running_loop().time() + self._read_interval
                self._hold_back(True)
            return data
        if self._closed:
            raise httpcore.ReadError("the connection was closed")
        if protocol.exception is not None:
            raise httpcore.ReadError(protocol.exception) from protocol.exception
        return b""

    def _take_paused(self, max_bytes: int) -> bytes:
        """A paced read's bytes straight from the kernel while the socket stays unwatched:
        one non-blocking ``recv`` instead of resuming reading, a loop iteration for the
        event and pausing again (two ``epoll_ctl`` calls). ``b""`` when there is nothing
        yet, or an end or an error to see: reading resumes and the transport sees it."""
        protocol = self._protocol
        if not protocol.pace_paused or protocol.tls or protocol.eof or protocol.lost:
            return b""
        sock = getattr(self._transport, "_sock", None)  # asyncio's socket transport
        if sock is None or self._closed:
            return b""
        try:
            return bytes(sock.recv(max_bytes))
        except OSError:  # BlockingIOError: nothing yet; others: the transport's to report
            return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        protocol = self._protocol
        if self._closed:
            raise httpcore.WriteError("the connection was closed")
        if protocol.lost or self._transport.is_closing():
            if protocol.exception is not None:
                raise httpcore.WriteError(protocol.exception) from protocol.exception
            raise httpcore.WriteError("the connection was closed by the server")
        self._transport.write(buffer)
        if not protocol.writing_paused or protocol.lost:
            return
        waiter = protocol.drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await _wait(waiter, timeout, httpcore.WriteTimeout)
        finally:
            protocol.drain_waiter = None
        if protocol.exception is not None:
            raise httpcore.WriteError(protocol.exception) from protocol.exception

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        transport = self._transport
        if not transport.is_closing():
            # TCP: hand what is buffered to the kernel; TLS: queue close_notify.
            transport.close()
        # Then close now rather than wait for a peer that may never read or answer
        # (anyio aborts one event-loop iteration after closing).
        transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        self._protocol.tls = True
        try:
            async with asyncio.timeout(timeout):  # None: no limit
                tls_transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError as exc:
            await self.aclose()
            raise httpcore.ConnectTimeout(exc) from exc
        except OSError as exc:  # ssl.SSLError (e.g. a certificate that does not verify) too
            await self.aclose()
            raise httpcore.ConnectError(exc) from exc
        except BaseException:
            await self.aclose()
            raise
        if tls_transport is None:  # the connection was closed during the handshake
            await self.aclose()
            raise httpcore.ConnectError("the connection was closed during the TLS handshake")
        # The TLS transport now owns the TCP one; pause/resume go to the TLS layer.
        self._protocol.transport = tls_transport
        return AsyncioStream(tls_transport, self._protocol)

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return _address(self._transport.get_extra_info("sockname"))
        if info == "server_addr":
            return _address(self._transport.get_extra_info("peername"))
        if info == "socket":
            return self._transport.get_extra_info("socket")
        if info == "is_readable":
            # An idle pooled connection with anything to read was closed (or broken) by
            # the server. The event loop has already seen it: no syscall needed.
            protocol = self._protocol
            return bool(protocol.size or protocol.eof or protocol.lost or self._closed)
        return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _address(address: typing.Any) -> typing.Any:
    """(host, port) like anyio: IPv6 addresses lose flowinfo and keep a scope as ``%id``."""
    if isinstance(address, tuple) and len(address) == 4:
        host, port, _flowinfo, scope_id = address
        return (f"{host}%{scope_id}", port) if scope_id else (host, port)
    return address


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend on plain asyncio (see the module docstring)."""

    def __init__(self) -> None:
        self._fallback: httpcore.AsyncNetworkBackend | None = None

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local_addr = None if local_address is None else (local_address, 0)
        transport: asyncio.Transport | None = None
        try:
            async with asyncio.timeout(timeout):  # None: no limit
                transport, protocol = await loop.create_connection(
                    _StreamProtocol,
                    host,
                    port,
                    local_addr=local_addr,
                    # One address (an IP literal): no race to run, only its tasks to pay.
                    happy_eyeballs_delay=None if _is_ip(host) else HAPPY_EYEBALLS_DELAY,
                )
            # asyncio already sets TCP_NODELAY; options are applied after connecting,
            # as the anyio backend does.
            sock = transport.get_extra_info("socket")
            for option in socket_options or ():
                sock.setsockopt(*option)
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            raise httpcore.ConnectTimeout(exc) from exc
        except OSError as exc:
            if transport is not None:
                transport.abort()
            raise httpcore.ConnectError(exc) from exc
        return AsyncioStream(transport, protocol)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if self._fallback is None:
            self._fallback = httpcore.AnyIOBackend()
        return await self._fallback.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """httpx's ``AsyncHTTPTransport`` whose connection pool runs on :class:`AsyncioBackend`.

    Request/response conversion, httpcore → httpx exception mapping and closing are
    inherited unchanged; only the pool (the parent's ``_pool``) is built here, with
    ``network_backend=``. No ``proxy`` argument: see :func:`environment_proxy_for`.
    """

    def __init__(
        self,
        verify: ssl.SSLContext | str | bool = True,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = DEFAULT_LIMITS,
        uds: str | None = None,
        local_address: str | None = None,
        retries: int = 0,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> None:
        # Not calling super().__init__(): it would build a second pool on anyio.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=trust_env),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            http1=http1,
            http2=http2,
            uds=uds,
            local_address=local_address,
            retries=retries,
            socket_options=socket_options,
            network_backend=AsyncioBackend(),
        )


def environment_proxy_for(url: httpx.URL | str) -> bool:
    """Whether the environment configures a proxy that httpx could use for ``url``.

    httpx (``trust_env``) reads the same ``urllib.request.getproxies()``. NO_PROXY is
    not matched here (only ``*``, which turns every proxy off): httpx matches it with its
    own rules, so a caller that gets True keeps httpx's stock transport and lets httpx
    decide. A false positive costs only the slower transport.
    """
    proxies = urllib.request.getproxies()
    if "*" in (host.strip() for host in proxies.get("no", "").split(",")):
        return False
    try:
        scheme = httpx.URL(url).scheme
    except httpx.InvalidURL:
        return False  # the request itself will fail with InvalidURL, as before
    return bool(proxies.get(scheme) or proxies.get("all"))
