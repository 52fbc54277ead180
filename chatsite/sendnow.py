"""Daphne's writes go to the socket at once when nothing is waiting to be sent.

Twisted buffers every ``transport.write``, registers the socket for writing and sends on
the next turn of the event loop (``FileDescriptor.write`` -> ``startWriting``, then
``doWrite`` and ``stopWriting``): each streamed event cost two ``epoll_ctl`` calls, a loop
iteration and the reactor's callback layers before its bytes left. asyncio's transports
try the socket first and buffer only what it does not take; :class:`SendNow` does the
same for Daphne's plain TCP connections (HTTP responses, the relay's streams, WebSocket
pushes).

Twisted's own path is kept whenever anything could depend on it: bytes already buffered
(they go first: order), a connection closing or half-closed, TLS started on it, a
producer that Twisted must pull from (non-streaming) or has paused. What the socket does
not take (a full send buffer, ``EAGAIN``) is buffered as Twisted would, producer paused
past its buffer size included; an error on send (the peer gone) is buffered too, and the
reactor's next ``doWrite`` meets it and loses the connection the usual way (never a
protocol callback from inside a ``write``). TLS endpoints are not touched: their
transport is Twisted's TLS protocol, not a TCP ``Server``.

``install()`` is called by ``chatsite/asgi.py`` (as ``postforms.py``); it patches Daphne's
HTTP factory once, and each accepted plain TCP connection becomes a :class:`SendNow`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from twisted.internet import tcp
from twisted.internet.abstract import FileDescriptor

_INSTALLED = "_lyceum_sendnow"


class SendNow(tcp.Server):
    """A TCP server connection whose writes try the socket before buffering."""

    _held = False  # a response head waits in the buffer for its body (same loop turn)

    def _may_send_now(self) -> bool:
        producer = self.producer
        return bool(
            not self.TLS
            and self.connected
            and not self.disconnecting
            and not self._writeDisconnecting
            and not self._writeDisconnected
            and (self._held or (not self._tempDataLen and self.offset == len(self.dataBuffer)))
            and (producer is None or (self.streamingProducer and not self.producerPaused))
        )

    def _send_now(self, data: bytes) -> None:
        if self._held:  # the head goes first, in the same send
            self._held = False
            data = b"".join([*self._tempDataBuffer, data])
            self._tempDataBuffer, self._tempDataLen = [], 0
        sent = self.writeSomeData(data)
        if isinstance(sent, BaseException) or sent < 0:
            # Lost: buffered, the reactor's doWrite meets the error and closes.
            FileDescriptor.write(self, data)
        elif sent < len(data):
            FileDescriptor.write(self, data[sent:])  # the rest waits for the socket

    def _twisted(self) -> None:
        """Twisted's own path from here on: a held head is left to its doWrite."""
        if self._held:
            self._held = False
            if self.connected:
                self.startWriting()

    def _release(self) -> None:
        """The end of the turn the head was written in: no body followed, it goes alone."""
        if self._held:
            if self._may_send_now():
                self._send_now(b"")
            else:
                self._twisted()

    def write(self, data: bytes) -> None:
        if type(data) is bytes and data and self._may_send_now():
            self._send_now(data)
        else:
            self._twisted()
            super().write(data)

    def writeSequence(self, iovec: Iterable[bytes]) -> None:
        if not self._may_send_now():
            self._twisted()
            super().writeSequence(iovec)
            return
        if _is_head(iovec) and not self._held:
            # A response head: its body's first write usually follows in this turn.
            self._tempDataBuffer.extend(iovec)
            self._tempDataLen += sum(len(part) for part in iovec)
            self._held = True
            self.reactor.callLater(0, self._release)
            return
        data = b"".join(iovec)  # a str in it raises TypeError, as Twisted's check does
        if data:
            self._send_now(data)

    def loseConnection(self) -> None:
        self._twisted()
        super().loseConnection()

    def loseWriteConnection(self) -> None:
        self._twisted()
        super().loseWriteConnection()


def _is_head(iovec: Iterable[bytes]) -> bool:
    """Twisted's ``HTTPChannel.writeHeaders`` sequence (version first, blank line last)."""
    return (
        type(iovec) is list
        and len(iovec) > 2
        and iovec[0][:5] == b"HTTP/"
        and iovec[-1] == b"\r\n"
        and iovec[-2] == b"\r\n"
    )


def adopt(transport: Any) -> None:
    """Make ``transport`` a :class:`SendNow` when it is a plain ``tcp.Server``."""
    if type(transport) is tcp.Server:
        transport.__class__ = SendNow


def install() -> None:
    from daphne.http_protocol import HTTPFactory

    if getattr(HTTPFactory, _INSTALLED, False):
        return
    build = HTTPFactory.buildProtocol

    def build_protocol(self: Any, addr: Any) -> Any:
        protocol = build(self, addr)
        make = protocol.makeConnection  # the port's call, before the channel's connectionMade

        def make_connection(transport: Any) -> None:
            adopt(transport)
            make(transport)

        protocol.makeConnection = make_connection
        return protocol

    HTTPFactory.buildProtocol = build_protocol  # type: ignore[method-assign]
    setattr(HTTPFactory, _INSTALLED, True)
