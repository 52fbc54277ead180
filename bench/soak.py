"""A fault soak: Lyceum as in production, under load, through faults; then nothing may be lost.

Run: ``.venv/bin/python bench/soak.py [--minutes 10] [--clients 50] [--seed 1] [--keep]``
(from the repository root; ``--help`` lists every option; loopback only).

What runs (everything on 127.0.0.1, started here and stopped on exit, Ctrl-C included):

* a temporary PostgreSQL database (dropped afterwards) and a Redis server of its own on a
  free port (``redis-server --save '' --appendonly no``, a child of this script), so it can
  be restarted without disturbing anyone;
* two Daphne processes and two ``manage.py runworker`` processes (``LYCEUM_RUNNER=worker``):
  no sticky sessions, every (re)connection and API request goes to either Daphne;
* a fake OpenAI upstream (``tests.fakeopenai`` in a subprocess) whose replies are paced
  tokens ``q<request>w<index>`` (each token names the upstream request it came from) and
  which fails a share of requests: HTTP 500, 429 with ``Retry-After``, a stall (before the
  headers, or mid-stream beyond the idle timeout) or a dropped connection (before the
  first token, or mid-stream);
* N clients in this process, chatting at once until the time is up: two thirds are pages
  (the chat WebSocket, as htmx drives it: ``resync`` then ``send``), one third are API
  scripts (``POST /api/v1/chat/stream``, SSE). A fifth of the chats use an agent whose
  tool asks for approval: the client approves or denies, and now and then answers twice at
  once, the other way round, through the API of the other Daphne.

Faults, during the soak: a worker killed with ``kill -9`` every minute (and started again),
Redis restarted once (halfway), a third of the sockets dropped and reconnected at random
times (resync from the page's last ``seq``), half the API streams of a third of the API
clients cut off and resumed with ``Last-Event-ID`` on the other Daphne.

Then, from the database and from every client's frames, it counts (the figure to reach is
zero on each):

* runs without exactly one terminal state (the run's status, and exactly one terminal
  event of the matching type);
* runs stuck (still running or waiting after the drain) and messages never answered
  (a ``QueuedInput`` never taken);
* replies differing from the stored one: tokens a client saw that the database does not
  hold (an interrupted reply may lose at most the text of one push interval, see
  ``--allowance``), stored tokens out of order, a completed reply shorter than what the
  upstream sent, a page's written message differing from the stored one;
* events lost, duplicated or out of order, per client after every resync: for a page
  the ``#seq-marker`` must only grow and end at the chat's last seq, and every item
  (``data-seq``) the database holds must have arrived once, in order; for an API client
  every event of its run (by seq) once, in order, and each reply's tokens once, in order;
* approvals decided twice (two ``approval_decided`` events, or the tool run twice, or
  the upstream asked twice to continue after one call, or a decision event that differs
  from the stored decision);
* pages that did not receive their run's terminal while connected (noticed when the
  database had the terminal for 20 s and the page did not: the page then resyncs, as a
  reload would) and runs whose terminal a page or API client never got.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for entry in (str(ROOT), str(ROOT / "bench")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from bench_streams import (  # noqa: E402 - after the path set-up
    ITEM_RE,
    MARKER_RE,
    MODEL_ALIAS,
    MiniWebSocket,
    Proc,
    _frame,
    create_seats,
    free_port,
    server_env,
    setup_django,
    start_process,
    stop_process,
    temporary_database,
    wait_for_port,
)

TOKEN_RE = re.compile(rb"q(\d+)w(\d+)")
TOKEN_TEXT_RE = re.compile(r"q(\d+)w(\d+)")
TERMINAL_ITEM_RE = re.compile(
    rb'class="msg (?:usage|error-box|system stopped)" id="ev-\d+" data-seq="(\d+)"'
)
REPLY_ITEM_RE = re.compile(rb'<article class="msg assistant[^"]*" id="ev-\d+" data-seq="(\d+)"')
STREAM_RE = re.compile(rb'id="stream"')
APPROVE_RE = re.compile(rb'value="approve"><input type="hidden" name="call_id" value="([^"]+)"')
TERMINAL_TYPES = {"complete", "cancelled", "error"}
STATUS_OF = {
    "complete": {"completed"},
    "cancelled": {"cancelled"},
    "error": {"failed", "interrupted"},
}
APPROVER_SLUG = "soak-approver"
TOOL_MARK = "[tool]"
FAULTS = ("500", "429", "stall", "drop")


def now() -> float:
    return time.monotonic()


# --- the fake upstream with faults (a subprocess: ``soak.py --upstream CONFIG``) -------------


def upstream_main(config: dict[str, Any]) -> None:
    """Serve the fake OpenAI API with the soak's replies and faults; log every request."""
    import threading

    from tests.fakeopenai import FakeOpenAI, FakeToolCall, RecordedRequest, Script

    rng = random.Random(config["seed"])
    log = open(config["log"], "a", encoding="utf-8")  # noqa: SIM115 - closed at exit
    lock = threading.Lock()
    counter = 0
    delay = 1.0 / config["tps"]

    def write(entry: dict[str, Any]) -> None:
        log.write(json.dumps(entry) + "\n")
        log.flush()

    def answer(request: RecordedRequest) -> Script:
        nonlocal counter
        with lock:
            counter += 1
            number = counter
            roll, pick, where = rng.random(), rng.choice(FAULTS), rng.random()
        body = request.json if isinstance(request.json, dict) else {}
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        after_tool = last.get("tool_call_id") if last.get("role") == "tool" else None
        prompt = request.last_user_text()
        tool_call = TOOL_MARK in prompt and after_tool is None
        fault = pick if roll < config["fault_share"] else ""
        tokens = [f"q{number}w{i} " for i in range(config["tokens"])]
        if tool_call:
            script = Script(
                text="",
                tool_calls=[
                    FakeToolCall("calculator", '{"expression": "6*7"}', id=f"call_q{number}")
                ],
            )
        else:
            script = Script(tokens=tokens, token_delay=delay)
        if fault == "500":
            script = Script(status=500)
        elif fault == "429":
            script = Script(status=429, headers={"Retry-After": "1"})
        elif fault == "stall" and (tool_call or where < 0.5):
            script.headers_delay = config["stall"]  # beyond the first-byte timeout
        elif fault == "stall":
            script.fault_after = max(1, int(where * len(tokens)))
            script.stall = config["stall"]  # beyond the idle timeout: the reply fails
        elif fault == "drop" and (tool_call or where < 0.5):
            script.fault_after, script.drop = 0, True
        elif fault == "drop":
            script.fault_after, script.drop = max(1, int(where * len(tokens))), True
        write(
            {
                "n": number,
                "prompt": prompt,
                "after_tool": after_tool,
                "tool_call": tool_call,
                "fault": fault,
                "tokens": 0 if tool_call else len(tokens),
            }
        )
        return script

    def finished(reply: Any) -> None:
        found = TOKEN_TEXT_RE.search(reply.text)
        if found:
            write({"done": int(found.group(1)), "text": reply.text})

    server = FakeOpenAI(port=0)
    server.respond_with(answer)
    server.on_reply = finished
    server.start()
    print(f"READY {server.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait()
    server.stop()
    log.close()


# --- the processes ------------------------------------------------------------------------------


@dataclass
class Cluster:
    """PostgreSQL (via the environment), Redis, 2 Daphnes, 2 workers and the upstream."""

    workdir: Path
    env: dict[str, str]
    redis_port: int
    ports: list[int]
    channel: str
    daphnes: list[Proc] = field(default_factory=list)
    workers: list[Proc | None] = field(default_factory=list)
    retired: list[Proc] = field(default_factory=list)
    redis: subprocess.Popen | None = None
    upstream: Proc | None = None
    kills: int = 0
    redis_restarts: int = 0
    worker_starts: int = 0

    def start_redis(self) -> None:
        log = (self.workdir / "redis.log").open("ab")
        command = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        command += ["--dir", str(self.workdir)]
        self.redis = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = now() + 15
        while now() < deadline:
            if self.redis.poll() is not None:
                raise RuntimeError("redis-server exited at start; see redis.log")
            if self._redis_up():
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on {self.redis_port}")

    def _redis_up(self) -> bool:
        import redis

        client = redis.Redis(port=self.redis_port, socket_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop_redis(self) -> None:
        if self.redis is not None and self.redis.poll() is None:
            self.redis.terminate()
            try:
                self.redis.wait(10)
            except subprocess.TimeoutExpired:
                self.redis.kill()
                self.redis.wait(5)
        self.redis = None

    def start_worker(self, slot: int) -> None:
        self.worker_starts += 1
        command = ["manage.py", "runworker", self.channel]
        proc = start_process(f"worker{slot + 1}", command, self.env, self.workdir)
        while len(self.workers) <= slot:
            self.workers.append(None)
        self.workers[slot] = proc

    def kill_worker(self, slot: int) -> None:
        """``kill -9`` the worker in ``slot`` (its process only) and start another."""
        proc = self.workers[slot]
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait(10)
            self.retired.append(proc)
            self.kills += 1
        self.start_worker(slot)

    def start_servers(self) -> None:
        for number, port in enumerate(self.ports, 1):
            command = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
            command.append("chatsite.asgi:application")
            self.daphnes.append(start_process(f"daphne{number}", command, self.env, self.workdir))
        for slot in range(2):
            self.start_worker(slot)
        for proc, port in zip(self.daphnes, self.ports, strict=True):
            wait_for_port(proc, port, timeout=60)

    def stop_all(self) -> None:
        for proc in [*self.daphnes, *(w for w in self.workers if w is not None)]:
            with contextlib.suppress(Exception):
                stop_process(proc)
        if self.upstream is not None:
            with contextlib.suppress(Exception):
                stop_process(self.upstream)
        self.stop_redis()

    def process_problems(self) -> list[str]:
        """Servers that exited on their own (a killed worker is not one)."""
        out = []
        for proc in [*self.daphnes, *(w for w in self.workers if w is not None)]:
            if proc.popen.poll() is not None:
                out.append(f"{proc.name} exited by itself (rc {proc.popen.returncode})")
        return out


def start_upstream(workdir: Path, args: argparse.Namespace) -> tuple[str, Proc]:
    config = {
        "seed": args.seed,
        "log": str(workdir / "upstream.jsonl"),
        "tps": args.tps,
        "tokens": args.tokens,
        "fault_share": args.fault_share,
        "stall": args.stall,
    }
    command = [sys.executable, __file__, "--upstream", json.dumps(config)]
    log = (workdir / "upstream.log").open("ab")
    popen = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    log.close()
    proc = Proc("upstream", popen, workdir / "upstream.log")
    assert popen.stdout is not None
    line = popen.stdout.readline().split()
    if len(line) != 2 or line[0] != "READY":
        stop_process(proc)
        raise RuntimeError(f"the fake upstream did not start: {line!r}")
    return f"http://127.0.0.1:{line[1]}/v1", proc


# --- the clients ----------------------------------------------------------------------------------


@dataclass
class Tally:
    """What happened during the soak (not the findings: those come from the checks)."""

    sent: int = 0
    resent: int = 0
    socket_drops: int = 0
    reconnects: int = 0
    connect_failures: int = 0
    api_drops: int = 0
    api_resumes: int = 0
    api_refused: collections.Counter = field(default_factory=collections.Counter)
    decisions: int = 0
    double_decisions: int = 0
    notices: collections.Counter = field(default_factory=collections.Counter)
    missed_terminal: int = 0  # pages that had to resync to learn their run's end
    gave_up: int = 0  # messages whose end a client stopped waiting for


@dataclass
class Soak:
    ports: list[int]
    deadline: float
    rng: random.Random
    tally: Tally
    wait_limit: float


_DB_THREAD = ThreadPoolExecutor(1, thread_name_prefix="soak-db")


def db(fn, *args: Any) -> Any:
    """Run an ORM function off the event loop, on one thread: one database connection
    (the PostgreSQL server may be shared, and its connections are few)."""
    return asyncio.get_running_loop().run_in_executor(_DB_THREAD, _db_call, fn, *args)


def _db_call(fn, *args: Any) -> Any:
    from django.db import close_old_connections

    close_old_connections()
    return fn(*args)


def _input_stored(chat_id: str, client_id: str) -> bool:
    from chat.models import QueuedInput

    return QueuedInput.objects.filter(chat_id=chat_id, client_id=client_id).exists()


def _run_end(chat_id: str, client_id: str) -> tuple[int, float] | None:
    """(terminal seq, seconds since it was written) of the run that took this message."""
    from django.utils import timezone

    from chat import store
    from chat.models import QueuedInput, Run

    taken = QueuedInput.objects.filter(chat_id=chat_id, client_id=client_id).first()
    if taken is None or taken.run_id is None:
        return None
    run = Run.objects.filter(pk=taken.run_id).first()
    if run is None or run.is_live or run.finished_at is None:
        return None
    ends = store.run_events(chat_id, str(run.pk), TERMINAL_TYPES)
    if not ends:
        return None
    return ends[0].seq, (timezone.now() - run.finished_at).total_seconds()


@dataclass
class Page:
    """A browser page on one chat: one socket at a time, resync from its seq marker."""

    index: int
    session_key: str
    api_key: str
    chat_id: str
    approvals: bool
    frames: list[bytes] = field(default_factory=list)
    covered: int = 0
    terminals: set[int] = field(default_factory=set)
    decided: set[str] = field(default_factory=set)
    sock: MiniWebSocket | None = None
    reader: asyncio.Task | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    drop_at: list[float] = field(default_factory=list)
    sent_cover: int = 0  # the seq marker when the last message was sent
    missed: list[int] = field(default_factory=list)  # terminals the page had to resync for

    def on_frame(self, payload: bytes) -> None:
        self.frames.append(payload)
        for seq in TERMINAL_ITEM_RE.findall(payload):
            self.terminals.add(int(seq))
        for marker in MARKER_RE.findall(payload):
            self.covered = max(self.covered, int(marker))
        self.arrived.set()

    async def connect(self, soak: Soak) -> None:
        for attempt in range(30):
            port = soak.rng.choice(soak.ports)
            headers = {
                "Origin": f"http://127.0.0.1:{port}",
                "Cookie": f"sessionid={self.session_key}",
            }
            try:
                sock = await asyncio.wait_for(
                    MiniWebSocket.connect(port, f"/ws/chat/{self.chat_id}/", headers), 10
                )
                break
            except (OSError, ConnectionError, TimeoutError, asyncio.IncompleteReadError):
                soak.tally.connect_failures += 1
                await asyncio.sleep(min(5, 0.5 * (attempt + 1)))
        else:
            raise RuntimeError(f"page {self.index}: could not connect")
        self.sock, self.closed = sock, asyncio.Event()
        self.reader = asyncio.create_task(self._read(sock, self.closed))
        sock.send_text(_frame(action="resync", last_seq=self.covered))

    async def _read(self, sock: MiniWebSocket, closed: asyncio.Event) -> None:
        try:
            while (payload := await sock.receive()) is not None:
                self.on_frame(payload)
        finally:
            closed.set()
            self.arrived.set()

    def drop(self) -> None:
        """The network goes away under the page: no close frame."""
        if self.sock is not None:
            self.sock.closed = True
            self.sock.writer.transport.abort()

    async def ensure_connected(self, soak: Soak) -> None:
        if self.sock is None or self.closed.is_set():
            if self.sock is not None:
                soak.tally.reconnects += 1
            await self.connect(soak)

    def send(self, **fields: Any) -> None:
        assert self.sock is not None
        if fields.get("action") == "send":
            self.sent_cover = self.covered
        self.sock.send_text(_frame(**fields))

    async def close(self) -> None:
        if self.sock is not None and not self.closed.is_set():
            self.sock.start_close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.closed.wait(), 5)
            self.sock.writer.close()


async def page_client(page: Page, soak: Soak, think: tuple[float, float]) -> None:
    rng = random.Random(soak.rng.random())
    await page.connect(soak)
    number = 0
    while now() < soak.deadline:
        number += 1
        tool = page.approvals and rng.random() < 0.6
        prompt = f"soak page {page.index} message {number}" + (f" {TOOL_MARK}" if tool else "")
        client_id = secrets.token_hex(8)
        await page.ensure_connected(soak)
        page.send(action="send", message=prompt, client_id=client_id)
        soak.tally.sent += 1
        await _wait_stored(page, soak, prompt, client_id)
        await _wait_end(page, soak, rng, client_id)
        await asyncio.sleep(rng.uniform(*think))


async def _wait_stored(page: Page, soak: Soak, prompt: str, client_id: str) -> None:
    """A send lost with the socket (or refused during an outage) is sent again, same id."""
    for _ in range(20):
        await asyncio.sleep(1.5)
        if await db(_input_stored, page.chat_id, client_id):
            return
        await page.ensure_connected(soak)
        page.send(action="send", message=prompt, client_id=client_id)
        soak.tally.resent += 1


async def _wait_end(page: Page, soak: Soak, rng: random.Random, client_id: str) -> None:
    """Until the page has its run's terminal item: answer approvals, survive drops."""
    started = now()
    checked = now()
    while True:
        if now() - checked > 5:
            checked = now()
            end = await db(_run_end, page.chat_id, client_id)
            if end is not None:
                seq, age = end
                if seq in page.terminals or page.covered >= seq:
                    return
                if age > 20:
                    # The database has had the end for 20 s and the page has not: reload.
                    soak.tally.missed_terminal += 1
                    page.missed.append(seq)
                    await page.ensure_connected(soak)
                    page.send(action="resync", last_seq=page.covered)
        if now() - started > soak.wait_limit:
            soak.tally.gave_up += 1
            return
        if page.drop_at and now() >= page.drop_at[0]:
            page.drop_at.pop(0)
            soak.tally.socket_drops += 1
            page.drop()
            await asyncio.sleep(rng.uniform(0, 2))
        await page.ensure_connected(soak)
        for call_id in _pending_calls(page):
            page.decided.add(call_id)
            await _decide_on_page(page, soak, rng, call_id)
        if any(seq > page.sent_cover for seq in page.terminals):
            return
        page.arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(page.arrived.wait(), 1.0)


def _pending_calls(page: Page) -> list[str]:
    calls = []
    for payload in page.frames[-40:]:
        for raw in APPROVE_RE.findall(payload):
            call_id = raw.decode()
            if call_id not in page.decided and call_id not in calls:
                calls.append(call_id)
    return calls


async def _decide_on_page(page: Page, soak: Soak, rng: random.Random, call_id: str) -> None:
    approve = rng.random() < 0.7
    soak.tally.decisions += 1
    if approve:
        page.send(action="approve", call_id=call_id)
    else:
        page.send(action="deny", call_id=call_id, reason="soak says no")
    if rng.random() < 0.4:
        # The same call answered the other way at once, through the API of either Daphne.
        soak.tally.double_decisions += 1
        await _api_decide(soak, page.api_key, page.chat_id, call_id, not approve)


async def _api_decide(soak: Soak, key: str, chat_id: str, call_id: str, approve: bool) -> None:
    import httpx

    body = {"decision": "approve" if approve else "deny"}
    # A decision is idempotent: a client tries again after a server error, as a person
    # would click again.
    for _attempt in range(5):
        port = soak.rng.choice(soak.ports)
        url = f"http://127.0.0.1:{port}/api/v1/chat/{chat_id}/approvals/{call_id}"
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                response = await http.post(
                    url, json=body, headers={"Authorization": f"Bearer {key}"}
                )
            if response.status_code < 500:
                if response.status_code != 200:
                    soak.tally.api_refused[f"approval {response.status_code}"] += 1
                return
            soak.tally.api_refused[f"approval {response.status_code}"] += 1
        except httpx.HTTPError as exc:
            soak.tally.api_refused[f"approval {type(exc).__name__}"] += 1
        await asyncio.sleep(1)


@dataclass
class ApiRun:
    prompt: str
    chat_id: str = ""
    run_id: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)
    resumes: int = 0
    terminal: int = 0
    last_id: str = "0"  # the id of the last event seen (Last-Event-ID on a resume)
    stream_errors: int = 0  # "event: error" (the server's side of a stream failed)


