"""Concurrent streaming over the chat WebSocket: latency, lost events, server CPU and memory.

Run: ``.venv/bin/python bench/bench_streams.py [--clients 100] [--tokens 300] [--tps 30]``
(from the repository root; ``--help`` lists every option).

What it does, per mode (``inprocess``: runs execute inside the one Daphne process with the
in-memory channel layer; ``redis``: Redis channel layer, ``LYCEUM_RUNNER=worker`` and one
``manage.py runworker`` process) and per push interval (``LYCEUM_STREAM_PUSH_INTERVAL``,
default ``0.2,0.05`` so the cost of coalescing is visible side by side):

1. a fresh temporary database (SQLite via ``SQLITE_PATH``, or PostgreSQL with
   ``--postgres``), migrated; a fake OpenAI server (``python -m tests.fakeopenai``) in a
   subprocess streams ``--tokens`` tokens at ``--tps`` tokens/s, each token carrying its
   send time (``w<i>t<µs> ``) and each finished reply logged;
2. one Daphne process (and the worker), DEBUG off; N users with a session each, one new
   chat per client on a ``fake-model`` ProviderModel pointing at the fake server;
3. N WebSocket clients (a minimal RFC 6455 client on asyncio, in this process) connect with Origin and session
   cookie, send ``resync`` then, spread over ``--ramp`` seconds, ``send``; each reads
   frames until the run's terminal item (the usage line) arrives;
4. afterwards every frame is checked against the database and the fake server's log.

Figures (one table per mode, one column per push interval):

* ``latency p50/p95/p99/max``: for every token of every reply, the time from the fake
  server writing it to the client receiving the first frame that contains it (a stream
  snapshot or the final message). Pushes are coalesced, so a token waits up to one push
  interval by design; the issue's target is p95 <= 150 ms at 100 streams. ``of which
  first shown in final msg``: tokens no snapshot carried (they arrived after the last
  push, so the written message shows them first). ``once all streams run``: only tokens
  sent after every reply had started, i.e. without the start-up burst of N runs.
* ``first token``: from the client's ``send`` to the first frame with reply text (run
  start-up: storing the message, preparing the run, the upstream request).
* ``events lost / duplicated``: every display seq 1..N of the chat must be covered exactly
  once by the frames' ``#seq-marker`` ranges, and every item (``data-seq``) the database
  holds must have arrived once; ``tokens never shown`` counts tokens no frame carried.
* ``text mismatches``: the stored reply must equal the text the fake server sent, and the
  tokens of the final message item the client got must be the ones sent, in order.
  ``extra upstream requests``: requests the fake server answered beyond one per reply
  (a run executed twice, e.g. a ``run.execute`` delivered to two workers).
* ``CPU ms / 1k tokens``: user+system CPU of each server process (``/proc/<pid>/stat``)
  from just before the first ``send`` to the last terminal frame, per 1,000 tokens
  streamed. ``% of a core`` is the same CPU over the wall time of that span.
* ``RSS / peak``: resident memory of each server process at the end, and its high-water
  mark (``VmHWM``).

``--profile`` runs Daphne (and the worker) under a sampling profiler (every thread's
stack every 5 ms, idle waits left out) and prints where their busy time went.
``--cprofile`` runs them under cProfile instead, in the event loop's thread and in the
database thread (asgiref's one thread for sync code), and copies the stats to
``/tmp/<process>.pstats`` and ``/tmp/<process>.db.pstats`` (read them with ``pstats``;
times are each thread's CPU, ``time.thread_time``; cProfile slows the servers down about
2x, so compare shares, not times).
``--set NAME=VALUE`` passes a setting to the servers (e.g. ``LYCEUM_CHECKPOINT_INTERVAL``).
``--conn-max-age S`` starts the servers with that ``CONN_MAX_AGE`` (an experiment: the
settings have no variable for it). ``--workers N`` starts N runworker processes.

The clients share this 2-core machine with the servers and the fake upstream, so the
client process's own CPU is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_BASE_URL = "postgres://postgres@127.0.0.1:5432"
REDIS_URL = "redis://127.0.0.1:6379/0"
PASSWORD = "bench-password-7311"
MODEL_ALIAS = "fake-model"
TARGET_P95_MS = 150.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOKEN_RE = re.compile(rb"w(\d+)t(\d{16})")  # tests.fakeopenai.STAMPED_TOKEN_RE, on bytes
MARKER_RE = re.compile(rb'id="seq-marker" data-seq="(\d+)"')
ITEM_RE = re.compile(rb'id="ev-(\d+)" data-seq="(\d+)"')
FINAL_REPLY_RE = re.compile(
    rb'<article class="msg assistant[^"]*" id="ev-(\d+)".*?</article>', re.S
)
TERMINAL_MARKS = (b'class="msg usage"', b'class="msg error-box"', b'class="msg system stopped"')


# --- environment, database, processes (bench_longchat.py uses these too) --------------------


def server_env(db_env: dict[str, str], workdir: Path, **extra: str) -> dict[str, str]:
    """The environment of every Django process of a benchmark: production-like, quiet."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LYCEUM_")
        and k not in {"REDIS_URL", "DATABASE_URL", "SQLITE_PATH", "DEBUG", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        DJANGO_SETTINGS_MODULE="chatsite.settings",
        DEBUG="0",
        SECRET_KEY="bench-" + "k" * 60,
        ALLOWED_HOSTS="127.0.0.1,localhost",
        SECURE_SSL_REDIRECT="0",
        LOG_LEVEL="WARNING",
        LYCEUM_WORKSPACE_ROOT=str(workdir / "workspaces"),
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        # A benchmark is one machine's many clients, faster than any person: the per-user
        # limits are off (a benchmark measuring them sets them through ``extra``).
        LYCEUM_MESSAGES_PER_MINUTE="0",
        LYCEUM_MAX_RUNNING_PER_USER="0",
        LYCEUM_MAX_CHATS_PER_USER="0",
        LYCEUM_STORAGE_QUOTA_MB="0",
        LYCEUM_LOGIN_ADDRESS_ATTEMPTS="0",
        LYCEUM_BAD_KEY_ATTEMPTS="0",
    )
    env.update(db_env)
    env.update(extra)
    return env


