"""Daphne's writes go to the socket at once (chatsite/sendnow.py), and nothing is lost or reordered.

The first tests drive one accepted connection by hand (the reactor never runs: what the
client receives was sent by ``write`` itself, or by the ``doWrite`` the test calls as the
reactor would); the last ones run a real Daphne on loopback.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

PATTERN = bytes(range(256)) * 4096  # 1 MiB, no two neighbouring kibibytes alike


@contextlib.contextmanager
def accepted(sndbuf: int = 0) -> Iterator[tuple[socket.socket, Any]]:
    """A client socket and the server side as a SendNow transport (with a plain protocol)."""
    from twisted.internet import reactor
    from twisted.internet.protocol import Protocol

    from chatsite.sendnow import SendNow

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, addr = listener.accept()
    if sndbuf:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    conn.setblocking(False)
    protocol = Protocol()
    transport = SendNow(conn, protocol, addr, mock.Mock(), 1, reactor)  # type: ignore[arg-type]
    protocol.makeConnection(transport)
    try:
        yield client, transport
    finally:
        transport.stopReading()
        transport.stopWriting()
        client.close()
        conn.close()
        listener.close()


def receive(client: socket.socket, size: int, timeout: float = 5.0) -> bytes:
    client.settimeout(timeout)
    parts, got = [], 0
    while got < size:
        part = client.recv(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def nothing_waiting(client: socket.socket) -> bool:
    client.setblocking(False)
    try:
        client.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    finally:
        client.setblocking(True)
    return False


def drain(client: socket.socket, transport: Any) -> bytes:
    """Read everything while calling the transport's doWrite as the reactor would."""
    client.setblocking(False)
    parts = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            part = client.recv(1 << 20)
            parts.append(part)
        except BlockingIOError:
            if not transport._tempDataLen and transport.offset == len(transport.dataBuffer):
                break
            assert transport.doWrite() is None
    return b"".join(parts)


def test_daphne_connections_are_adopted_with_nagle_off():
    """Each accepted connection becomes a SendNow, and has TCP_NODELAY on (Twisted's HTTP
    channel sets it; with Nagle on, a small write behind an unacknowledged one waits for
    the peer's delayed ACK, 40 ms)."""
    from daphne.http_protocol import HTTPFactory
    from twisted.internet import reactor, tcp

    import chatsite.asgi  # noqa: F401 - installs chatsite.sendnow
    from chatsite.sendnow import SendNow

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, addr = listener.accept()
    try:
        assert not conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        protocol = HTTPFactory(mock.Mock()).buildProtocol(addr)
        transport = tcp.Server(conn, protocol, addr, mock.Mock(), 1, reactor)
        protocol.makeConnection(transport)
        assert type(transport) is SendNow
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        assert transport.producer is not None  # the HTTP channel registered on it
        transport.stopReading()
        transport.stopWriting()
    finally:
        client.close()
        conn.close()
        listener.close()


def test_a_write_leaves_at_once_without_a_writer():
    from twisted.internet import reactor

    with accepted() as (client, transport):
        transport.write(b"first ")
        transport.writeSequence([b"sec", b"ond"])
        assert receive(client, 12) == b"first second"
        assert transport not in reactor.getWriters()
        assert transport._tempDataLen == 0


def test_what_the_socket_does_not_take_waits_and_keeps_its_order():
    from twisted.internet import reactor

    with accepted(sndbuf=32768) as (client, transport):
        big = PATTERN * 4
        transport.write(big)
        assert 0 < transport._tempDataLen < len(big)  # part sent, the rest buffered
        assert transport in reactor.getWriters()
        transport.write(b"tail-1")  # behind the buffered rest, not before it
        transport.writeSequence([b"tail", b"-2"])
        assert drain(client, transport) == big + b"tail-1tail-2"
        assert transport not in reactor.getWriters()
        transport.write(b"again")  # an empty buffer: at once again
        assert receive(client, 5) == b"again"


def test_a_streaming_producer_is_paused_and_resumed_as_twisted_would():
    producer = mock.Mock()
    with accepted(sndbuf=32768) as (client, transport):
        transport.registerProducer(producer, True)
        transport.write(PATTERN * 2)  # far more than the socket and bufferSize take
        producer.pauseProducing.assert_called_once()
        assert transport.producerPaused
        transport.write(b"x")  # a paused producer: Twisted's path
        producer.resumeProducing.assert_not_called()
        assert drain(client, transport) == PATTERN * 2 + b"x"
        producer.resumeProducing.assert_called_once()
        transport.unregisterProducer()


def test_a_pull_producer_keeps_twisteds_path():
    producer = mock.Mock()
    with accepted() as (client, transport):
        transport.registerProducer(producer, False)
        producer.resumeProducing.reset_mock()
        transport.write(b"pulled")
        assert nothing_waiting(client)  # buffered until the reactor's doWrite
        assert drain(client, transport) == b"pulled"
        producer.resumeProducing.assert_called_once()  # asked for more, as Twisted does
        transport.unregisterProducer()


def test_a_response_head_goes_with_its_body_in_one_send():
    from twisted.internet import reactor

    with accepted() as (client, transport):
        with mock.patch.object(reactor, "callLater") as later:
            transport.writeSequence([b"HTTP/1.1", b" ", b"200", b" ", b"OK", b"\r\n", b"\r\n"])
            assert nothing_waiting(client)  # held for the body
            transport.writeSequence([b"5", b"\r\n", b"hello", b"\r\n"])
        head = b"HTTP/1.1 200 OK\r\n\r\n"
        assert client.recv(4096) == head + b"5\r\nhello\r\n"  # one send
        release = later.call_args.args[1]
        release()  # the end of the turn: nothing left to send
        assert nothing_waiting(client)
        with mock.patch.object(reactor, "callLater") as later:
            transport.writeSequence([b"HTTP/1.1", b" ", b"204", b" ", b"No", b"\r\n", b"\r\n"])
        later.call_args.args[1]()  # no body followed: the head goes alone
        assert receive(client, 19) == b"HTTP/1.1 204 No\r\n\r\n"