@dataclass
class ApiClient:
    index: int
    api_key: str
    approvals: bool
    dropper: bool
    chat_id: str = ""
    runs: list[ApiRun] = field(default_factory=list)


class StreamCut(Exception):
    """The client cut its own stream (a planned drop)."""


async def api_client(client: ApiClient, soak: Soak, think: tuple[float, float]) -> None:
    import httpx

    rng = random.Random(soak.rng.random())
    headers = {"Authorization": f"Bearer {client.api_key}"}
    number = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=60)) as http:
        while now() < soak.deadline:
            number += 1
            tool = client.approvals and rng.random() < 0.6
            prompt = f"soak api {client.index} message {number}" + (f" {TOOL_MARK}" if tool else "")
            run = ApiRun(prompt)
            client.runs.append(run)
            soak.tally.sent += 1
            body: dict[str, Any] = {"message": prompt, "model": MODEL_ALIAS}
            if client.chat_id:
                body["session_id"] = client.chat_id
            elif client.approvals:
                body["agent"] = APPROVER_SLUG
            cut = client.dropper and rng.random() < 0.5
            started = now()
            attempt = 0
            while not run.terminal and now() - started < soak.wait_limit:
                attempt += 1
                port = rng.choice(soak.ports)
                try:
                    if not run.run_id:
                        url = f"http://127.0.0.1:{port}/api/v1/chat/stream"
                        request = http.stream("POST", url, json=body, headers=headers)
                    else:
                        url = (
                            f"http://127.0.0.1:{port}/api/v1/chat/{run.chat_id}"
                            f"/runs/{run.run_id}/stream"
                        )
                        resume = {**headers, "Last-Event-ID": run.last_id}
                        request = http.stream("GET", url, headers=resume)
                        run.resumes += 1
                        soak.tally.api_resumes += 1
                    async with request as response:
                        if response.status_code != 200:
                            text = (await response.aread()).decode(errors="replace")[:120]
                            soak.tally.api_refused[f"{response.status_code} {text}"] += 1
                            if run.run_id == "" and response.status_code < 500:
                                break  # refused for good: nothing was sent
                            await asyncio.sleep(2)
                            continue
                        client.chat_id = response.headers.get("X-Lyceum-Session", client.chat_id)
                        run.chat_id = client.chat_id
                        cut_after = rng.randint(2, 12) if cut else -1
                        await _read_sse(client, run, response, soak, rng, cut_after)
                        cut = False
                    if not run.terminal:
                        await asyncio.sleep(1)  # the stream broke off: resume in a moment
                except StreamCut:
                    soak.tally.api_drops += 1
                    cut = False
                    await asyncio.sleep(rng.uniform(0, 2))
                except (httpx.HTTPError, OSError) as exc:
                    soak.tally.api_refused[f"stream {type(exc).__name__}"] += 1
                    if not run.run_id:
                        # The POST failed before the run was known: try the message again.
                        await asyncio.sleep(2)
                    else:
                        await asyncio.sleep(1)
            if not run.terminal:
                soak.tally.gave_up += 1
            await asyncio.sleep(rng.uniform(*think))


