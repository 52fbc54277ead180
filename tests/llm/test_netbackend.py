"""chat.llm.netbackend (httpcore on plain asyncio) against real loopback servers.

The servers are asyncio servers written here, on the test's own event loop. Error cases
run through the stock httpx transport too, and must raise the same httpx exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpcore
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from chat.llm import netbackend
from chat.llm.netbackend import AsyncioBackend, AsyncioStream, AsyncioTransport
from chat.llm.openai import OpenAIProvider

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
TRANSPORTS = ["asyncio", "stock"]


# --- loopback servers ---------------------------------------------------------------------


class Server:
    """An asyncio server on 127.0.0.1 that counts the connections it accepted."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = asyncio.Event()  # set whenever a handler returns
        self.port = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self.closed.set()

    def url(self, path: str = "/", scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"


@contextlib.asynccontextmanager
async def serve(handler: Handler, ssl_context: ssl.SSLContext | None = None):
    server = Server(handler)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=ssl_context)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        for task in server.tasks:  # handlers still sleeping on a stalled client
            task.cancel()
        await asyncio.gather(*server.tasks, return_exceptions=True)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """(head, body) of the next request, or None when the client closed the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return head, body


def response(body: bytes, *extra: str) -> bytes:
    headers = [f"Content-Length: {len(body)}", *extra]
    return ("HTTP/1.1 200 OK\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode() + body


async def keep_alive_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection with its path, until the client closes."""
    while (request := await read_request(reader)) is not None:
        path = request[0].split(b" ")[1]
        writer.write(response(b"you asked for " + path))
        await writer.drain()


def make_client(kind: str, **kw) -> httpx.AsyncClient:
    verify = kw.pop("verify", True)
    transport = AsyncioTransport(verify=verify) if kind == "asyncio" else None
    if transport is None:
        return httpx.AsyncClient(verify=verify, trust_env=False, **kw)
    return httpx.AsyncClient(transport=transport, trust_env=False, **kw)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with make_client("asyncio", timeout=5) as made:
        yield made


# --- bodies and connection reuse ------------------------------------------------------------


async def test_content_length_body_goes_through_the_asyncio_backend(client):
    async with serve(keep_alive_handler) as server:
        got = await client.get(server.url("/hello"))
    assert got.status_code == 200
    assert got.content == b"you asked for /hello"
    assert isinstance(got.extensions["network_stream"], AsyncioStream)


async def test_chunked_body_split_across_many_small_writes(client):
    pieces = [f"piece {i:03d};".encode() for i in range(200)]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        wire += b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        for start in range(0, len(wire), 7):  # chunk framing cut at arbitrary places
            writer.write(wire[start : start + 7])
            await writer.drain()
            await asyncio.sleep(0)

    async with serve(handler) as server, client.stream("GET", server.url()) as streamed:
        parts = [part async for part in streamed.aiter_raw()]
    assert b"".join(parts) == b"".join(pieces)
    assert len(parts) > 20  # really many reads, not one