@contextlib.contextmanager
def temporary_database(workdir: Path, postgres: bool) -> Iterator[dict[str, str]]:
    """Environment variables naming a fresh, empty database; dropped/removed afterwards."""
    if not postgres:
        yield {"SQLITE_PATH": str(workdir / "bench.sqlite3")}
        return
    import psycopg

    name = f"lyceum_bench_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"DATABASE_URL": f"{PG_BASE_URL}/{name}"}
    finally:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django(env: dict[str, str]) -> None:
    """Configure Django in this process from ``env`` and migrate the database."""
    os.environ.update(env)
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    profile_out: Path | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{tail}")


@dataclass(frozen=True)
class ServeOptions:
    """How to run a server process: sampled (``profile``), and with a CONN_MAX_AGE override."""

    profile: bool = False
    conn_max_age: float | None = None  # None: whatever chatsite.settings says
    cprofile: bool = False  # with profile: cProfile of the main and database threads

    @property
    def wrapped(self) -> bool:
        return self.profile or self.conn_max_age is not None


def start_process(
    name: str,
    command: list[str],
    env: dict[str, str],
    workdir: Path,
    options: ServeOptions | None = None,
) -> Proc:
    log = workdir / f"{name}.log"
    profile_out = None
    if options is not None and options.wrapped:
        profile_out = workdir / f"{name}.profile.txt" if options.profile else None
        wrapper = {"profile": str(profile_out) if profile_out else None}
        if profile_out and options.cprofile:
            profile_out = workdir / f"{name}.pstats"
            wrapper = {"cprofile": str(profile_out)}
        wrapper["conn_max_age"] = options.conn_max_age
        command = [sys.executable, __file__, "--serve", json.dumps(wrapper), "--", *command]
    else:
        command = [sys.executable, *command]
    with log.open("ab") as out:
        popen = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Proc(name, popen, log, profile_out)


def stop_process(proc: Proc) -> None:
    if proc.popen.poll() is None and proc.profile_out is not None:
        proc.popen.send_signal(signal.SIGUSR1)  # write the profile first
        deadline = time.monotonic() + 20
        while not proc.profile_out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    if proc.popen.poll() is None:
        proc.popen.terminate()
        try:
            proc.popen.wait(15)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(proc: Proc, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.check_alive()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not listen on {port} within {timeout:.0f} s")


def cpu_seconds(pid: int, *, main_thread: bool = False) -> float:
    """User + system CPU of a process (all its threads, or its main thread) so far."""
    raw = Path(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident now, resident high-water mark) in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


# --- the fake upstream --------------------------------------------------------------------------


@contextlib.contextmanager
def fake_upstream(
    workdir: Path, tokens: int, tps: float, reply: str
) -> Iterator[tuple[str, Path, Proc]]:
    """``tests.fakeopenai`` in a subprocess: paced, stamped tokens; replies logged."""
    record = workdir / "replies.jsonl"
    command = [sys.executable, "-m", "tests.fakeopenai", "--port", "0", "--tokens", str(tokens)]
    command += ["--tokens-per-second", str(tps), "--stamp", "--record", str(record)]
    if reply == "markdown":
        command.append("--markdown")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    popen = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    proc = Proc("fake-openai", popen, workdir / "fake-openai.log")
    try:
        assert popen.stdout is not None
        line = popen.stdout.readline().split()
        if len(line) != 2 or line[0] != "READY":
            raise RuntimeError(f"the fake server did not start: {line!r}")
        yield f"http://127.0.0.1:{line[1]}/v1", record, proc
    finally:
        stop_process(proc)


def recorded_replies(record: Path, since: float) -> tuple[dict[str, str], int]:
    """The replies the fake server finished after ``since``: prompt -> text (the first one
    per prompt), and how many requests it answered in all (a run executed twice asks twice)."""
    replies: dict[str, str] = {}
    answered = 0
    if record.exists():
        for line in record.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if entry["finished_at"] >= since:
                answered += 1
                replies.setdefault(entry["prompt"], entry["text"])
    return replies, answered


# --- users, sessions, chats --------------------------------------------------------------------


@dataclass
class Seat:
    """One benchmark client: a user with a logged-in session."""

    index: int
    user_id: int
    session_key: str


def create_seats(count: int, base_url: str) -> list[Seat]:
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.auth.hashers import make_password

    from chat.models import Provider, ProviderModel

    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=base_url, api_key="sk-bench-secret"
    )
    ProviderModel.objects.create(
        provider=provider, alias=MODEL_ALIAS, model_id="gpt-fake", context_window=32_000
    )
    User = get_user_model()
    hashed = make_password(PASSWORD)  # once: the same known password for every user
    User.objects.bulk_create([User(username=f"bench{i}", password=hashed) for i in range(count)])
    engine = import_module(settings.SESSION_ENGINE)
    seats = []
    for index, user in enumerate(User.objects.filter(username__startswith="bench").order_by("pk")):
        session = engine.SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        seats.append(Seat(index, user.pk, session.session_key))
    return seats


