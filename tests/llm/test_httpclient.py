"""Lyceum's HTTP/1.1 client for its upstreams (chat/llm/httpclient.py), used by the relay and
the provider."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from chat.llm import httpclient as upstream
from chat.llm.httpclient import Response, UpstreamError
from tests.llm.test_netbackend import certificate  # noqa: F401, F811 - the fixture

BODY = b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = [], 0
    for size in sizes:
        piece = body[pos : pos + size]
        pos += size
        out.append(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
    return b"".join(out) + b"0\r\nX-Trailer: yes\r\n\r\n"


def _response(headers: dict[str, str], rest: bytes = b"") -> Response:
    network: Any = SimpleNamespace(buffered=lambda: 0)
    return Response(None, ("http", "x", 80), network, 200, headers, rest, True)  # type: ignore[arg-type]


def _decode_split(raw: bytes, headers: dict[str, str], at: int) -> tuple[bytes, Response]:
    response = _response(headers)
    out = []
    for part in (raw[:at], raw[at:]):
        response._raw += part
        out.append(response._decode())
    return b"".join(out), response


def test_a_chunked_body_is_decoded_whatever_the_reads_cut():
    raw = _chunked(BODY, [5, 1, 20, len(BODY)])
    for at in range(len(raw) + 1):
        body, response = _decode_split(raw, {"transfer-encoding": "chunked"}, at)
        assert body == BODY, at
        assert response.complete and not response._raw


def test_a_length_framed_body_stops_at_its_length():
    body, response = _decode_split(BODY + b"extra", {"content-length": str(len(BODY))}, 7)
    assert body == BODY and response.complete
    assert response._raw == b"extra"  # left over: the connection is not given back


@pytest.mark.parametrize("raw", [b"zz\r\nabc\r\n", b"3\r\nabcXY", b"-3\r\nabc\r\n"])
def test_a_malformed_chunked_body_is_an_upstream_error(raw: bytes):
    response = _response({"transfer-encoding": "chunked"}, raw)
    with pytest.raises(UpstreamError):
        response._decode()


def test_pending_is_what_the_network_holds_unread():
    response = _response({"transfer-encoding": "chunked"})
    assert not response.pending()
    response.network = SimpleNamespace(buffered=lambda: 10)
    assert response.pending()


async def _server(handler: Any, ssl: Any = None) -> tuple[asyncio.AbstractServer, int, list[int]]:
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ssl)
    return server, server.sockets[0].getsockname()[1], connections


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


async def _echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer one request with its body (length-framed); nothing when the client left."""
    try:
        body = await _read_request(reader)
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()