async def _read_sse(
    client: ApiClient, run: ApiRun, response, soak: Soak, rng: random.Random, cut_after: int
) -> None:
    event_id, data = "", []
    seen = 0
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line.startswith(": session "):
            client.chat_id = run.chat_id = line[len(": session ") :].strip()
        elif line == "" and data:
            event = json.loads("\n".join(data))
            data = []
            if "type" not in event or event.get("type") == "stream_error":
                # The server's side broke off; it names the run to resume.
                run.stream_errors += 1
                run.run_id = run.run_id or event.get("run_id") or ""
                continue
            run.events.append(event)
            if event_id:
                run.last_id = event_id
            run.run_id = run.run_id or event.get("run_id") or ""
            seen += 1
            if event["type"] == "approval_required":
                await _api_answer(client, run, soak, rng, event["call_id"])
            if event["type"] in TERMINAL_TYPES:
                run.terminal += 1
                return
            if seen == cut_after and run.run_id:
                raise StreamCut


async def _api_answer(
    client: ApiClient, run: ApiRun, soak: Soak, rng: random.Random, call_id: str
) -> None:
    approve = rng.random() < 0.7
    soak.tally.decisions += 1
    tasks = [_api_decide(soak, client.api_key, run.chat_id, call_id, approve)]
    if rng.random() < 0.4:
        soak.tally.double_decisions += 1
        tasks.append(_api_decide(soak, client.api_key, run.chat_id, call_id, not approve))
    await asyncio.gather(*tasks)