def new_chats(seats: list[Seat]) -> list[str]:
    from django.contrib.auth import get_user_model

    from chat import actions

    users = get_user_model().objects.in_bulk([s.user_id for s in seats])
    return [str(actions.new_chat(users[s.user_id], model=MODEL_ALIAS).pk) for s in seats]


# --- the WebSocket clients ----------------------------------------------------------------------


@dataclass
class ClientRun:
    seat: Seat
    chat_id: str
    prompt: str
    frames: list[tuple[float, bytes]] = field(default_factory=list)
    sent_at: float = 0.0
    done_at: float = 0.0
    close_code: int | None = None
    error: str = ""
    finished: asyncio.Future | None = None
    reader: asyncio.Task | None = None

    def on_frame(self, payload: bytes) -> None:
        now = time.time()  # first: the arrival time is the measurement
        self.frames.append((now, payload))
        finished = self.finished
        if finished is not None and not finished.done() and _is_terminal(payload):
            self.done_at = now
            finished.set_result(None)


def _is_terminal(payload: bytes) -> bool:
    return any(mark in payload for mark in TERMINAL_MARKS)


WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class MiniWebSocket:
    """Just enough of RFC 6455 for a benchmark client, on asyncio streams.

    autobahn (installed with Daphne) cannot be used here: Django's set-up imports Daphne,
    which pins txaio to Twisted, and autobahn's asyncio client then refuses to load. This
    client sends masked text frames, reassembles fragmented messages, answers pings and
    closes cleanly; that is all the chat socket needs.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.closed = False

    @classmethod
    async def connect(cls, port: int, path: str, headers: dict[str, str]) -> MiniWebSocket:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**22)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        if not head.startswith("HTTP/1.1 101") or accept not in head:
            writer.close()
            raise ConnectionError(f"handshake refused: {head.splitlines()[0]!r}")
        return cls(reader, writer)

    def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        keystream = (mask * (size // 4 + 1))[:size]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(keystream, "big")).to_bytes(
            size, "big"
        )
        self.writer.write(head + mask + masked)

    def send_text(self, payload: bytes) -> None:
        self._send(0x1, payload)

    async def receive(self) -> bytes | None:
        """The next text/binary message, or None once the socket is closed."""
        parts: list[bytes] = []
        while True:
            try:
                first, second = await self.reader.readexactly(2)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.closed = True
                return None
            opcode, size = first & 0x0F, second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", await self.reader.readexactly(8))
            payload = await self.reader.readexactly(size)  # server frames are never masked
            if opcode == 0x8:  # close: answer it and stop
                if not self.closed:
                    self.closed = True
                    self._send(0x8, payload[:2])
                return None
            if opcode == 0x9:
                self._send(0xA, payload)
                continue
            if opcode == 0xA:
                continue
            parts.append(payload)
            if first & 0x80:  # FIN
                return b"".join(parts)

    def start_close(self, code: int = 1000) -> None:
        """Send a close frame; :meth:`receive` returns None once the server answers."""
        if not self.closed:
            self.closed = True
            with contextlib.suppress(ConnectionError):
                self._send(0x8, struct.pack("!H", code))


async def _connect(client: ClientRun, port: int) -> MiniWebSocket:
    loop = asyncio.get_running_loop()
    client.finished = loop.create_future()
    # A client that timed out still gets its future failed later: mark that seen.
    client.finished.add_done_callback(lambda f: f.cancelled() or f.exception())
    socket_ = await MiniWebSocket.connect(
        port,
        f"/ws/chat/{client.chat_id}/",
        {"Origin": f"http://127.0.0.1:{port}", "Cookie": f"sessionid={client.seat.session_key}"},
    )
    client.reader = asyncio.create_task(_read_frames(client, socket_))
    return socket_


async def _read_frames(client: ClientRun, socket_: MiniWebSocket) -> None:
    while (payload := await socket_.receive()) is not None:
        client.on_frame(payload)
    client.close_code = 0
    if client.finished is not None and not client.finished.done():
        client.finished.set_exception(ConnectionError("the server closed the socket"))


def _frame(**fields: Any) -> bytes:
    headers = {"HX-Request": "true", "HX-Trigger": "composer", "HX-Current-URL": "bench"}
    return json.dumps({**fields, "HEADERS": headers}).encode()


async def warm_up(client: ClientRun, port: int) -> None:
    """One reply, stopped at its first token: imports, connections and caches get warm."""
    socket_ = await _connect(client, port)
    socket_.send_text(_frame(action="resync", last_seq=0))
    socket_.send_text(_frame(action="send", message=client.prompt, client_id=secrets.token_hex(8)))
    deadline = time.monotonic() + 30
    while not any(TOKEN_RE.search(p) for _t, p in client.frames):
        if time.monotonic() > deadline:
            raise RuntimeError("the warm-up reply did not start within 30 s")
        await asyncio.sleep(0.02)
    socket_.send_text(_frame(action="cancel"))
    await asyncio.wait_for(client.finished, 30)
    socket_.start_close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.reader, 5)
    socket_.writer.close()


async def drive_clients(
    clients: list[ClientRun],
    warm: ClientRun,
    port: int,
    ramp: float,
    timeout: float,
    mark: Callable[[str], None],
) -> None:
    """Warm up, connect every client, start the replies over ``ramp`` s, wait for their ends.

    ``mark("start")`` is called just before the first send, ``mark("end")`` once every
    reply has ended (or timed out), before the sockets close."""
    await warm_up(warm, port)
    sockets: list[MiniWebSocket] = []
    for start in range(0, len(clients), 20):  # connect in small waves: no SYN flood
        batch = clients[start : start + 20]
        sockets += await asyncio.gather(*(_connect(c, port) for c in batch))
    for socket_ in sockets:
        socket_.send_text(_frame(action="resync", last_seq=0))
    await asyncio.sleep(0.5)  # let every resync be handled before the sends

    async def one(client: ClientRun, socket_: MiniWebSocket, delay: float) -> None:
        await asyncio.sleep(delay)
        client.sent_at = time.time()
        message = _frame(action="send", message=client.prompt, client_id=secrets.token_hex(8))
        socket_.send_text(message)
        try:
            await asyncio.wait_for(asyncio.shield(client.finished), timeout)
        except (TimeoutError, ConnectionError) as exc:
            client.error = f"{type(exc).__name__}: {exc}"

    delays = [ramp * i / max(1, len(clients)) for i in range(len(clients))]
    random.Random(7).shuffle(delays)
    mark("start")
    await asyncio.gather(*(one(c, s, d) for c, s, d in zip(clients, sockets, delays, strict=True)))
    mark("end")
    for socket_ in sockets:
        socket_.start_close()
    readers = [c.reader for c in clients if c.reader is not None]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 10)
    for socket_ in sockets:
        socket_.writer.close()


# --- checking what the clients got -----------------------------------------------------------


@dataclass
class Check:
    latencies_ms: list[float] = field(default_factory=list)
    first_token_ms: list[float] = field(default_factory=list)
    final_only_ms: list[float] = field(default_factory=list)  # first shown by the final item
    sent_and_latency: list[tuple[float, float]] = field(default_factory=list)
    reply_starts: list[float] = field(default_factory=list)  # first token sent, per reply

    @property
    def steady_ms(self) -> list[float]:
        """Latencies of tokens sent once every reply was streaming (the start-up is over)."""
        if not self.reply_starts:
            return []
        everyone = max(self.reply_starts)
        return [latency for sent, latency in self.sent_and_latency if sent >= everyone]

    tokens_sent: int = 0
    tokens_unseen: int = 0
    events_lost: int = 0
    events_duplicated: int = 0
    text_mismatches: int = 0
    extra_requests: int = 0  # upstream requests beyond one per reply (a run executed twice)
    unfinished: int = 0
    errors: list[str] = field(default_factory=list)


def check_client(client: ClientRun, replies: dict[str, str], check: Check) -> None:
    from chat import store
    from chat.presentation import display

    if client.error or not client.done_at:
        check.unfinished += 1
        check.errors.append(f"client {client.seat.index}: {client.error or 'no terminal frame'}")
    events = store.display_events_after(client.chat_id, 0)
    last_seq = events[-1].seq if events else 0
    item_seqs = {e.seq for e in events if display.item_from_event(e) is not None}
    sent_text = replies.get(client.prompt)
    sent_tokens = TOKEN_RE.findall(sent_text.encode()) if sent_text else []
    check.tokens_sent += len(sent_tokens)
    sent_at = {int(i): int(t) / 1e6 for i, t in sent_tokens}
    if sent_at:
        check.reply_starts.append(min(sent_at.values()))

    covered = 0  # the seq marker: each frame covers (covered, marker]
    seen_items: collections.Counter[int] = collections.Counter()
    shown: set[int] = set()
    final_html = b""
    for received, payload in client.frames:
        final = FINAL_REPLY_RE.search(payload)
        for token_index, _stamp in TOKEN_RE.findall(payload):
            index = int(token_index)
            if index not in shown and index in sent_at:
                shown.add(index)
                latency = (received - sent_at[index]) * 1000
                check.latencies_ms.append(latency)
                check.sent_and_latency.append((sent_at[index], latency))
                if final:
                    check.final_only_ms.append(latency)
                if len(shown) == 1:
                    check.first_token_ms.append((received - client.sent_at) * 1000)
        for _dom, seq in ITEM_RE.findall(payload):
            seen_items[int(seq)] += 1
        for marker in MARKER_RE.findall(payload):
            marker = int(marker)
            if marker <= covered:
                check.events_duplicated += 1  # a frame re-covering seqs already covered
            covered = max(covered, marker)
        if final:
            final_html = final.group(0)
    check.tokens_unseen += len(sent_at) - len(shown)
    check.events_lost += max(0, last_seq - covered)
    check.events_lost += len(item_seqs - set(seen_items))
    check.events_duplicated += sum(n - 1 for n in seen_items.values() if n > 1)
    stored = [
        e.payload.get("content")
        for e in events
        if e.kind == "msg" and e.payload.get("role") == "assistant"
    ]
    client_tokens = TOKEN_RE.findall(final_html)
    if sent_text is None or stored[-1:] != [sent_text] or client_tokens != sent_tokens:
        check.text_mismatches += 1
        ends = [e.payload for e in events if e.kind in ("complete", "cancelled", "error")]
        how = f"{ends[-1]['type']} {ends[-1].get('message', '')}".strip() if ends else "no end"
        check.errors.append(
            f"client {client.seat.index}: text differs (upstream reply "
            f"{'logged' if sent_text is not None else 'not logged'}, stored "
            f"{'same' if stored[-1:] == [sent_text] else 'different'}, client "
            f"{'same' if client_tokens == sent_tokens else 'different'}; run: {how}; "
            f"{_first_difference(stored[-1] if stored else '', sent_text or '')})"
        )


def _first_difference(stored: str, sent: str) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(stored, sent, strict=False)) if a != b),
        min(len(stored), len(sent)),
    )
    return (
        f"{len(stored)} vs {len(sent)} chars, first difference at {at}: "
        f"stored {stored[at : at + 30]!r}, sent {sent[at : at + 30]!r}"
    )


# --- one round: a mode and a push interval -------------------------------------------------------


@dataclass
class RoundResult:
    mode: str
    interval: float
    clients: int
    check: Check
    wall: float
    cpu: dict[str, float]  # process name -> CPU seconds during the span
    memory: dict[str, tuple[float, float]]
    client_cpu: float
    profiles: dict[str, str]


def run_round(
    mode: str, interval: float, seats: list[Seat], args, db_env, workdir, upstream
) -> RoundResult:
    from django.db import close_old_connections, connections

    base_url, record, fake = upstream
    tag = secrets.token_hex(3)
    extra = {"LYCEUM_STREAM_PUSH_INTERVAL": str(interval)}
    extra.update(item.split("=", 1) for item in args.set)
    prefix = ""
    if mode == "redis":
        prefix = f"bench-{tag}"
        extra.update(
            REDIS_URL=REDIS_URL,
            LYCEUM_REDIS_PREFIX=prefix,
            LYCEUM_RUNNER="worker",
            LYCEUM_WORKER_CHANNEL=f"bench-runs-{tag}",
        )
    env = server_env(db_env, workdir, **extra)
    chats = new_chats(seats)
    clients = [
        ClientRun(seat, chat, f"bench {tag} client {seat.index}: write {args.tokens} tokens")
        for seat, chat in zip(seats, chats, strict=True)
    ]
    warm = clients.pop()  # the last seat only warms the servers up
    connections.close_all()
    port = free_port()
    daphne_cmd = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"]
    options = ServeOptions(args.profile or args.cprofile, args.conn_max_age, args.cprofile)
    procs = [start_process(f"daphne-{mode}-{interval}", daphne_cmd, env, workdir, options)]
    try:
        if mode == "redis":
            worker_cmd = ["manage.py", "runworker", env["LYCEUM_WORKER_CHANNEL"]]
            for number in range(1, args.workers + 1):
                name = f"worker{number if args.workers > 1 else ''}-{mode}-{interval}"
                procs.append(start_process(name, worker_cmd, env, workdir, options))
        wait_for_port(procs[0], port)
        time.sleep(0.5)
        for proc in procs:
            proc.check_alive()
        watched = {**{p.name.split("-")[0]: p.pid for p in procs}, "fake upstream": fake.pid}
        marks: dict[str, tuple[float, float, dict[str, float]]] = {}

        def mark(name: str) -> None:
            if name == "start":
                for proc in procs:
                    if proc.profile_out is not None:
                        proc.popen.send_signal(signal.SIGUSR2)  # profile the streaming only
            cpu_now = {name: cpu_seconds(pid) for name, pid in watched.items()}
            for proc in procs:  # the event loop's share (the rest: the database thread)
                cpu_now[f"{proc.name.split('-')[0]} main thread"] = cpu_seconds(
                    proc.pid, main_thread=True
                )
            marks[name] = (time.time(), time.process_time(), cpu_now)

        timeout = args.tokens / args.tps + args.ramp + 60
        asyncio.run(drive_clients(clients, warm, port, args.ramp, timeout, mark))
        (begin, client_start, cpu_start), (_, client_end, cpu_end) = marks["start"], marks["end"]
        end = max([c.done_at for c in clients if c.done_at] or [time.time()])
        cpu = {name: cpu_end[name] - cpu_start[name] for name in cpu_start}
        client_cpu = client_end - client_start
        memory = {name: memory_mb(pid) for name, pid in watched.items() if name != "fake upstream"}
        for proc in procs:
            proc.check_alive()
    finally:
        for proc in procs:
            stop_process(proc)
        if prefix:
            _flush_redis(prefix)
    close_old_connections()
    replies, answered = recorded_replies(record, begin)
    check = Check()
    check.extra_requests = answered - len({c.prompt for c in clients} & set(replies))
    for client in clients:
        mismatches = check.text_mismatches
        check_client(client, replies, check)
        if check.text_mismatches > mismatches and args.keep:
            dump = workdir / f"frames-{mode}-{interval}-client{client.seat.index}.txt"
            dump.write_bytes(b"\n\n=====FRAME=====\n".join(p for _t, p in client.frames))
    profiles = {}
    for proc in procs:
        if proc.profile_out and proc.profile_out.exists():
            if proc.profile_out.suffix == ".pstats":
                shutil.copy(proc.profile_out, f"/tmp/{proc.name}.pstats")
                shutil.copy(f"{proc.profile_out}.db", f"/tmp/{proc.name}.db.pstats")
                continue
            profiles[proc.name] = proc.profile_out.read_text()
    return RoundResult(
        mode, interval, len(clients), check, end - begin, cpu, memory, client_cpu, profiles
    )


def _flush_redis(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


# --- the report ---------------------------------------------------------------------------------


def print_mode_table(mode: str, results: list[RoundResult], tokens: int, tps: float) -> None:
    title = {
        "inprocess": "in-process runner, in-memory channel layer, one Daphne",
        "redis": "Redis channel layer, LYCEUM_RUNNER=worker: one Daphne + runworker(s)",
    }[mode]
    clients = results[0].clients
    print(f"\n== {mode}: {title}")
    print(f"   {clients} clients x {tokens} tokens at {tps:g} tokens/s\n")
    header = f"{'':<34}" + "".join(f"{f'push every {r.interval:g} s':>22}" for r in results)
    print(header)
    print("-" * len(header))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:<34}" + "".join(f"{c:>22}" for c in cells))

    def ms(values: list[float], pct: float) -> str:
        return f"{percentile(values, pct):.0f} ms" if values else "-"

    row("clients finished", [f"{r.clients - r.check.unfinished}/{r.clients}" for r in results])
    for pct in (50, 95, 99):
        row(f"token latency p{pct}", [ms(r.check.latencies_ms, pct) for r in results])
    row("token latency max", [ms(r.check.latencies_ms, 100) for r in results])
    row(
        "  once all streams run, p50",
        [ms(r.check.steady_ms, 50) for r in results],
    )
    row(
        "  once all streams run, p95",
        [ms(r.check.steady_ms, 95) for r in results],
    )
    row(
        f"p95 <= {TARGET_P95_MS:g} ms",
        ["yes" if percentile(r.check.latencies_ms, 95) <= TARGET_P95_MS else "NO" for r in results],
    )
    row(
        "  of which first shown in final msg",
        [f"{len(r.check.final_only_ms)} (p50 {ms(r.check.final_only_ms, 50)})" for r in results],
    )
    row("first token after send p50", [ms(r.check.first_token_ms, 50) for r in results])
    row("first token after send p95", [ms(r.check.first_token_ms, 95) for r in results])
    row(
        "tokens shown / sent",
        [f"{r.check.tokens_sent - r.check.tokens_unseen}/{r.check.tokens_sent}" for r in results],
    )
    row("events lost", [str(r.check.events_lost) for r in results])
    row("events duplicated", [str(r.check.events_duplicated) for r in results])
    row("text mismatches", [str(r.check.text_mismatches) for r in results])
    row("extra upstream requests", [str(r.check.extra_requests) for r in results])
    row("wall (first send -> last end)", [f"{r.wall:.1f} s" for r in results])
    for name in results[0].cpu:
        if name.endswith(" main thread"):
            continue
        row(
            f"{name} CPU ms / 1k tokens",
            [f"{r.cpu[name] * 1e6 / max(1, r.check.tokens_sent):.0f}" for r in results],
        )
        row(
            f"{name} CPU % of a core",
            [f"{100 * r.cpu[name] / r.wall:.0f} %" if r.wall else "-" for r in results],
        )
        if f"{name} main thread" in results[0].cpu:
            row(
                "  of which the event loop's thread",
                [
                    f"{100 * r.cpu[f'{name} main thread'] / r.wall:.0f} %" if r.wall else "-"
                    for r in results
                ],
            )
    row(
        "client CPU % of a core",
        [f"{100 * r.client_cpu / r.wall:.0f} %" if r.wall else "-" for r in results],
    )
    for name in results[0].memory:
        row(
            f"{name} RSS / peak",
            [f"{r.memory[name][0]:.0f} / {r.memory[name][1]:.0f} MiB" for r in results],
        )
    for r in results:
        for error in r.check.errors[:5]:
            print(f"  ! push {r.interval:g} s: {error}")
        for name, text in r.profiles.items():
            print(f"\n-- profile of {name} --\n{text}")


# --- a sampling profiler for the server processes (--profile) -------------------------------------

IDLE_FRAMES = {
    ("selectors.py", "select"),
    ("threading.py", "wait"),
    ("threading.py", "_wait_for_tstate_lock"),
    ("queue.py", "get"),
    ("thread.py", "_worker"),
    ("base_events.py", "_run_once"),
}


APP_ROOT = str(ROOT / "chat")
# Frames every busy sample of a thread has (thread and event-loop bootstrap): not informative.
ROOT_FRAMES = (
    "python3.11/threading.py",
    "futures/thread.py",
    "asyncio/base_events.py",
    "asyncio/events.py",
    "internet/asyncioreactor.py",
    "daphne/cli.py",
    "daphne/server.py:100",
    "asgiref/sync.py",
    "channels/db.py",
)


class StackSampler(threading.Thread):
    """Every thread's Python stack every ``interval`` s; waiting threads are not counted."""

    def __init__(self, interval: float = 0.005) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.interval = interval
        self.self_counts: collections.Counter[str] = collections.Counter()
        self.total_counts: collections.Counter[str] = collections.Counter()
        self.thread_counts: collections.Counter[str] = collections.Counter()
        self.chains: collections.Counter[str] = collections.Counter()  # self <- 3 callers
        self.busy = 0
        self.ticks = 0
        self.halt = threading.Event()

    def reset(self) -> None:
        for counter in (self.self_counts, self.total_counts, self.thread_counts, self.chains):
            counter.clear()
        self.busy = self.ticks = 0

    @staticmethod
    def label(code) -> str:
        if code.co_filename.startswith(APP_ROOT):
            short = code.co_filename[len(str(ROOT)) + 1 :]
        else:
            parts = Path(code.co_filename).parts
            short = "/".join(parts[-2:]) if len(parts) > 1 else code.co_filename
        return f"{short}:{code.co_firstlineno}({code.co_name})"

    def run(self) -> None:
        me = threading.get_ident()
        while not self.halt.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            self.ticks += 1
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                if (Path(frame.f_code.co_filename).name, frame.f_code.co_name) in IDLE_FRAMES:
                    continue
                self.busy += 1
                self.thread_counts[names.get(ident, str(ident)).split("_")[0]] += 1
                self.self_counts[self.label(frame.f_code)] += 1
                chain, caller = [], frame
                while caller is not None and len(chain) < 4:
                    chain.append(self.label(caller.f_code))
                    caller = caller.f_back
                self.chains["\n           <- ".join(chain)] += 1
                seen = set()
                while frame is not None:
                    name = self.label(frame.f_code)
                    if name not in seen:
                        seen.add(name)
                        self.total_counts[name] += 1
                    frame = frame.f_back

    def report(self, top: int = 25) -> str:
        busy = max(1, self.busy)
        lines = [
            f"{self.ticks} ticks of {self.interval * 1000:g} ms; busy thread-samples "
            f"{self.busy} ({100 * self.busy / max(1, self.ticks):.0f}% of one thread)",
            "busy samples by thread: "
            + ", ".join(f"{n} {c}" for n, c in self.thread_counts.most_common(6)),
            "",
            f"top {top} by self samples (% of busy):",
        ]
        for name, count in self.self_counts.most_common(top):
            lines.append(f"  {100 * count / busy:5.1f}%  {name}")
        lines += ["", "top 8 self samples with their callers (% of busy):"]
        for chain, count in self.chains.most_common(8):
            lines.append(f"  {100 * count / busy:5.1f}%  {chain}")
        lines += ["", f"top {top} Lyceum functions (chat/) by inclusive samples (% of busy):"]
        app = [(n, c) for n, c in self.total_counts.most_common() if n.startswith("chat/")]
        for name, count in app[:top]:
            lines.append(f"  {100 * count / busy:5.1f}%  {name}")
        lines += ["", f"top {top} library functions by inclusive samples (% of busy):"]
        libraries = [
            (n, c)
            for n, c in self.total_counts.most_common()
            if not n.startswith(("chat/", "bench/")) and not n.startswith(ROOT_FRAMES)
        ]
        for name, count in libraries[:top]:
            lines.append(f"  {100 * count / busy:5.1f}%  {name}")
        return "\n".join(lines)