def test_a_held_head_goes_before_a_close():
    with accepted() as (client, transport):
        transport.writeSequence([b"HTTP/1.1", b" ", b"200", b" ", b"OK", b"\r\n", b"\r\n"])
        transport.loseConnection()
        assert transport.doWrite() is not None  # sent, then the reactor is told to close
        assert receive(client, 19) == b"HTTP/1.1 200 OK\r\n\r\n"


def test_a_peer_gone_is_left_to_the_reactor():
    with accepted() as (client, transport):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset
        time.sleep(0.05)
        transport.write(b"x" * 1000)  # no exception in the writer
        transport.write(b"y")
        result = None
        for _ in range(3):
            result = transport.doWrite()
            if result is not None:
                break
        assert isinstance(result, Exception)  # the reactor loses the connection


def test_other_transports_are_left_alone():
    from chatsite.sendnow import SendNow, adopt

    other = mock.Mock()
    adopt(other)
    assert not isinstance(other, SendNow)


# --- a real Daphne ----------------------------------------------------------------------------


def _app():
    import asyncio

    from chatsite import sendnow

    sendnow.install()

    async def app(scope, receive, send):
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            if scope["path"] == "/ws-big":  # 4 MiB in 64 KiB messages, the client closes
                for i in range(64):
                    await send({"type": "websocket.send", "bytes": bytes([i]) * 65536})
                await receive()  # (a close started by a server waits only a second for
                return  # the client's answer, then resets: not what this test is about)
            else:
                for i in range(2000):
                    await send({"type": "websocket.send", "text": f"{i:06d}"})
            await send({"type": "websocket.close"})
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        path = scope["path"]
        if path == "/big":  # 24 MiB in one body message, then a tail
            await send({"type": "http.response.body", "body": PATTERN * 24, "more_body": True})
            await send({"type": "http.response.body", "body": b"END"})
        elif path == "/many":  # small events, some with a pause between
            for i in range(3000):
                if i % 100 == 0:
                    await asyncio.sleep(0.001)
                await send({"type": "http.response.body", "body": b"%06d\n" % i, "more_body": True})
            await send({"type": "http.response.body", "body": b"END"})
        elif path == "/flood":  # 1 MiB pieces, with a slow reader
            for _ in range(32):
                await send({"type": "http.response.body", "body": PATTERN, "more_body": True})
            await send({"type": "http.response.body", "body": b"END"})

    return app


@pytest.fixture(scope="module")
def daphne_port():
    from tests.conftest import _fresh_daphne_process_class

    process = _fresh_daphne_process_class()("127.0.0.1", _app)
    process.start()
    if not process.ready.wait(15):
        process.terminate()
        raise RuntimeError("Daphne did not start within 15 s")
    try:
        yield process.port.value
    finally:
        process.terminate()
        process.join(5)


def fetch(port: int, path: str, pause: float = 0.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        if pause:
            time.sleep(pause)  # not reading: the server's buffers fill
        client.settimeout(10)
        parts = []
        while part := client.recv(1 << 16):
            parts.append(part)
    raw = b"".join(parts)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    out: list[bytes] = []
    index = 0
    while True:  # de-chunk
        end = body.index(b"\r\n", index)
        size = int(body[index:end], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[end + 2 : end + 2 + size])
        index = end + 2 + size + 2


def test_a_large_response_arrives_whole_and_in_order(daphne_port):
    assert fetch(daphne_port, "/big") == PATTERN * 24 + b"END"


def test_many_small_writes_arrive_in_order(daphne_port):
    expected = b"".join(b"%06d\n" % i for i in range(3000)) + b"END"
    assert fetch(daphne_port, "/many") == expected


def test_a_client_that_stops_reading_loses_nothing(daphne_port):
    assert fetch(daphne_port, "/flood", pause=1.0) == PATTERN * 32 + b"END"
    assert fetch(daphne_port, "/many").endswith(b"002999\nEND")  # and the server goes on


def websocket_messages(port: int, path: str, pause: float = 0.0, count: int = -1) -> list[bytes]:
    """A hand-written WebSocket client: the server's messages until its close frame
    (or ``count`` of them)."""
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        client.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        if pause:
            time.sleep(pause)
        client.settimeout(10)
        stream = client.makefile("rb")
        status = stream.readline()
        assert b" 101 " in status, status
        while stream.readline() not in (b"\r\n", b""):
            pass
        messages: list[bytes] = []
        while len(messages) != count:
            first, second = stream.read(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", stream.read(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", stream.read(8))[0]
            payload = stream.read(size)
            if first & 0x0F == 8:  # close
                return messages
            messages.append(payload)
        return messages


def test_websocket_messages_arrive_in_order(daphne_port):
    assert websocket_messages(daphne_port, "/ws") == [b"%06d" % i for i in range(2000)]


def test_a_websocket_client_that_stops_reading_loses_nothing(daphne_port):
    messages = websocket_messages(daphne_port, "/ws-big", pause=1.0, count=64)
    assert messages == [bytes([i]) * 65536 for i in range(64)]