# --- the chaos ------------------------------------------------------------------------------------


async def chaos(cluster: Cluster, soak: Soak, duration: float, log: list[str]) -> None:
    """A worker killed every minute (from 20 s in); Redis restarted once, halfway."""
    start = now()
    redis_at = duration / 2 + 5
    next_kill, slot = 20.0, 0
    while now() < soak.deadline:
        elapsed = now() - start
        if cluster.redis_restarts == 0 and elapsed >= redis_at:
            log.append(f"{elapsed:5.0f} s  Redis restarted (down 3 s)")
            await asyncio.to_thread(cluster.stop_redis)
            await asyncio.sleep(3)
            await asyncio.to_thread(cluster.start_redis)
            cluster.redis_restarts += 1
        if elapsed >= next_kill:
            log.append(f"{elapsed:5.0f} s  worker{slot + 1} killed with SIGKILL and started again")
            await asyncio.to_thread(cluster.kill_worker, slot)
            slot = 1 - slot
            next_kill += 60
        for problem in cluster.process_problems():
            log.append(f"{elapsed:5.0f} s  {problem}")
            raise RuntimeError(problem)
        await asyncio.sleep(0.5)


async def drive(
    cluster: Cluster,
    pages: list[Page],
    apis: list[ApiClient],
    args: argparse.Namespace,
    log: list[str],
) -> Tally:
    duration = args.minutes * 60
    tally = Tally()
    soak = Soak(cluster.ports, now() + duration, random.Random(args.seed), tally, args.wait_limit)
    think = (args.think_min, args.think_max)
    tasks = []
    for number, page in enumerate(pages):
        tasks.append(_staggered(number * 0.1, page_client(page, soak, think)))
    for number, client in enumerate(apis):
        tasks.append(_staggered(number * 0.1 + 0.05, api_client(client, soak, think)))
    chaos_task = asyncio.create_task(chaos(cluster, soak, duration, log))
    clients = asyncio.gather(*tasks)
    try:
        await asyncio.wait({chaos_task, clients}, return_when=asyncio.FIRST_EXCEPTION)
        if chaos_task.done() and chaos_task.exception():
            raise chaos_task.exception()  # type: ignore[misc]
        await clients
    finally:
        chaos_task.cancel()
        clients.cancel()
        await asyncio.gather(chaos_task, clients, return_exceptions=True)
        await asyncio.sleep(3)  # the last pushes
        await asyncio.gather(*(p.close() for p in pages), return_exceptions=True)
    return tally