def serve(options: dict[str, Any], command: list[str]) -> None:
    """Run ``command`` (``-m daphne …`` or ``manage.py …``) in this process.

    ``options["conn_max_age"]`` overrides the database's CONN_MAX_AGE before Django starts
    (an experiment knob: the settings module has no environment variable for it);
    ``options["profile"]`` names a file the sampler's report is written to on SIGUSR1
    (SIGUSR2 clears the samples taken so far)."""
    if options.get("conn_max_age") is not None:
        import importlib

        module = importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"])
        module.DATABASES["default"]["CONN_MAX_AGE"] = options["conn_max_age"]
    if out := options.get("cprofile"):
        import cProfile

        from asgiref.sync import SyncToAsync

        # Thread CPU (time.thread_time), not wall time: a C call that lets the GIL go
        # (a socket send, nh3, an SQLite statement) no longer counts the wait to get it back.
        profiler = cProfile.Profile(time.thread_time)
        # The database thread's (asgiref's single thread).
        db_profiler = cProfile.Profile(time.thread_time)
        db_thread = SyncToAsync.single_thread_executor

        def dump_cprofile(*_: Any) -> None:
            profiler.disable()
            db_thread.submit(db_profiler.disable).result(10)
            profiler.dump_stats(out + ".tmp")
            os.replace(out + ".tmp", out)
            db_profiler.dump_stats(out + ".db")

        def restart(*_: Any) -> None:
            profiler.disable()
            profiler.clear()
            profiler.enable()
            db_thread.submit(
                lambda: (db_profiler.disable(), db_profiler.clear(), db_profiler.enable())
            )

        signal.signal(signal.SIGUSR1, dump_cprofile)
        signal.signal(signal.SIGUSR2, restart)
        profiler.enable()
    elif out := options.get("profile"):
        sampler = StackSampler()

        def dump(*_: Any) -> None:
            sampler.halt.set()
            Path(out + ".tmp").write_text(sampler.report())
            os.replace(out + ".tmp", out)

        signal.signal(signal.SIGUSR1, dump)
        signal.signal(signal.SIGUSR2, lambda *_: sampler.reset())
        sampler.start()
    if command[:2] == ["-m", "daphne"]:
        from daphne.cli import CommandLineInterface

        CommandLineInterface().run(command[2:])
    else:
        from django.core.management import execute_from_command_line

        execute_from_command_line(command)


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str]) -> None:
    if argv[:1] == ["--serve"]:
        serve(json.loads(argv[1]), argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100, help="concurrent streams (100)")
    parser.add_argument("--tokens", type=int, default=300, help="tokens per reply (300)")
    parser.add_argument("--tps", type=float, default=30.0, help="tokens per second (30)")
    parser.add_argument(
        "--intervals", default="0.1", help="push intervals to compare, e.g. 0.1,0.2 (0.1)"
    )
    parser.add_argument(
        "--reply",
        choices=("markdown", "plain"),
        default="markdown",
        help="markdown: paragraphs, lists, bold and code words; plain: one long paragraph",
    )
    parser.add_argument("--modes", default="inprocess,redis", help="inprocess,redis")
    parser.add_argument("--ramp", type=float, default=1.0, help="spread the sends over N s (1)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument("--workers", type=int, default=1, help="runworker processes (1)")
    parser.add_argument("--profile", action="store_true", help="sample the server processes")
    parser.add_argument(
        "--cprofile",
        action="store_true",
        help="cProfile the servers' main and database threads; pstats files go to /tmp",
    )
    parser.add_argument(
        "--conn-max-age",
        type=float,
        default=None,
        help="experiment: run the servers with this CONN_MAX_AGE (default: the settings')",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the servers, e.g. LYCEUM_CHECKPOINT_INTERVAL=5",
    )
    args = parser.parse_args(argv)
    intervals = [float(x) for x in args.intervals.split(",") if x.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in ("inprocess", "redis"):
            parser.error(f"unknown mode {mode!r}")

    workdir = Path(tempfile.mkdtemp(prefix="lyceum-bench-streams-"))
    try:
        with temporary_database(workdir, args.postgres) as db_env:
            setup_django(server_env(db_env, workdir))
            with fake_upstream(workdir, args.tokens, args.tps, args.reply) as upstream:
                seats = create_seats(args.clients + 1, upstream[0])
                database = "PostgreSQL" if args.postgres else "SQLite"
                print(
                    f"bench_streams: {args.clients} clients, {args.tokens} tokens at "
                    f"{args.tps:g}/s ({args.reply}), ramp {args.ramp:g} s, {database}, "
                    f"{os.cpu_count()} CPUs, "
                    f"load {os.getloadavg()[0]:.2f}"
                    + (
                        f", servers with CONN_MAX_AGE={args.conn_max_age:g}"
                        if args.conn_max_age is not None
                        else ""
                    )
                )
                for mode in modes:
                    results = []
                    for interval in intervals:
                        results.append(
                            run_round(mode, interval, seats, args, db_env, workdir, upstream)
                        )
                    print_mode_table(mode, results, args.tokens, args.tps)
    finally:
        if args.keep:
            print(f"\nwork directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