async def trickle_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Chunked bodies of 30 pieces, one write every 10 ms (a model streaming tokens)."""
    while await read_request(reader) is not None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(30):
            piece = f"token {i:02d};".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def test_paced_reads_take_what_arrived_in_between_in_one_read(client):
    loop = asyncio.get_running_loop()
    reads: list[tuple[float, int]] = []
    async with serve(trickle_handler) as server, client.stream("GET", server.url()) as streamed:
        network = streamed.extensions["network_stream"]
        network.pace_reads(0.1)
        real_read = network.read

        async def counted_read(max_bytes: int, timeout: float | None = None) -> bytes:
            data = await real_read(max_bytes, timeout)
            reads.append((loop.time(), len(data)))
            return data

        network.read = counted_read
        body = b"".join([part async for part in streamed.aiter_raw()])
        network.pace_reads(0.0)

    assert body == b"".join(f"token {i:02d};".encode() for i in range(30))
    data_reads = [at for at, size in reads if size]
    # About 0.3 s of trickle read every 0.1 s: a handful of reads instead of thirty.
    assert 2 <= len(data_reads) <= 6
    gaps = [later - earlier for earlier, later in zip(data_reads, data_reads[1:], strict=False)]
    assert min(gaps) >= 0.09


async def test_paced_reads_wake_on_the_grid_of_the_loops_clock(client, monkeypatch):
    """The streams of a process share the loop's turns: every paced wait ends on a step
    of ``PACE_GRID``, whenever the read before it happened."""
    loop = asyncio.get_running_loop()
    wakes: list[float] = []
    real_call_at = loop.call_at

    def recorded_call_at(when: float, callback, *args, **kwargs):
        if callback is netbackend._wake_sleeper:
            wakes.append(when)
        return real_call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", recorded_call_at)
    async with serve(trickle_handler) as server, client.stream("GET", server.url()) as streamed:
        network = streamed.extensions["network_stream"]
        network.pace_reads(0.1)
        body = b"".join([part async for part in streamed.aiter_raw()])
        network.pace_reads(0.0)

    assert body == b"".join(f"token {i:02d};".encode() for i in range(30))
    assert wakes  # the trickle outlasts one interval
    for when in wakes:
        steps = when / netbackend.PACE_GRID
        assert abs(steps - round(steps)) < 1e-6


async def test_paced_reads_take_the_bytes_without_watching_the_socket_again(client):
    async with serve(trickle_handler) as server, client.stream("GET", server.url()) as streamed:
        network = streamed.extensions["network_stream"]
        network.pace_reads(0.1)
        transport = network._transport
        resumed = []
        real_resume = transport.resume_reading

        def counted_resume() -> None:
            resumed.append(1)
            real_resume()

        transport.resume_reading = counted_resume
        body = b"".join([part async for part in streamed.aiter_raw()])
        network.pace_reads(0.0)

    assert body == b"".join(f"token {i:02d};".encode() for i in range(30))
    # Each paced read found bytes in the kernel and took them with one recv; reading was
    # resumed only where nothing had come yet (the end of the body, say), not per read.
    assert len(resumed) <= 2


async def test_pacing_off_reads_as_data_arrives_and_the_connection_is_reused(client):
    async with serve(trickle_handler) as server:
        async with client.stream("GET", server.url()) as streamed:
            network = streamed.extensions["network_stream"]
            network.pace_reads(0.1)
            network.pace_reads(0.0)
            parts = [part async for part in streamed.aiter_raw()]
        assert len(parts) >= 15  # one read per write, near enough
        again = await client.get(server.url())
    assert again.status_code == 200
    assert server.connections == 1


async def test_a_body_larger_than_the_read_buffer_limit_with_a_slow_reader(client):
    body = bytes(range(256)) * 8192  # 2 MiB: reading pauses and resumes on the way

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(body))
        await writer.drain()

    async with serve(handler) as server, client.stream("GET", server.url()) as streamed:
        received = bytearray()
        async for part in streamed.aiter_raw():
            received += part
            await asyncio.sleep(0.001)
    assert bytes(received) == body


async def test_a_large_request_body_respects_write_flow_control(client):
    upload = b"x" * (8 * 1024 * 1024)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"content-length: %d" % len(upload) in head.lower()
        received = 0
        while received < len(upload):
            received += len(await reader.read(65536))
            await asyncio.sleep(0)  # a slow reader: the client has to wait for drains
        writer.write(response(str(received).encode()))
        await writer.drain()

    async with serve(handler) as server:
        got = await client.post(server.url(), content=upload)
    assert got.text == str(len(upload))


async def test_keep_alive_reuses_one_connection_for_sequential_requests(client):
    async with serve(keep_alive_handler) as server:
        first = await client.get(server.url("/one"))
        second = await client.get(server.url("/two"))
    assert (first.text, second.text) == ("you asked for /one", "you asked for /two")
    assert server.connections == 1


async def test_a_pooled_connection_closed_by_the_server_is_replaced(client):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"once"))  # keep-alive promised, then closed while idle
        await writer.drain()

    async with serve(handler) as server:
        assert (await client.get(server.url())).text == "once"
        await server.closed.wait()
        await asyncio.sleep(0.05)  # the client's event loop sees the EOF
        assert (await client.get(server.url())).text == "once"
    assert server.connections == 2


async def test_is_readable_reports_an_idle_connection_the_server_closed():
    close_now = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await close_now.wait()

    async with serve(handler) as server:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", server.port, timeout=2)
        try:
            await asyncio.sleep(0.02)
            assert stream.get_extra_info("is_readable") is False
            assert stream.get_extra_info("server_addr") == ("127.0.0.1", server.port)
            assert stream.get_extra_info("client_addr")[0] == "127.0.0.1"
            assert stream.get_extra_info("socket").fileno() >= 0
            assert stream.get_extra_info("ssl_object") is None
            close_now.set()
            await server.closed.wait()
            await asyncio.sleep(0.02)
            assert stream.get_extra_info("is_readable") is True
            assert await stream.read(1024) == b""  # end of stream, not an error
            assert await stream.read(1024) == b""
        finally:
            await stream.aclose()
    with pytest.raises(httpcore.ReadError):
        await stream.read(1024)
    with pytest.raises(httpcore.WriteError):
        await stream.write(b"late")


async def test_bytes_that_arrived_before_the_close_are_still_read():
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"last words")
        await writer.drain()

    async with serve(handler) as server:
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", server.port)
        await server.closed.wait()
        await asyncio.sleep(0.02)
        assert await stream.read(4) == b"last"
        assert await stream.read(100) == b" words"
        assert await stream.read(100) == b""
        await stream.aclose()


async def test_unix_sockets_are_delegated_to_the_anyio_backend(tmp_path: Path):
    path = str(tmp_path / "http.sock")
    server = Server(keep_alive_handler)
    listener = await asyncio.start_unix_server(server._serve, path)
    try:
        async with httpx.AsyncClient(transport=AsyncioTransport(uds=path)) as made:
            got = await made.get("http://unix/over-a-file")
        await server.closed.wait()
    finally:
        listener.close()
    assert got.text == "you asked for /over-a-file"
    assert not isinstance(got.extensions["network_stream"], AsyncioStream)


# --- failures: the same httpx exception as the stock transport --------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_connection_refused_is_a_connect_error(kind: str):
    async with make_client(kind, timeout=2) as made:
        with pytest.raises(httpx.ConnectError):
            await made.get(f"http://127.0.0.1:{free_port()}/")


@contextlib.contextmanager
def unresponsive_listener() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops new SYNs, so connects hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_connect_timeout(kind: str):
    with unresponsive_listener() as port:
        async with make_client(kind, timeout=httpx.Timeout(5, connect=0.3)) as made:
            with pytest.raises(httpx.ConnectTimeout):
                await made.get(f"http://127.0.0.1:{port}/")


@pytest.mark.parametrize("kind", TRANSPORTS)
@pytest.mark.parametrize("stall", ["before the headers", "after the headers"])
async def test_read_timeout(kind: str, stall: str):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if stall == "after the headers":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nsome")
            await writer.drain()
        await asyncio.sleep(5)

    async with (
        serve(handler) as server,
        make_client(kind, timeout=httpx.Timeout(5, read=0.2)) as made,
    ):
        with pytest.raises(httpx.ReadTimeout):
            await made.get(server.url())


def _abort_with_reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize("how", ["closed", "reset"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_server_dropping_the_connection_mid_body(how: str, framing: str):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello")
        await writer.drain()
        await asyncio.sleep(0.05)
        if how == "reset":
            _abort_with_reset(writer)

    raised: dict[str, type[BaseException]] = {}
    async with serve(handler) as server:
        for kind in TRANSPORTS:
            async with make_client(kind, timeout=2) as made:
                with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)) as caught:
                    await made.get(server.url())
            raised[kind] = caught.type
    assert raised["asyncio"] is raised["stock"]


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_write_timeout_when_the_server_stops_reading(kind: str):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)  # never reads: the kernel buffers fill up

    upload = b"x" * (64 * 1024 * 1024)
    timeout = httpx.Timeout(5, write=0.3)
    async with serve(handler) as server, make_client(kind, timeout=timeout) as made:
        with pytest.raises(httpx.WriteTimeout):
            await made.post(server.url(), content=upload)


# --- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert.pem, key.pem)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lyceum test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def server_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    return context


def trusting_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certificate[0]))


async def test_https_with_a_trusted_self_signed_certificate(certificate):
    async with (
        serve(keep_alive_handler, server_context(certificate)) as server,
        make_client("asyncio", verify=trusting_context(certificate), timeout=5) as made,
    ):
        first = await made.get(server.url("/secure", scheme="https"))
        second = await made.get(server.url("/again", scheme="https"))
    assert first.text == "you asked for /secure"
    assert second.text == "you asked for /again"
    assert server.connections == 1
    stream = first.extensions["network_stream"]
    assert isinstance(stream, AsyncioStream)
    assert isinstance(stream.get_extra_info("ssl_object"), ssl.SSLObject)


async def test_https_pooled_connection_closed_by_the_server_is_replaced(certificate):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response(b"secure once"))
        await writer.drain()

    async with (
        serve(handler, server_context(certificate)) as server,
        make_client("asyncio", verify=trusting_context(certificate), timeout=5) as made,
    ):
        assert (await made.get(server.url(scheme="https"))).text == "secure once"
        await server.closed.wait()
        await asyncio.sleep(0.05)
        assert (await made.get(server.url(scheme="https"))).text == "secure once"
    assert server.connections == 2


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_an_untrusted_certificate_is_a_connect_error(kind: str, certificate):
    async with (
        serve(keep_alive_handler, server_context(certificate)) as server,
        make_client(kind, verify=ssl.create_default_context(), timeout=5) as made,
    ):
        with pytest.raises(httpx.ConnectError) as caught:
            await made.get(server.url(scheme="https"))
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_tls_handshake_that_never_completes_is_a_connect_timeout(kind: str):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)  # accepts TCP, never answers the ClientHello

    async with (
        serve(handler) as server,
        make_client(kind, timeout=httpx.Timeout(5, connect=0.3)) as made,
    ):
        with pytest.raises(httpx.ConnectTimeout):
            await made.get(server.url(scheme="https"))


# --- how the provider picks its transport -------------------------------------------------


def _transport_of(provider: OpenAIProvider, url: str) -> httpx.AsyncBaseTransport:
    return provider._client()._transport_for_url(httpx.URL(url))


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


async def test_the_provider_uses_its_own_client_without_a_proxy(no_proxy_env):
    provider = OpenAIProvider("p", "https://api.example.test/v1", "sk-x")
    try:
        assert provider._lean  # chat/llm/httpclient.py
        asked = OpenAIProvider("p", "https://api.example.test/v1", "sk-x", transport="asyncio")
        assert not asked._lean
        assert isinstance(_transport_of(asked, asked.base_url), AsyncioTransport)
        await asked.aclose()
    finally:
        await provider.aclose()


async def test_the_provider_keeps_httpx_proxy_handling_when_the_environment_sets_one(
    no_proxy_env,
):
    no_proxy_env.setenv("HTTPS_PROXY", "http://proxy.example.test:3128")
    provider = OpenAIProvider("p", "https://api.example.test/v1", "sk-x")
    try:
        assert netbackend.environment_proxy_for(provider.base_url)
        assert not provider._lean
        transport = _transport_of(provider, provider.base_url)
        assert not isinstance(transport, AsyncioTransport)
        assert isinstance(transport._pool, httpcore.AsyncHTTPProxy)  # type: ignore[attr-defined]
    finally:
        await provider.aclose()


def test_environment_proxy_for(no_proxy_env):
    assert not netbackend.environment_proxy_for("http://127.0.0.1:8000/v1")
    no_proxy_env.setenv("HTTP_PROXY", "http://proxy.example.test:3128")
    assert netbackend.environment_proxy_for("http://127.0.0.1:8000/v1")
    assert not netbackend.environment_proxy_for("https://api.example.test/v1")
    no_proxy_env.setenv("ALL_PROXY", "socks5://proxy.example.test:1080")
    assert netbackend.environment_proxy_for("https://api.example.test/v1")
    no_proxy_env.setenv("NO_PROXY", "localhost, *")
    assert not netbackend.environment_proxy_for("https://api.example.test/v1")


async def test_a_client_given_to_the_provider_is_used_as_is():
    async with httpx.AsyncClient() as given:
        provider = OpenAIProvider("p", "https://api.example.test/v1", "sk-x", client=given)
        assert provider._client() is given and not provider._lean
        await provider.aclose()
        assert not given.is_closed
