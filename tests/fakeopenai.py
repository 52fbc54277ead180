"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions wire format.

It runs in a background thread with its own event loop, so the same server serves async
tests, sync tests and other processes (a Daphne subprocess pointed at ``.base_url``).
Each response is described by a :class:`Script`: text split into tokens, reasoning,
tool calls split into fragments, usage, and fault modes (HTTP errors, in-stream errors,
malformed lines, dropped connections, stalls, missing ``[DONE]``, CRLF, split writes).

Usage::

    with FakeOpenAI() as server:
        server.enqueue(Script(status=500), Script(text="Hello"))
        ... point a provider at server.base_url ...
        assert len(server.requests) == 2

Scripts come from the queue first, then the factory (``respond_with``), then ``default``.
Every response is sent with ``Connection: close``, so one TCP connection is one request
and a client disconnect is unambiguous (see :meth:`FakeOpenAI.wait_for_disconnect`).

Run standalone (for benchmarks and manual tests)::

    python -m tests.fakeopenai --port 0 --tokens 2000   # prints "READY <port>"
    python -m tests.fakeopenai --port 0 --tokens 300 --tokens-per-second 30 --stamp \
        --record replies.jsonl   # paced, send-time-stamped tokens; each reply logged

With ``Script.stamp_tokens`` every ``{t}`` in a text token becomes the Unix time (in
microseconds) at which that chunk is written, so a client can measure each token's
latency. Every finished streamed reply is kept in :attr:`FakeOpenAI.replies` (the last
user message and the exact text sent).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

FAKE_CREATED = 1_700_000_000


@dataclass
class FakeToolCall:
    name: str
    arguments: str = "{}"
    id: str | None = None  # None: "call_fake_<n>"; "" sends an empty id (the client invents one)
    pieces: int = 3  # the arguments are sent in this many fragments
    name_pieces: int = 1  # the name too (most servers send it whole)


@dataclass
class Script:
    """One scripted response. The defaults produce a short, well-formed streamed reply."""

    text: str = "Hello from the fake model."
    tokens: list[str] | None = None  # explicit text tokens; default: ``text`` split into words
    n_tokens: int | None = None  # or: ``text`` cut into this many pieces
    reasoning: str = ""
    reasoning_tokens: list[str] | None = None
    reasoning_field: str = "reasoning_content"  # or "reasoning" (OpenRouter / Ollama)
    tool_calls: list[FakeToolCall] = field(default_factory=list)
    interleave_tool_calls: bool = False  # alternate fragments of different calls
    finish_reason: str | None = None  # default: "tool_calls" with tool calls, else "stop"
    finish: bool = True  # send the chunk carrying finish_reason
    usage: bool = True  # final usage-only chunk (when the request asks for include_usage)
    prompt_tokens: int = 11
    token_delay: float = 0.0  # seconds between content chunks (1 / tokens per second)
    headers_delay: float = 0.0  # before the status line: a stall before the first byte
    body_delay: float = 0.0  # after the headers, before the first body bytes
    # HTTP-level answer
    status: int = 200
    error_body: Any = None  # JSON-able or str: sent as the whole body (with any status)
    headers: dict[str, str] = field(default_factory=dict)
    non_stream: bool | None = None  # None: follow the request's "stream"; True forces JSON
    # faults, all happening after ``fault_after`` content chunks
    fault_after: int = 0
    stream_error: Any = None  # sent as a data event (an {"error": ...} object)
    error_event: bool = False  # send ``stream_error`` as ``event: error`` instead
    malformed: bool = False  # a data line that is not JSON
    drop: bool = False  # close the connection without finishing the HTTP body
    drop_reset: bool = False  # with ``drop``: RST instead of FIN (unread data may be lost)
    stall: float = 0.0  # stop sending for this long
    keepalive: float | None = None  # during the stall, a ": keep-alive" comment this often
    # framing
    done: bool = True  # send "data: [DONE]"
    after_done: str | None = None  # raw data sent after [DONE]
    line_ending: str = "\n"  # "\r\n" or "\r" work too
    comments: bool = False  # a ": comment" line before every event
    split: int | None = None  # write in random pieces of 1..split bytes (splits lines, UTF-8)
    split_seed: int = 0
    coalesce: bool = False  # build the whole body and write it at once (benchmarks)
    stamp_tokens: bool = False  # "{t}" in a text token -> its send time (Unix epoch, µs)

    def text_tokens(self) -> list[str]:
        if self.tokens is not None:
            return list(self.tokens)
        return _split_text(self.text, self.n_tokens)

    def reasoning_pieces(self) -> list[str]:
        if self.reasoning_tokens is not None:
            return list(self.reasoning_tokens)
        return _split_text(self.reasoning, None)