async def _staggered(delay: float, coro) -> None:
    await asyncio.sleep(delay)
    await coro


# --- the checks -----------------------------------------------------------------------------------


@dataclass
class Findings:
    runs: collections.Counter = field(default_factory=collections.Counter)
    terminal_wrong: int = 0
    stuck: int = 0
    unanswered: int = 0
    reply_mismatch: int = 0
    over_allowance: int = 0
    over_checkpoint: int = 0  # beyond one checkpoint interval (and one push interval)
    worst_loss: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    decided_twice: int = 0
    missed_terminal: int = 0
    approvals: collections.Counter = field(default_factory=collections.Counter)
    upstream: collections.Counter = field(default_factory=collections.Counter)
    notes: list[str] = field(default_factory=list)
    loss_notes: list[str] = field(default_factory=list)  # printed after the others

    def note(self, text: str, *, loss: bool = False) -> None:
        notes = self.loss_notes if loss else self.notes
        if len(notes) < 40:
            notes.append(text)


def _tokens_by_request(raw: bytes | str) -> dict[int, list[int]]:
    found = TOKEN_RE.findall(raw) if isinstance(raw, bytes) else TOKEN_TEXT_RE.findall(raw)
    out: dict[int, list[int]] = collections.defaultdict(list)
    for request, index in found:
        out[int(request)].append(int(index))
    return out


