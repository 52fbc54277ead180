"""Runs executed by real ``manage.py runworker`` processes over Redis, and runs that
outlive the request that started them.

The worker tests start ``runworker`` subprocesses on the test database (the SQLite file
or the PostgreSQL test database) with a channel-layer prefix and worker channel of their
own, dispatch runs from this process over the same Redis layer, and watch the database,
which is the source of truth. Redis must be running at 127.0.0.1:6379: without it these
tests fail, they are never skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings as django_settings

from chat import actions, store
from chat.apikeys import create_api_key
from chat.live import doorbell
from chat.live.layers import live_layer
from chat.models import Run
from chat.runhost import executor

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/3"
WAIT_SECONDS = 30.0
LONG_PROMPT = "Please give me a long answer about rivers."

pytestmark = pytest.mark.django_db(transaction=True)


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def redis_layer(settings) -> Iterator[dict[str, str]]:
    """This process on a Redis channel layer of its own, dispatching to workers.

    Yields the environment a worker needs to share that layer and channel. Every key
    under the prefix is deleted afterwards.
    """
    prefix = f"lyceumtest-{uuid.uuid4().hex[:12]}:"
    channel = f"lyceum-runs-{uuid.uuid4().hex[:8]}"
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "prefix": prefix,
                "expiry": 30,
            },
        },
        # As the settings make it from REDIS_URL: the workers publish to pages on it.
        "live": {
            "BACKEND": "chat.live.layers.PipelinedPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "prefix": prefix},
        },
    }
    settings.LYCEUM_RUNNER = "worker"
    settings.LYCEUM_WORKER_CHANNEL = channel
    try:
        yield {
            "REDIS_URL": REDIS_URL,
            "LYCEUM_REDIS_PREFIX": prefix,
            "LYCEUM_RUNNER": "worker",
            "LYCEUM_WORKER_CHANNEL": channel,
        }
    finally:
        _delete_redis_keys(prefix)


def _delete_redis_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def _redis_client():
    import redis

    return redis.Redis.from_url(REDIS_URL)


def database_env() -> dict[str, str]:
    """Point a subprocess at the database this test uses (the test database)."""
    db = django_settings.DATABASES["default"]
    if db["ENGINE"] == "chatsite.sqlite":  # SQLite, writers queued on a lock (settings)
        return {"SQLITE_PATH": str(db["NAME"]), "DATABASE_URL": ""}
    auth = quote(db.get("USER") or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    host = f"{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}"
    return {"DATABASE_URL": f"postgres://{auth}@{host}/{db['NAME']}"}


class Worker:
    """One ``manage.py runworker`` subprocess; its output goes to a log file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.log = log_path.open("wb")
        command = [sys.executable, "manage.py", "runworker", env["LYCEUM_WORKER_CHANNEL"]]
        full_env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatsite.settings", **env}
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-4000:]

    def kill_hard(self) -> None:
        """``kill -9``: no cleanup, no terminal state written, the heartbeat just stops."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()


@pytest.fixture
def start_worker(redis_layer, tmp_path) -> Iterator[Callable[..., Worker]]:
    """Start workers sharing this test's layer and database; all are stopped at the end."""
    started: list[Worker] = []

    def start(**extra_env: str) -> Worker:
        env = {**redis_layer, **database_env(), **extra_env}
        worker = Worker(env, tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


@pytest.fixture
async def layer_cleanup(redis_layer) -> Any:
    """Close this process's Redis connections before the test's event loop goes away."""
    yield
    layer = get_channel_layer()
    if hasattr(layer, "close_pools"):
        await layer.close_pools()
    await live_layer().flush()  # closes its subscription


# --- helpers -----------------------------------------------------------------------------------


def run_row(run_id: str) -> Run:
    return Run.objects.get(pk=run_id)


async def wait_until(
    check: Callable[[], Awaitable[Any]], what: str, workers: list[Worker] = ()
) -> Any:
    """Poll ``check`` until it returns something truthy; fail with the worker logs."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    logs = "\n".join(f"--- worker {i} ---\n{w.output()}" for i, w in enumerate(workers))
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


async def run_reaches(run_id: str, statuses: set[str], workers: list[Worker]) -> Run:
    async def check() -> Run | None:
        run = await database_sync_to_async(run_row)(run_id)
        return run if run.status in statuses else None

    return await wait_until(check, f"run {run_id} to reach {sorted(statuses)}", workers)


async def streaming_started(run_id: str, workers: list[Worker]) -> Run:
    """Wait for the run's first checkpoint of reply text."""

    async def check() -> Run | None:
        run = await database_sync_to_async(run_row)(run_id)
        assert run.status == Run.Status.RUNNING, (run.status, run.error_message)
        return run if run.partial_text else None

    return await wait_until(check, f"a checkpoint of run {run_id}", workers)


async def start_run(user, model: str, text: str) -> tuple[str, str]:
    """Create a chat and send a message from this process; dispatch its run. (chat, run)."""
    chat = await database_sync_to_async(actions.new_chat)(user, model=model)
    sent = await database_sync_to_async(actions.send_message)(
        user, chat.pk, text, f"c-{uuid.uuid4().hex}"
    )
    assert sent.run_id
    return str(chat.pk), sent.run_id


def run_events(chat_id: str, run_id: str) -> list[store.StoredEvent]:
    return [
        e
        for e in store.display_events_after(chat_id, 0)
        if e.payload.get("run_id") == run_id
        or (e.payload.get("extra") or {}).get("run_id") == run_id
    ]


TERMINAL = {"complete", "cancelled", "error"}


# --- worker mode -------------------------------------------------------------------------------


def test_a_subprocess_given_the_database_env_sees_this_tests_data(alice):
    """SQLITE_PATH (or DATABASE_URL) names the test database, committed rows included."""
    code = (
        "import django; django.setup(); "
        "from django.contrib.auth.models import User; "
        "print(list(User.objects.values_list('username', flat=True)))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "chatsite.settings", **database_env()}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "['alice']", result.stderr


async def test_a_run_dispatched_over_redis_completes_in_a_worker(
    alice, default_agent, start_worker, redis_layer, layer_cleanup
):
    worker = start_worker()
    chat_id, run_id = await start_run(alice, "demo-fast", "hello there, worker")
    run = await run_reaches(run_id, {"completed", "failed", "cancelled"}, [worker])

    assert run.status == Run.Status.COMPLETED, run.error_message
    assert executor.local_task(run_id) is None  # nothing ran it in this process
    assert run.heartbeat_at is not None  # written by the worker when it took the run
    events = await database_sync_to_async(run_events)(chat_id, run_id)
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_start"
    assert [k for k in kinds if k in TERMINAL] == ["complete"]
    assert kinds[-1] == "complete"
    replies = [e.payload for e in events if e.kind == "msg" and e.payload["role"] == "assistant"]
    assert replies and replies[-1]["content"] == events[-1].payload["text"]
    assert "hello there, worker" in replies[-1]["content"]
    assert worker.process.poll() is None  # the worker lives on for the next run
    pushed_copy = f"{redis_layer['LYCEUM_REDIS_PREFIX']}:pushed:{run_id}"
    # Forgotten at the run's end: the delete follows the run's last snapshot, which may
    # still be on its way to Redis when the run's end is written.
    for _ in range(100):
        if not _redis_client().exists(pushed_copy):
            break
        await asyncio.sleep(0.05)
    assert not _redis_client().exists(pushed_copy)


async def test_an_idle_worker_keeps_listening(alice, default_agent, start_worker, layer_cleanup):
    """Idle longer than one blocking pop (5 s) plus redis-py's default read timeout (5 s)."""
    worker = start_worker()
    await asyncio.sleep(7)
    assert worker.process.poll() is None, worker.output()

    _chat_id, run_id = await start_run(alice, "demo-fast", "still there?")
    run = await run_reaches(run_id, Run.TERMINAL, [worker])
    assert run.status == Run.Status.COMPLETED, run.error_message


async def test_a_killed_worker_leaves_an_interrupted_run_with_its_partial_text(
    alice, default_agent, start_worker, layer_cleanup
):
    slow = {"LYCEUM_DEMO_TOKEN_DELAY": "0.05", "LYCEUM_CHECKPOINT_INTERVAL": "0.1"}
    # The default stale window (15 s) for the first worker: on a busy machine its start-up
    # may take longer than 3 s, and its sweeper would then take the run it is about to
    # execute (no heartbeat yet) for a dead one.
    first = start_worker(**slow)
    chat_id, run_id = await start_run(alice, "demo", LONG_PROMPT)
    seen = await streaming_started(run_id, [first])

    first.kill_hard()
    after_kill = await database_sync_to_async(run_row)(run_id)
    assert after_kill.status == Run.Status.RUNNING  # nobody wrote an end: it died mid-run
    assert after_kill.partial_text.startswith(seen.partial_text)

    second = start_worker(**slow, LYCEUM_RUN_STALE_SECONDS="3")  # recovers it quickly
    run = await run_reaches(run_id, Run.TERMINAL, [first, second])

    assert run.status == Run.Status.INTERRUPTED
    # The last checkpoint, or the last push when that went further (see the next test).
    assert run.partial_text.startswith(after_kill.partial_text)
    events = await database_sync_to_async(run_events)(chat_id, run_id)
    terminal = [e for e in events if e.kind in TERMINAL]
    assert len(terminal) == 1 and terminal[0] is events[-1]
    error = terminal[0].payload
    assert (error["type"], error["status"], error["category"]) == (
        "error",
        "interrupted",
        "interrupted",
    )
    assert error["partial_text"] == run.partial_text
    partial = [e.payload for e in events if e.kind == "msg" and e.payload["role"] == "assistant"]
    assert len(partial) == 1
    assert partial[0]["content"] == run.partial_text
    assert partial[0]["extra"]["ended"] == "interrupted"
    assert second.process.poll() is None


async def test_a_killed_worker_keeps_the_reply_as_far_as_the_pages_were_shown_it(
    alice, default_agent, start_worker, layer_cleanup
):
    """Checkpoints seconds apart, pushes a tenth of a second apart: what a page was shown
    survives the kill, not only what the last checkpoint saved."""
    first = start_worker(LYCEUM_DEMO_TOKEN_DELAY="0.05", LYCEUM_CHECKPOINT_INTERVAL="5")
    chat_id, run_id = await start_run(alice, "demo", LONG_PROMPT)
    layer = live_layer()
    channel = await layer.new_channel()
    await layer.group_add(doorbell.chat_group(chat_id), channel)
    shown: list[str] = []

    async def page() -> None:
        while True:
            message = await layer.receive(channel)
            ours = message.get("type") == "chat.stream" and message.get("run_id") == run_id
            if ours and message["text"]:  # the demo model thinks first
                shown.append(message["text"])

    listening = asyncio.create_task(page())

    async def pushed_a_while() -> bool:
        return len(shown) >= 8

    try:
        await wait_until(pushed_a_while, "stream snapshots", [first])
        first.kill_hard()
        await asyncio.sleep(0.5)  # snapshots published before the kill arrive
    finally:
        listening.cancel()
        await layer.group_discard(doorbell.chat_group(chat_id), channel)
    after_kill = await database_sync_to_async(run_row)(run_id)
    assert len(after_kill.partial_text) < len(shown[-1])  # the checkpoint lags the page

    second = start_worker(LYCEUM_RUN_STALE_SECONDS="3")
    run = await run_reaches(run_id, Run.TERMINAL, [first, second])

    assert run.status == Run.Status.INTERRUPTED
    assert run.partial_text.startswith(shown[-1])
    events = await database_sync_to_async(run_events)(chat_id, run_id)
    error = [e.payload for e in events if e.kind in TERMINAL]
    assert [e["partial_text"] for e in error] == [run.partial_text]
    kept = [e.payload for e in events if e.kind == "msg" and e.payload["role"] == "assistant"]
    assert [k["content"] for k in kept] == [run.partial_text]


async def test_cancel_from_another_process_stops_the_workers_run(
    alice, default_agent, start_worker, layer_cleanup
):
    worker = start_worker(LYCEUM_DEMO_TOKEN_DELAY="0.05", LYCEUM_CHECKPOINT_INTERVAL="0.1")
    chat_id, run_id = await start_run(alice, "demo", LONG_PROMPT)
    await streaming_started(run_id, [worker])

    assert await database_sync_to_async(actions.cancel_run)(alice, chat_id) == run_id
    run = await run_reaches(run_id, Run.TERMINAL, [worker])

    assert run.status == Run.Status.CANCELLED
    assert run.partial_text and not run.partial_text.endswith("rivers.")
    events = await database_sync_to_async(run_events)(chat_id, run_id)
    terminal = [e for e in events if e.kind in TERMINAL]
    assert [e.kind for e in terminal] == ["cancelled"] and terminal[0] is events[-1]
    assert terminal[0].payload["partial_text"] == run.partial_text
    partial = [e.payload for e in events if e.kind == "msg" and e.payload["role"] == "assistant"]
    assert [p["extra"]["ended"] for p in partial] == ["cancelled"]
    assert partial[0]["content"] == run.partial_text


async def test_the_cancel_doorbell_alone_reaches_the_worker(
    alice, default_agent, start_worker, layer_cleanup
):
    """Without the database flag, only the channel-layer message can stop the run."""
    worker = start_worker(LYCEUM_DEMO_TOKEN_DELAY="0.05", LYCEUM_CHECKPOINT_INTERVAL="0.1")
    _chat_id, run_id = await start_run(alice, "demo", LONG_PROMPT)
    await streaming_started(run_id, [worker])

    await get_channel_layer().group_send(
        doorbell.run_control_group(run_id), {"type": "run.cancel", "run_id": run_id}
    )
    run = await run_reaches(run_id, Run.TERMINAL, [worker])

    assert run.status == Run.Status.CANCELLED
    assert run.cancel_requested is False  # the database flag played no part
    assert run.partial_text


# --- in-process: runs outlive their request -----------------------------------------------------


@pytest.fixture
def slow_live_server(settings, request) -> str:
    """A live server whose demo model streams slowly (set before the server forks)."""
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.05
    return request.getfixturevalue("live_server_url")


def hang_up_on_the_stream(base: str, headers: dict[str, str], body: dict[str, Any]) -> str:
    """Read the event stream until the reply streams, then close the connection. Run id."""
    with (
        httpx.Client(base_url=base, timeout=20) as client,
        client.stream("POST", "/api/v1/chat/stream", json=body, headers=headers) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[len("data: ") :])
                if event["type"] in ("delta", "thinking_delta"):
                    return event["run_id"]  # hang up while the reply streams
    raise AssertionError("the stream ended before any delta")


def hang_up_on_the_json_request(base: str, headers: dict[str, str], body: dict[str, Any]) -> str:
    """Give up on ``POST /api/v1/chat`` long before the reply is ready. Run id."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{base}/api/v1/chat",
            json=body,
            headers=headers,
            timeout=httpx.Timeout(20, read=0.5),
        )
    return str(Run.objects.get().pk)


@pytest.mark.parametrize("hang_up", [hang_up_on_the_stream, hang_up_on_the_json_request])
def test_an_in_process_run_completes_after_its_request_is_closed(
    alice, default_agent, slow_live_server, hang_up
):
    _key, raw_key = create_api_key(alice)
    headers = {"Authorization": f"Bearer {raw_key}"}
    run_id = hang_up(
        slow_live_server, headers, {"message": "hello, please keep going after I hang up"}
    )
    assert run_row(run_id).status == Run.Status.RUNNING  # the reply was not over yet

    deadline = time.monotonic() + WAIT_SECONDS
    while run_row(run_id).status not in Run.TERMINAL and time.monotonic() < deadline:
        time.sleep(0.05)
    run = run_row(run_id)
    assert run.status == Run.Status.COMPLETED, run.error_message
    events = run_events(str(run.chat_id), run_id)
    assert [e.kind for e in events if e.kind in TERMINAL] == ["complete"]
    reply = [e.payload for e in events if e.kind == "msg" and e.payload["role"] == "assistant"]
    assert reply[-1]["content"] == events[-1].payload["text"]
    assert "keep going after I hang up" in reply[-1]["content"]


def test_the_api_streams_a_run_that_a_worker_executes(
    alice, default_agent, start_worker, redis_layer, request
):
    """Scale-out end to end: a web process (live Daphne) on Redis, the run in a worker."""
    worker = start_worker(LYCEUM_DEMO_TOKEN_DELAY="0.01", LYCEUM_STREAM_PUSH_INTERVAL="0.05")
    live = request.getfixturevalue("live_server_url")  # forks with the Redis settings
    _key, raw_key = create_api_key(alice)
    body = {"message": "hello from a script, via a worker"}
    with (
        httpx.Client(base_url=live, timeout=30) as client,
        client.stream(
            "POST", "/api/v1/chat/stream", json=body, headers={"Authorization": f"Bearer {raw_key}"}
        ) as response,
    ):
        assert response.status_code == 200
        events = [json.loads(x[6:]) for x in response.iter_lines() if x.startswith("data: ")]

    kinds = [e["type"] for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "complete", worker.output()
    assert [k in TERMINAL for k in kinds].count(True) == 1
    text = "".join(e["text"] for e in events if e["type"] == "delta")
    assert text == events[-1]["text"] and "via a worker" in text
    # Snapshots pushed by the worker reached the web process over Redis.
    assert kinds.count("delta") > 1 and kinds.count("thinking_delta") > 1
    assert run_row(events[-1]["run_id"]).status == Run.Status.COMPLETED