def _split_text(text: str, pieces: int | None) -> list[str]:
    if not text:
        return []
    if pieces is None:
        return re.findall(r"\s*\S+\s*?(?=\s|$)|\s+", text) or [text]
    pieces = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), pieces)
    out, start = [], 0
    for index in range(pieces):
        end = start + size + (1 if index < extra else 0)
        out.append(text[start:end])
        start = end
    return out


def _split_even(text: str, pieces: int) -> list[str]:
    return _split_text(text, pieces) if text else [""]


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    json: Any
    received_at: float

    def last_user_text(self) -> str:
        """The content of the last user message of a chat request ("" if none)."""
        body = self.json if isinstance(self.json, dict) else {}
        for message in reversed(body.get("messages") or []):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                return content if isinstance(content, str) else json.dumps(content)
        return ""


@dataclass
class SentReply:
    """A streamed reply that was sent to the end: what was asked and the exact text sent."""

    prompt: str  # the last user message of the request
    text: str  # the content tokens as written (stamps filled in)
    finished_at: float  # Unix time


class _ResponseOver(Exception):
    """Stop answering: the client left, or a scripted fault ended the response."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False


ScriptFactory = Callable[[RecordedRequest], "Script | None"]


class FakeOpenAI:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default: Script | None = None,
        models: list[str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.default = default or Script()
        self.models = models or ["fake-model", "fake-reasoner"]
        # Checks of a provider's settings (the admin's Test connection, Fetch models):
        self.api_key: str | None = None  # set: a request without this bearer key gets 401
        self.models_status = 200  # another status answers GET /models with an error
        self.models_delay = 0.0  # seconds before GET /models answers
        self.requests: list[RecordedRequest] = []
        self.disconnects: list[float] = []  # monotonic times of early client disconnects
        self.responses_started = 0
        self.replies: list[SentReply] = []  # finished streamed replies, in finishing order
        self.on_reply: Callable[[SentReply], None] | None = None  # called in the server thread
        self._queue: deque[Script] = deque()
        self._factory: ScriptFactory | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # --- control (any thread) -----------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def enqueue(self, *scripts: Script) -> None:
        with self._lock:
            self._queue.extend(scripts)

    def respond_with(self, factory: ScriptFactory | None) -> None:
        """Decide each response from the request (when the queue is empty)."""
        self._factory = factory

    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def wait_for_disconnect(self, count: int = 1, timeout: float = 1.0) -> bool:
        """Block until ``count`` clients left mid-response, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while len(self.disconnects) < count:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    async def wait_for_disconnect_async(self, count: int = 1, timeout: float = 1.0) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.disconnects) < count:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    def start(self) -> FakeOpenAI:
        self._thread = threading.Thread(target=self._run, name="fake-openai", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the server loop ----------------------------------------------------------------

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(reader, writer)
        watcher: asyncio.Task[None] | None = None
        try:
            request = await _read_request(reader)
            if request is None:
                return
            self.requests.append(request)
            watcher = asyncio.create_task(self._watch(conn))
            await self._route(conn, request)
            conn.finished = True
        except _ResponseOver:
            pass
        except (ConnectionError, asyncio.IncompleteReadError):
            self._client_left(conn)
        finally:
            if watcher is not None:
                watcher.cancel()
            with contextlib.suppress(Exception):
                writer.close()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _watch(self, conn: _Connection) -> None:
        """Notice the client closing its side (EOF) while we are still answering."""
        with contextlib.suppress(ConnectionError):
            while await conn.reader.read(4096):
                pass
        if not conn.finished:
            self._client_left(conn)

    def _client_left(self, conn: _Connection) -> None:
        if not conn.gone.is_set() and not conn.finished:
            conn.gone.set()
            self.disconnects.append(time.monotonic())

    def _record_reply(self, reply: SentReply) -> None:
        self.replies.append(reply)
        if self.on_reply is not None:
            self.on_reply(reply)

    def _next_script(self, request: RecordedRequest) -> Script:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self._factory is not None:
            script = self._factory(request)
            if script is not None:
                return script
        return self.default

    async def _route(self, conn: _Connection, request: RecordedRequest) -> None:
        path = request.path.split("?", 1)[0]
        if self.api_key is not None and request.headers.get("authorization") != (
            f"Bearer {self.api_key}"
        ):
            error = {"message": "Incorrect API key provided", "code": "invalid_api_key"}
            await _send_json(conn, 401, {"error": error})
        elif request.method == "GET" and path.endswith("/models"):
            if self.models_delay:
                await asyncio.sleep(self.models_delay)
            if self.models_status != 200:
                message = f"no model list ({self.models_status})"
                await _send_json(conn, self.models_status, {"error": {"message": message}})
                return
            data = [{"id": m, "object": "model", "owned_by": "fake"} for m in self.models]
            await _send_json(conn, 200, {"object": "list", "data": data})
        elif request.method == "POST" and path.endswith("/chat/completions"):
            self.responses_started += 1
            responder = _Responder(conn, request, self._next_script(request))
            await responder.run()
            if responder.stream and responder.completed:
                self._record_reply(
                    SentReply(request.last_user_text(), responder.sent_text, time.time())
                )
        else:
            await _send_json(conn, 404, {"error": {"message": f"no route {path}"}})


# --- HTTP/1.1, the minimum --------------------------------------------------------------


async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length") or 0)
    body = await reader.readexactly(length) if length else b""
    parsed: Any = None
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = body.decode("utf-8", "replace")
    return RecordedRequest(method, path, headers, parsed, time.monotonic())


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def _status_line(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _write(conn: _Connection, data: bytes) -> None:
    if conn.gone.is_set():
        raise _ResponseOver
    conn.writer.write(data)
    await conn.writer.drain()


async def _send_json(
    conn: _Connection, status: int, body: Any, extra: dict[str, str] | None = None
) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    content_type = "text/plain" if isinstance(body, str) else "application/json"
    headers = {"Content-Type": content_type, "Content-Length": str(len(raw)), **(extra or {})}
    conn.finished = True  # a client closing after reading this is not an early disconnect
    await _write(conn, _status_line(status, headers) + raw)


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Responder:
    """Plays one script on one connection."""

    def __init__(self, conn: _Connection, request: RecordedRequest, script: Script) -> None:
        self.conn = conn
        self.script = script
        body = request.json if isinstance(request.json, dict) else {}
        self.model = str(body.get("model") or "fake-model")
        self.stream = (
            bool(body.get("stream")) if script.non_stream is None else not script.non_stream
        )
        options = body.get("stream_options") or {}
        self.include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        self.rng = random.Random(script.split_seed)
        self.pending: list[bytes] = []  # coalesce mode collects the body here
        self.content_sent = 0
        self.faulted = False
        self.text_parts: list[str] = []  # text tokens as written (stamps filled in)
        self.completed = False  # the body was sent to its end

    @property
    def sent_text(self) -> str:
        return "".join(self.text_parts)

    async def pause(self, seconds: float) -> None:
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(self.conn.gone.wait(), seconds)
        except TimeoutError:
            return
        raise _ResponseOver

    async def run(self) -> None:
        script = self.script
        await self.pause(script.headers_delay)
        if script.status != 200 or script.error_body is not None:
            body = (
                script.error_body
                if script.error_body is not None
                else {"error": {"message": "scripted failure"}}
            )
            await _send_json(self.conn, script.status, body, script.headers)
            return
        if not self.stream:
            await self.pause(script.body_delay)
            await _send_json(self.conn, 200, self.completion_body(), script.headers)
            return
        headers = {
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "Transfer-Encoding": "chunked",
            **script.headers,
        }
        await _write(self.conn, _status_line(200, headers))
        await self.pause(script.body_delay)
        await self.play()

    # --- streamed body ------------------------------------------------------------------

    async def play(self) -> None:
        script = self.script
        await self.event({"role": "assistant", "content": ""})
        for piece in script.reasoning_pieces():
            await self.content({script.reasoning_field: piece})
        for piece in script.text_tokens():
            await self.text(piece)
        for fragment in self.tool_fragments():
            await self.content({"tool_calls": [fragment]})
        if await self.fault():  # faults scheduled after every content chunk
            return
        if script.finish:
            await self.event({}, finish_reason=self.finish_reason())
        if script.usage and self.include_usage:
            await self.send_data(self.envelope([], usage=self.usage()))
        if script.done:
            await self.send_data("[DONE]")
        if script.after_done is not None:
            await self.send_data(script.after_done)
        await self.end_body()

    async def end_body(self) -> None:
        await self.flush()
        self.conn.finished = True
        await self.raw(b"0\r\n\r\n")
        self.completed = True

    async def content(self, delta: dict[str, Any]) -> None:
        if await self.fault():
            raise _ResponseOver  # the fault already ended the response
        if self.content_sent:
            await self.pause(self.script.token_delay)
        await self.event(delta)
        self.content_sent += 1

    async def text(self, piece: str) -> None:
        """A text chunk; stamped (``{t}`` -> now in µs) only once its pause is over."""
        if await self.fault():
            raise _ResponseOver
        if self.content_sent:
            await self.pause(self.script.token_delay)
        if self.script.stamp_tokens:
            piece = piece.replace("{t}", str(time.time_ns() // 1000))
        await self.event({"content": piece})
        self.text_parts.append(piece)
        self.content_sent += 1

    async def fault(self) -> bool:
        """Run the scheduled fault if it is due now; True when it ended the response."""
        script = self.script
        if self.content_sent != script.fault_after or self.faulted:
            return False
        self.faulted = True
        if script.stall:
            await self.stall()
        if script.stream_error is not None:
            if script.error_event:
                await self.send_event("error", json.dumps(script.stream_error))
            else:
                await self.send_data(json.dumps(script.stream_error))
            await self.end_body()
            return True
        if script.malformed:
            await self.send_data('{"choices": [{"delta": {"content": "oops"')
        if script.drop:
            await self.flush()
            await self.drop()
            return True
        return False

    async def stall(self) -> None:
        await self.flush()
        script = self.script
        end = time.monotonic() + script.stall
        while (left := end - time.monotonic()) > 0:
            step = min(left, script.keepalive) if script.keepalive else left
            await self.pause(step)
            if script.keepalive and end - time.monotonic() > 0:
                await self.raw(_chunked(b": keep-alive" + script.line_ending.encode() * 2))

    async def drop(self) -> None:
        writer = self.conn.writer
        while writer.transport.get_write_buffer_size():
            await asyncio.sleep(0.001)
        if self.script.drop_reset:
            writer.transport.abort()
        else:
            writer.close()
        raise _ResponseOver

    def tool_fragments(self) -> list[dict[str, Any]]:
        per_call: list[list[dict[str, Any]]] = []
        for index, call in enumerate(self.script.tool_calls):
            call_id = f"call_fake_{index}" if call.id is None else call.id
            names = _split_even(call.name, call.name_pieces)
            args = _split_even(call.arguments, call.pieces)
            fragments: list[dict[str, Any]] = []
            for position in range(max(len(names), len(args))):
                function: dict[str, str] = {}
                if position < len(names):
                    function["name"] = names[position]
                function["arguments"] = args[position] if position < len(args) else ""
                fragment: dict[str, Any] = {"index": index, "function": function}
                if position == 0:
                    fragment["id"] = call_id
                    fragment["type"] = "function"
                fragments.append(fragment)
            per_call.append(fragments)
        if not self.script.interleave_tool_calls:
            return [f for fragments in per_call for f in fragments]
        out: list[dict[str, Any]] = []
        for position in range(max((len(f) for f in per_call), default=0)):
            out += [fragments[position] for fragments in per_call if position < len(fragments)]
        return out

    def finish_reason(self) -> str:
        if self.script.finish_reason is not None:
            return self.script.finish_reason
        return "tool_calls" if self.script.tool_calls else "stop"

    def usage(self) -> dict[str, int]:
        script = self.script
        completion = len(script.text_tokens()) + len(script.reasoning_pieces())
        completion += len(self.tool_fragments())
        return {
            "prompt_tokens": script.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": script.prompt_tokens + completion,
        }

    def envelope(self, choices: list[dict[str, Any]], usage: Any = None) -> str:
        chunk: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": FAKE_CREATED,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return json.dumps(chunk, ensure_ascii=False, separators=(",", ":"))

    async def event(self, delta: dict[str, Any], finish_reason: str | None = None) -> None:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        await self.send_data(self.envelope([choice]))

    async def send_data(self, data: str) -> None:
        await self.send_event(None, data)

    async def send_event(self, name: str | None, data: str) -> None:
        end = self.script.line_ending
        text = f": comment{end}" if self.script.comments else ""
        if name:
            text += f"event: {name}{end}"
        text += f"data: {data}{end}{end}"
        raw = text.encode("utf-8")
        if self.script.coalesce:
            self.pending.append(raw)
        else:
            await self.body(raw)

    async def flush(self) -> None:
        if self.pending:
            data, self.pending = b"".join(self.pending), []
            await self.body(data)

    async def body(self, raw: bytes) -> None:
        if not self.script.split:
            await self.raw(_chunked(raw))
            return
        start = 0
        while start < len(raw):
            end = start + self.rng.randint(1, self.script.split)
            await self.raw(_chunked(raw[start:end]))
            start = end

    async def raw(self, data: bytes) -> None:
        await _write(self.conn, data)

    # --- non-streamed body --------------------------------------------------------------

    def completion_body(self) -> dict[str, Any]:
        script = self.script
        message: dict[str, Any] = {"role": "assistant", "content": "".join(script.text_tokens())}
        if script.reasoning:
            message[script.reasoning_field] = script.reasoning
        if script.tool_calls:
            message["tool_calls"] = [
                {
                    "id": f"call_fake_{index}" if call.id is None else call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for index, call in enumerate(script.tool_calls)
            ]
        body: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": FAKE_CREATED,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason()}],
        }
        if script.usage:
            body["usage"] = self.usage()
        return body


# --- pytest fixture and command line -------------------------------------------------------


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    """A started fake OpenAI server, stopped after the test."""
    with FakeOpenAI() as server:
        yield server


STAMPED_TOKEN = "w{i}t{{t}} "  # "w<index>t<send time µs> " once sent; see STAMPED_TOKEN_RE
STAMPED_TOKEN_RE = re.compile(r"w(\d+)t(\d{16})")


def bench_script(
    tokens: int,
    token_delay: float = 0.0,
    coalesce: bool = True,
    stamp: bool = False,
    markdown: bool = False,
    voices: list[str] | None = None,
) -> Script:
    """A long reply, e.g. for benchmarks: ``tokens`` chunks of ``"tok<i> "``.

    With ``stamp`` the chunks are ``"w<i>t<send time in µs> "`` instead (match them with
    :data:`STAMPED_TOKEN_RE`), so a client can tell when each one left the server.
    With ``markdown`` the words are shaped like a model's answer: paragraphs of 40
    words then a short list, every few words bold or inline code.
    """
    word = STAMPED_TOKEN if stamp else "tok{i} "
    pieces = [word.format(i=i) for i in range(tokens)]
    if markdown:
        pieces = [_markdown_word(i, piece) for i, piece in enumerate(pieces)]
    if voices and pieces:
        # One tagged segment per speaker (a classroom's one call), the words shared out.
        size = -(-len(pieces) // len(voices))
        for number, name in enumerate(voices):
            first, last = number * size, min(len(pieces), (number + 1) * size) - 1
            if first <= last:
                pieces[first] = f"<{name}>{pieces[first]}"
                pieces[last] = f"{pieces[last]}</{name}>\n"
    return Script(tokens=pieces, token_delay=token_delay, coalesce=coalesce, stamp_tokens=stamp)


def _markdown_word(index: int, word: str) -> str:
    core = word.rstrip(" ")
    if index % 9 == 4:
        word = f"**{core}** "
    elif index % 13 == 6:
        word = f"`{core}` "
    position = index % 50  # 40 words of paragraph, then 5 list items of 2 words
    if position >= 40 and position % 2 == 0:
        word = "\n- " + word
    if position == 49:
        word += "\n\n"
    return word


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a fake OpenAI-compatible API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=20, help="tokens in the default reply")
    parser.add_argument("--token-delay", type=float, default=0.0)
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=0.0,
        help="pace the reply (sets --token-delay to 1/N and writes one chunk per token)",
    )
    parser.add_argument("--no-coalesce", action="store_true", help="one write per token")
    parser.add_argument(
        "--stamp", action="store_true", help='tokens "w<i>t<send time µs> " (latency probes)'
    )
    parser.add_argument(
        "--markdown", action="store_true", help="paragraphs, a list, bold and code words"
    )
    parser.add_argument(
        "--voices", default="", help="comma-separated speakers: one tagged segment each"
    )
    parser.add_argument(
        "--record", metavar="FILE", help="append each finished reply to FILE as a JSON line"
    )
    args = parser.parse_args(argv)
    token_delay, coalesce = args.token_delay, not args.no_coalesce
    if args.tokens_per_second > 0:
        token_delay, coalesce = 1.0 / args.tokens_per_second, False
    default = bench_script(
        args.tokens,
        token_delay,
        coalesce=coalesce,
        stamp=args.stamp,
        markdown=args.markdown,
        voices=[v.strip() for v in args.voices.split(",") if v.strip()],
    )
    server = FakeOpenAI(host=args.host, port=args.port, default=default)
    record = open(args.record, "a", encoding="utf-8") if args.record else None  # noqa: SIM115
    if record is not None:
        server.on_reply = lambda reply: _write_reply(record, reply)
    server.start()
    print(f"READY {server.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        if record is not None:
            record.close()


def _write_reply(record: Any, reply: SentReply) -> None:
    line = {"prompt": reply.prompt, "text": reply.text, "finished_at": reply.finished_at}
    record.write(json.dumps(line, ensure_ascii=False) + "\n")
    record.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