def read_upstream(path: Path) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    requests, done = {}, {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            if "n" in entry:
                requests[entry["n"]] = entry
            else:
                done[entry["done"]] = entry["text"]
    return requests, done


def wait_for_quiet(limit: float) -> int:
    """Wait (up to ``limit`` s) until no run is live; the number still live."""
    from chat.models import Run

    deadline = now() + limit
    while True:
        live = Run.objects.filter(status__in=[Run.Status.RUNNING, Run.Status.WAITING]).count()
        if not live or now() > deadline:
            return live
        time.sleep(1)


def check_database(findings: Findings, requests: dict, done: dict) -> None:
    from chat import store
    from chat.models import QueuedInput, Run, ToolApproval

    for run in Run.objects.all():
        findings.runs[run.status] += 1
        if run.is_live:
            findings.stuck += 1
            findings.note(f"run {run.pk} still {run.status}")
            continue
        ends = store.run_events(run.chat_id, str(run.pk), TERMINAL_TYPES)
        right = len(ends) == 1 and run.status in STATUS_OF[ends[0].kind]
        if right and ends[0].kind == "error":
            right = ends[0].payload.get("status", "failed") == run.status
        if not right:
            findings.terminal_wrong += 1
            kinds = [e.kind for e in ends]
            findings.note(f"run {run.pk} {run.status} with terminal events {kinds}")
    for queued in QueuedInput.objects.filter(consumed=False):
        findings.unanswered += 1
        findings.note(f"message {queued.client_id} in chat {queued.chat_id} never taken")
    # Approvals: one decision each, the tool run at most once, one continuation upstream.
    continued = collections.Counter(
        r["after_tool"] for n, r in requests.items() if r.get("after_tool") and n in done
    )
    for approval in ToolApproval.objects.all():
        findings.approvals[approval.status] += 1
        events = store.display_events_after(approval.chat_id, 0)
        mine = [e for e in events if e.payload.get("call_id") == approval.call_id]
        decided = [e for e in mine if e.kind == "approval_decided"]
        runs_of_tool = [
            e for e in mine if e.kind == "tool_end" and e.payload.get("status") == "done"
        ]
        twice = len(decided) > 1 or len(runs_of_tool) > 1 or continued[approval.call_id] > 1
        if decided and approval.status in ("approved", "denied"):
            twice |= decided[0].payload.get("decision") != approval.status
        if twice:
            findings.decided_twice += 1
            findings.note(
                f"approval {approval.call_id}: {len(decided)} decisions "
                f"{[e.payload.get('decision') for e in decided]}, row {approval.status}, "
                f"tool ran {len(runs_of_tool)}x, continued {continued[approval.call_id]}x"
            )


def stored_tokens(chat_id: str) -> tuple[dict[int, list[int]], dict[int, str]]:
    """Tokens of every stored assistant message of a chat, by upstream request; and how
    the run that wrote each request's tokens ended."""
    from chat import store
    from chat.models import Run

    events = store.display_events_after(chat_id, 0)
    tokens: dict[int, list[int]] = collections.defaultdict(list)
    owner: dict[int, str] = {}
    status = dict(Run.objects.filter(chat_id=chat_id).values_list("pk", "status"))
    status = {str(k): v for k, v in status.items()}
    for event in events:
        payload = event.payload
        if event.kind == "msg" and payload.get("role") == "assistant":
            for request, indexes in _tokens_by_request(payload.get("content") or "").items():
                tokens[request] += indexes
                run_id = (payload.get("extra") or {}).get("run_id")
                owner[request] = status.get(str(run_id), "") if run_id else "interrupted?"
    return tokens, owner


def compare_tokens(
    findings: Findings,
    who: str,
    seen: dict[int, int],
    stored: dict[int, list[int]],
    owner: dict[int, str],
    requests: dict,
    done: dict,
    allowance: tuple[int, int],
) -> None:
    """What a client saw of each upstream reply against what the database holds.

    ``allowance``: the tokens an interrupted reply may lose, by the issue's measure (one
    push interval) and by the design's (a process killed loses what it streamed since
    its last checkpoint, ``LYCEUM_CHECKPOINT_INTERVAL``)."""
    for request, indexes in stored.items():
        if indexes != list(range(len(indexes))):
            findings.reply_mismatch += 1
            findings.note(f"{who}: stored tokens of q{request} out of order or doubled")
        complete = owner.get(request) == "completed" and request in done
        if complete and len(indexes) != len(TOKEN_TEXT_RE.findall(done[request])):
            findings.reply_mismatch += 1
            findings.note(f"{who}: completed reply q{request} stored {len(indexes)} tokens")
    for request, count in seen.items():
        kept = len(stored.get(request, []))
        if count <= kept:
            continue
        loss = count - kept
        findings.worst_loss = max(findings.worst_loss, loss)
        if owner.get(request) == "completed" or loss > allowance[1]:
            findings.over_checkpoint += 1
        if owner.get(request) == "completed" or loss > allowance[0]:
            findings.over_allowance += 1
            findings.note(
                f"{who}: saw {count} tokens of q{request}, {kept} stored "
                f"(run {owner.get(request) or 'has none stored'})",
                loss=True,
            )


def check_page(
    findings: Findings, page: Page, requests: dict, done: dict, allowance: tuple[int, int]
) -> None:
    from chat import store
    from chat.models import Run
    from chat.presentation import display

    events = store.display_events_after(page.chat_id, 0)
    last_seq = events[-1].seq if events else 0
    items = [e.seq for e in events if display.item_from_event(e) is not None]
    covered = 0
    received: collections.Counter[int] = collections.Counter()
    order_top = 0
    seen: dict[int, int] = {}
    written: dict[int, bytes] = {}
    for payload in page.frames:
        for _dom, seq in ITEM_RE.findall(payload):
            seq = int(seq)
            received[seq] += 1
            if seq < order_top and received[seq] == 1:
                findings.out_of_order += 1
                findings.note(f"page {page.index}: item {seq} after {order_top}")
            order_top = max(order_top, seq)
        for marker in MARKER_RE.findall(payload):
            marker = int(marker)
            if marker <= covered:
                findings.duplicated += 1
                findings.note(f"page {page.index}: seq marker {marker} after {covered}")
            covered = max(covered, marker)
        for request, indexes in _tokens_by_request(payload).items():
            seen[request] = max(seen.get(request, 0), max(indexes) + 1)
        for match in REPLY_ITEM_RE.finditer(payload):
            end = payload.find(b"</article>", match.end())
            written[int(match.group(1))] = payload[match.start() : end]
    if last_seq > covered:
        findings.lost += last_seq - covered
        findings.note(f"page {page.index}: seq marker at {covered}, chat at {last_seq}")
    missing = [s for s in items if s not in received]
    findings.lost += len(missing)
    if missing:
        findings.note(f"page {page.index}: items never received {missing[:8]}")
    findings.duplicated += sum(n - 1 for n in received.values() if n > 1)
    # Every written reply as the page got it carries exactly the stored tokens.
    by_seq = {e.seq: e for e in events}
    for seq, html in written.items():
        event = by_seq.get(seq)
        content = (event.payload.get("content") or "") if event else ""
        if _tokens_by_request(html) != _tokens_by_request(content):
            findings.reply_mismatch += 1
            findings.note(f"page {page.index}: written reply {seq} differs from the stored one")
    stored, owner = stored_tokens(page.chat_id)
    compare_tokens(findings, f"page {page.index}", seen, stored, owner, requests, done, allowance)
    # Every run's terminal reached the page (missed ones were noticed during the soak).
    findings.missed_terminal += len(page.missed)
    for seq in page.missed:
        end = by_seq.get(seq)
        how = f"{end.kind} {end.payload.get('message', '')}".strip() if end else "?"
        findings.note(
            f"page {page.index}: the terminal at seq {seq} ({how}) did not reach the open "
            f"page within 20 s"
        )
    for run in Run.objects.filter(chat_id=page.chat_id):
        for end in store.run_events(page.chat_id, str(run.pk), TERMINAL_TYPES):
            if end.seq not in received:
                findings.missed_terminal += 1
                findings.note(f"page {page.index}: never got the terminal of run {run.pk}")


def check_api(
    findings: Findings,
    client: ApiClient,
    requests: dict,
    done: dict,
    allowance: tuple[int, int],
) -> None:
    from chat import store

    if not client.chat_id:
        return
    events = store.display_events_after(client.chat_id, 0)
    seen: dict[int, int] = {}
    for run in client.runs:
        if not run.run_id:
            continue  # refused before it started (counted among the refusals)
        expected = [
            e.seq for e in events if e.kind != "msg" and str(e.payload.get("run_id")) == run.run_id
        ]
        got = [e["seq"] for e in run.events if e["type"] not in ("delta", "thinking_delta")]
        counts = collections.Counter(got)
        findings.duplicated += sum(n - 1 for n in counts.values() if n > 1)
        findings.out_of_order += sum(1 for a, b in zip(got, got[1:], strict=False) if b < a)
        lost = [s for s in expected if s not in counts]
        findings.lost += len(lost)
        extra = [s for s in counts if s not in expected]
        findings.duplicated += len(extra)
        if lost or extra or len(got) != len(set(got)):
            kinds = {e.seq: e.kind for e in events}
            ends = [e.seq for e in events if e.seq in set(expected) and e.kind in TERMINAL_TYPES]
            doubled = [s for s, n in counts.items() if n > 1]
            findings.note(
                f"api {client.index} run {run.run_id}: lost {[(s, kinds[s]) for s in lost][:6]}"
                f" extra {extra[:5]} doubled {doubled[:5]}; terminal at {ends}; got "
                f"{len(got)} events in {run.resumes + 1} streams, {run.stream_errors} "
                f"stream errors"
            )
        if run.terminal != 1:
            findings.missed_terminal += 1
            findings.note(f"api {client.index} run {run.run_id}: {run.terminal} terminals")
        text = "".join(e.get("text", "") for e in run.events if e["type"] == "delta")
        for request, indexes in _tokens_by_request(text).items():
            if indexes != list(range(len(indexes))):
                findings.duplicated += 1
                findings.note(
                    f"api {client.index} run {run.run_id}: tokens of q{request} "
                    f"arrived doubled or out of order ({run.resumes} resumes)"
                )
            seen[request] = max(seen.get(request, 0), len(indexes))
        for event in run.events:
            if event["type"] == "complete":
                stored = [
                    e.payload.get("content") or ""
                    for e in events
                    if e.kind == "msg"
                    and (e.payload.get("extra") or {}).get("run_id") == run.run_id
                    and e.payload.get("role") == "assistant"
                ]
                last = stored[-1] if stored else ""
                if _tokens_by_request(event.get("text", "")) != _tokens_by_request(last):
                    findings.reply_mismatch += 1
                    findings.note(f"api {client.index} run {run.run_id}: complete.text differs")
    stored, owner = stored_tokens(client.chat_id)
    compare_tokens(findings, f"api {client.index}", seen, stored, owner, requests, done, allowance)


def dump_runs(path: Path) -> None:
    """Every run with its times and end (``--keep``), to read beside the server logs."""
    from chat.models import Run

    with path.open("w", encoding="utf-8") as out:
        for run in Run.objects.order_by("started_at"):
            row = {
                "run": str(run.pk),
                "chat": str(run.chat_id),
                "status": run.status,
                "started": run.started_at.isoformat(),
                "finished": run.finished_at.isoformat() if run.finished_at else None,
                "error": run.error_message,
                "redispatched": run.redispatched,
            }
            out.write(json.dumps(row) + "\n")


def server_log_summary(workdir: Path) -> tuple[collections.Counter, collections.Counter]:
    """Tracebacks and ERROR lines per log, and the exceptions the tracebacks end in
    (numbers blanked, so that one cause counts once)."""
    counts: collections.Counter[str] = collections.Counter()
    causes: collections.Counter[str] = collections.Counter()
    for log in workdir.glob("*.log"):
        in_traceback = False
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("Traceback"):
                counts[f"{log.stem}: tracebacks"] += 1
                in_traceback = True
            elif in_traceback and line and not line[0].isspace():
                causes[re.sub(r"\d+", "N", line)[:160]] += 1
                in_traceback = False
            elif " ERROR " in line or line.startswith("ERROR"):
                counts[f"{log.stem}: ERROR lines"] += 1
    return counts, causes


# --- set-up and main ------------------------------------------------------------------------------


def prepare(count: int, base_url: str) -> tuple[list[Page], list[ApiClient]]:
    from django.contrib.auth import get_user_model

    from chat import actions
    from chat.apikeys import create_api_key
    from chat.models import Agent, ProviderModel

    seats = create_seats(count, base_url)
    # Long chats must not compact mid-soak: that is another benchmark.
    ProviderModel.objects.filter(alias=MODEL_ALIAS).update(context_window=1_000_000)
    approver = Agent.objects.create(
        name="Soak approver",
        slug=APPROVER_SLUG,
        system_prompt="Use the calculator.",
        tools=["calculator"],
        tool_policies={"calculator": "ask"},
    )
    users = get_user_model().objects.in_bulk([s.user_id for s in seats])
    pages, apis = [], []
    for seat in seats:
        user = users[seat.user_id]
        _key, raw = create_api_key(user, "soak")
        approvals = seat.index % 5 == 4
        if seat.index % 3 == 2:
            apis.append(ApiClient(seat.index, raw, approvals, dropper=False))
        else:
            agent = approver if approvals else None
            chat = actions.new_chat(user, agent=agent, model=MODEL_ALIAS)
            pages.append(Page(seat.index, seat.session_key, raw, str(chat.pk), approvals))
    return pages, apis


def plan_drops(
    pages: list[Page], apis: list[ApiClient], duration: float, rng: random.Random
) -> None:
    """A third of the sockets dropped at random times; a third of the API clients cut."""
    start = now()
    per_page = max(1, math.ceil(duration / 120))
    for page in rng.sample(pages, max(1, len(pages) // 3)) if pages else []:
        page.drop_at = sorted(start + rng.uniform(5, max(6, duration - 5)) for _ in range(per_page))
    for client in rng.sample(apis, max(1, len(apis) // 3)) if apis else []:
        client.dropper = True


def main(argv: list[str]) -> int:
    if argv[:1] == ["--upstream"]:
        upstream_main(json.loads(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10, help="length of the soak (10)")
    parser.add_argument("--clients", type=int, default=50, help="clients at once (50)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (1)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--tokens", type=int, default=60, help="tokens per reply (60)")
    parser.add_argument("--tps", type=float, default=20, help="upstream tokens per second (20)")
    parser.add_argument("--think-min", type=float, default=3, help="pause between messages (3 s)")
    parser.add_argument("--think-max", type=float, default=15, help="... up to (15 s)")
    parser.add_argument(
        "--fault-share", type=float, default=0.15, help="upstream requests that fail (0.15)"
    )
    parser.add_argument(
        "--stall", type=float, default=8, help="an upstream stall, beyond the timeouts (8 s)"
    )
    parser.add_argument(
        "--allowance",
        type=float,
        default=None,
        help="tokens an interrupted reply may lose (default: one push interval's, plus one)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the servers, e.g. LYCEUM_CHECKPOINT_INTERVAL=0.1",
    )
    parser.add_argument(
        "--wait-limit", type=float, default=180, help="a client waits this long for an end (180 s)"
    )
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.minutes > 60 or not 1 <= args.clients <= 500:
        parser.error("--minutes in (0, 60], --clients in [1, 500]")
    overrides = dict(item.split("=", 1) for item in args.set)
    push_interval = float(overrides.get("LYCEUM_STREAM_PUSH_INTERVAL", 0.1))
    checkpoint = float(overrides.get("LYCEUM_CHECKPOINT_INTERVAL", 1.0))
    allowance = (
        int(args.allowance)
        if args.allowance is not None
        else math.ceil(args.tps * push_interval) + 1,
        math.ceil(args.tps * (checkpoint + push_interval)) + 1,
    )

    def interrupted(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    workdir = Path(tempfile.mkdtemp(prefix="lyceum-soak-"))
    cluster: Cluster | None = None
    chaos_log: list[str] = []
    started = time.time()
    try:
        with temporary_database(workdir, postgres=True) as db_env:
            redis_port = free_port()
            channel = f"soak-runs-{secrets.token_hex(3)}"
            extra = {
                "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "LYCEUM_RUNNER": "worker",
                "LYCEUM_WORKER_CHANNEL": channel,
                "LYCEUM_REDIS_PREFIX": "soak",
                "LYCEUM_GENERATE_TITLES": "0",
                "LYCEUM_STREAM_PUSH_INTERVAL": str(push_interval),
                # The upstream's stalls must end inside the soak: shorter than production.
                "LYCEUM_FIRST_BYTE_TIMEOUT": str(max(1.0, args.stall - 3)),
                "LYCEUM_IDLE_TIMEOUT": str(max(1.0, args.stall - 3)),
                "LYCEUM_RETRY_BACKOFF": "0.5",
                "LYCEUM_MEDIA_ROOT": str(workdir / "media"),
                **overrides,
            }
            env = server_env(db_env, workdir, **extra)
            setup_django(server_env(db_env, workdir))
            ports = [free_port(), free_port()]
            cluster = Cluster(workdir, env, redis_port, ports, channel)
            cluster.start_redis()
            base_url, cluster.upstream = start_upstream(workdir, args)
            pages, apis = prepare(args.clients, base_url)
            from django.db import connections

            connections.close_all()
            cluster.start_servers()
            time.sleep(1)
            duration = args.minutes * 60
            plan_drops(pages, apis, duration, random.Random(args.seed + 1))
            print(
                f"soak: {args.minutes:g} min, {len(pages)} pages + {len(apis)} API clients, "
                f"PostgreSQL, Redis :{redis_port}, Daphne :{ports[0]} :{ports[1]}, 2 workers; "
                f"{args.tokens} tokens at {args.tps:g}/s, {args.fault_share:.0%} upstream "
                f"faults; seed {args.seed}; {os.cpu_count()} CPUs, load "
                f"{os.getloadavg()[0]:.2f}",
                flush=True,
            )
            tally = asyncio.run(
                asyncio.wait_for(
                    drive(cluster, pages, apis, args, chaos_log),
                    duration + args.wait_limit + 120,
                )
            )
            drain_live = wait_for_quiet(90)
            problems = cluster.process_problems()
            cluster.stop_all()
            requests, done = read_upstream(workdir / "upstream.jsonl")
            findings = Findings()
            for entry in requests.values():
                findings.upstream[entry["fault"] or "ok"] += 1
            check_database(findings, requests, done)
            for page in pages:
                check_page(findings, page, requests, done, allowance)
            for client in apis:
                check_api(findings, client, requests, done, allowance)
            report(findings, tally, cluster, chaos_log, problems, drain_live, allowance, started)
            if args.keep:
                dump_runs(workdir / "runs.jsonl")
            logs, causes = server_log_summary(workdir)
            if logs:
                print("\nserver logs: " + ", ".join(f"{k} {v}" for k, v in sorted(logs.items())))
                for cause, count in causes.most_common(8):
                    print(f"  {count:>5}  {cause}")
            zero = all(
                n == 0
                for n in (
                    findings.terminal_wrong,
                    findings.stuck + findings.unanswered,
                    findings.reply_mismatch + findings.over_allowance + findings.over_checkpoint,
                    findings.lost + findings.duplicated + findings.out_of_order,
                    findings.decided_twice,
                    findings.missed_terminal,
                )
            )
            return 0 if zero else 1
    except KeyboardInterrupt:
        print("\nsoak: interrupted, cleaning up", file=sys.stderr)
        return 130
    finally:
        if cluster is not None:
            cluster.stop_all()
        if args.keep:
            print(f"\nwork directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def report(
    findings: Findings,
    tally: Tally,
    cluster: Cluster,
    chaos_log: list[str],
    problems: list[str],
    drain_live: int,
    allowance: tuple[int, int],
    started: float,
) -> None:
    print(f"\nfaults ({time.time() - started:.0f} s in all):")
    for line in chaos_log:
        print(f"  {line}")
    print(
        f"  {tally.socket_drops} socket drops ({tally.reconnects} reconnects), "
        f"{tally.api_drops} API streams cut ({tally.api_resumes} resumed with Last-Event-ID)"
    )
    upstream = ", ".join(f"{k} {v}" for k, v in sorted(findings.upstream.items()))
    print(f"  upstream requests: {upstream}")
    print("\nactivity:")
    runs = ", ".join(f"{k} {v}" for k, v in sorted(findings.runs.items()))
    print(f"  messages sent {tally.sent} (sent again with the same id: {tally.resent})")
    print(f"  runs {sum(findings.runs.values())}: {runs}")
    approvals = ", ".join(f"{k} {v}" for k, v in sorted(findings.approvals.items()))
    print(
        f"  approvals {sum(findings.approvals.values())}: {approvals}; "
        f"{tally.decisions} decisions, {tally.double_decisions} answered twice at once"
    )
    refused = ", ".join(f"{k!r} {v}" for k, v in tally.api_refused.most_common(6))
    print(f"  API answers other than 200: {sum(tally.api_refused.values())} {refused}")
    print(f"  socket connect failures {tally.connect_failures}; clients gave up {tally.gave_up}")
    if drain_live:
        print(f"  runs still live 90 s after the clients stopped: {drain_live}")
    for problem in problems:
        print(f"  ! {problem}")
    print("\nfindings (the figure to reach is 0 on each):")
    rows = [
        ("runs without exactly one terminal state", findings.terminal_wrong),
        ("runs stuck (live at the end)", findings.stuck),
        ("messages never answered", findings.unanswered),
        ("replies differing from the stored one", findings.reply_mismatch),
        (
            f"replies that lost more than one push interval ({allowance[0]} tokens; "
            f"worst {findings.worst_loss})",
            findings.over_allowance,
        ),
        (
            f"  ... more than one checkpoint interval ({allowance[1]} tokens)",
            findings.over_checkpoint,
        ),
        ("events lost", findings.lost),
        ("events duplicated", findings.duplicated),
        ("events out of order", findings.out_of_order),
        ("approvals decided twice", findings.decided_twice),
        ("terminals a client did not get (pages, API)", findings.missed_terminal),
    ]
    for label, value in rows:
        print(f"  {label:<72} {value}")
    if findings.notes or findings.loss_notes:
        print("\ndetails:")
        for note in findings.notes + findings.loss_notes:
            print(f"  - {note}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