async def _echo_kept_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer requests with their bodies on one connection until the client closes it."""
    while not reader.at_eof():
        await _echo_once(reader, writer)


async def test_a_connection_is_kept_alive_and_reused():
    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body, [3, len(body)])
            )
            await writer.drain()

    server, port, connections = await _server(keep_alive)
    client = upstream.Client(5.0, 30.0)
    try:
        for text in (b"first", b"second request"):
            response = await client.post(f"http://127.0.0.1:{port}/v1/x", text, {"A": "b"})
            assert response.status_code == 200
            assert await response.aread() == text
            await response.aclose()
        assert len(connections) == 1
    finally:
        await client.aclose()
        server.close()


@pytest.mark.parametrize("pause", [0.0, 0.01])  # the close unseen (sent again) or seen
async def test_a_kept_connection_the_server_closed_is_replaced(pause: float):
    # One answer per connection, then closed, though the answer did not say so.
    server, port, connections = await _server(_echo_once)
    client = upstream.Client(5.0, 30.0)
    try:
        for text in (b"one", b"two", b"three"):
            response = await client.post(f"http://127.0.0.1:{port}/", text, {})
            assert await response.aread() == text
            await response.aclose()
            await asyncio.sleep(pause)
        assert len(connections) == 3
    finally:
        await client.aclose()
        server.close()


async def test_a_body_cut_short_is_an_upstream_error():
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab")
        await writer.drain()

    server, port, _connections = await _server(cut)
    client = upstream.Client(5.0, 30.0)
    try:
        response = await client.post(f"http://127.0.0.1:{port}/", b"x", {})
        with pytest.raises(UpstreamError):
            await response.aread()
        await response.aclose()
        with pytest.raises(UpstreamError):  # nothing listens there any more
            server.close()
            await server.wait_closed()
            await client.post(f"http://127.0.0.1:{port}/", b"x", {})
    finally:
        await client.aclose()


async def test_a_warmed_connection_carries_the_next_request():
    server, port, connections = await _server(_echo_once)
    client = upstream.Client(5.0, 30.0)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        await client.warm(url)
        await client.warm(url)  # one kept already: no second connection
        response = await client.post(url, b"hello", {})
        assert await response.aread() == b"hello"
        await response.aclose()
        assert len(connections) == 1
        await client.warm("http://127.0.0.1:1/v1")  # nothing listens: left to the request
    finally:
        await client.aclose()
        server.close()


async def test_https_upstreams_are_verified_and_kept_alive(certificate):  # noqa: F811
    from tests.llm.test_netbackend import server_context, trusting_context

    server, port, connections = await _server(_echo_kept_alive, ssl=server_context(certificate))
    url = f"https://127.0.0.1:{port}/v1/chat/completions"
    untrusting = upstream.Client(5.0, 30.0)  # the default context does not know the cert
    client = upstream.Client(5.0, 30.0)
    client.pool._ssl = trusting_context(certificate)
    try:
        with pytest.raises(UpstreamError):
            await untrusting.post(url, b"x", {})
        for text in (b"one", b"two"):
            response = await client.post(url, text, {})
            assert await response.aread() == text
            await response.aclose()
        assert (
            len(connections) == 1
        )  # both over one kept connection (the refused one never got past its handshake)
    finally:
        await untrusting.aclose()
        await client.aclose()
        server.close()


async def test_connections_kept_too_long_are_closed_when_the_pool_is_next_used():
    server, port, connections = await _server(_echo_kept_alive)
    client = upstream.Client(5.0, 30.0)
    url = f"http://127.0.0.1:{port}/"
    try:
        responses = await asyncio.gather(*(client.post(url, b"x", {}) for _ in range(3)))
        for response in responses:
            await response.aread()
            await response.aclose()
        idle = next(iter(client.pool._idle.values()))
        assert len(idle) == 3 and len(connections) == 3
        old = [stream for stream, _since in idle]
        idle[0] = (idle[0][0], idle[0][1] - upstream.KEEPALIVE_SECONDS)  # the oldest aged out
        response = await client.post(url, b"y", {})
        assert await response.aread() == b"y"
        await response.aclose()
        assert old[0]._closed and len(idle) == 2 and len(connections) == 3
    finally:
        await client.aclose()
        server.close()


async def test_a_line_break_in_a_header_is_refused_and_one_in_the_url_sent_encoded():
    heads: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    server, port, connections = await _server(record)
    client = upstream.Client(5.0, 30.0)
    try:
        with pytest.raises(upstream.InvalidURL):
            await client.post(f"http://127.0.0.1:{port}/", b"", {"A": "k\r\nX-Evil: 1"})
        assert connections == []
        response = await client.pool.request(
            "GET", f"http://127.0.0.1:{port}/v1 x\r\nX-Evil: 1/é", None, {}
        )
        assert response.status_code == 204
        await response.aclose()
        request_line, *header_lines = heads[0].decode().split("\r\n")
        assert request_line == "GET /v1%20xX-Evil:%201/%C3%A9 HTTP/1.1"
        assert not any(line.startswith("X-Evil") for line in header_lines)
    finally:
        await client.aclose()
        server.close()


async def _answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One answer saying ``Connection: close`` (as the fake upstream does); a connection
    never used is let go."""
    try:
        body = await _read_request(reader)
    except (asyncio.IncompleteReadError, ConnectionError):
        return
    writer.write(
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    await writer.drain()


def _counting_connects(client: upstream.Client) -> list[int]:
    calls: list[int] = []
    connect = client.pool._backend.connect_tcp

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await connect(*args, **kwargs)

    client.pool._backend.connect_tcp = counted  # type: ignore[method-assign]
    return calls


async def _until(condition: Any, timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.005)


async def test_an_answer_that_closes_its_connection_leaves_a_spare_for_the_next_request():
    server, port, connections = await _server(_answer_and_close)
    quiet = asyncio.Event()

    async def spare_when() -> None:
        await quiet.wait()

    client = upstream.Client(5.0, 30.0, spare_when=spare_when)
    connects = _counting_connects(client)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        response = await client.post(url, b"one", {})
        assert await response.aread() == b"one"
        await response.aclose()
        await asyncio.sleep(0.05)
        assert len(connects) == 1  # no spare before the quiet moment
        quiet.set()
        await _until(
            lambda: len(connects) == 2 and client.pool._idle.get(("http", "127.0.0.1", port))
        )
        response = await client.post(url, b"two", {})  # on the spare: no connect of its own
        assert len(connects) == 2
        assert await response.aread() == b"two"
        await response.aclose()
        await _until(lambda: len(connects) == 3)  # and a spare in its place
        assert len(connections) == 3
    finally:
        await client.aclose()
        server.close()


async def test_no_spares_without_being_asked_for_or_past_their_number():
    server, port, connections = await _server(_answer_and_close)
    plain = upstream.Client(5.0, 30.0)  # the provider's: no spares
    url = f"http://127.0.0.1:{port}/"
    try:
        response = await plain.post(url, b"x", {})
        await response.aread()
        await response.aclose()
        await asyncio.sleep(0.05)
        assert len(connections) == 1 and not plain.pool._idle.get(("http", "127.0.0.1", port))
    finally:
        await plain.aclose()

    async def now() -> None:
        return None

    client = upstream.Client(5.0, 30.0, spare_when=now)
    try:
        count = upstream.MAX_SPARES + 4
        responses = await asyncio.gather(*(client.post(url, b"x", {}) for _ in range(count)))
        for response in responses:
            await response.aread()
            await response.aclose()
        await asyncio.sleep(0.1)
        idle = client.pool._idle[("http", "127.0.0.1", port)]
        assert len(idle) == upstream.MAX_SPARES
    finally:
        await client.aclose()
        server.close()


async def test_a_spare_not_used_is_closed_once_idle_too_long(monkeypatch):
    monkeypatch.setattr(upstream, "KEEPALIVE_SECONDS", 0.2)
    server, port, _connections = await _server(_answer_and_close)

    async def now() -> None:
        return None

    client = upstream.Client(5.0, 30.0, spare_when=now)
    origin = ("http", "127.0.0.1", port)
    try:
        response = await client.post(f"http://127.0.0.1:{port}/", b"x", {})
        await response.aread()
        await response.aclose()
        await _until(lambda: client.pool._idle.get(origin))
        (spare, _since), *_ = client.pool._idle[origin]
        await _until(lambda: spare._closed, timeout=1.0)  # no request came to prune it
        assert not client.pool._idle[origin]
    finally:
        await client.aclose()
        server.close()
