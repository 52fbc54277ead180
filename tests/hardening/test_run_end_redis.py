"""A run that ends while Redis is away still ends (found by bench/soak.py).

The run's tokens count against its owner's budget (``record_run_usage``); with
``REDIS_URL`` that counter lives in Redis. The increment was made inside ``finish_run``'s
transaction, so a Redis outage at the moment a run finished rolled back the run's end:
no terminal event, the run left "running" until the sweeper interrupted it 15 s later.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis

from chat import store
from chat.agent import events as ev
from chat.llm.types import Usage
from chat.models import RelayLimit, Run, UsageRecord
from chat.relay import limits
from chat.runhost import host as run_host
from chat.runhost import transitions


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def redis_url(settings) -> Iterator[str]:
    """A Redis server of this test's own, on a free port (stopped at the end)."""
    port = _free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        + ["--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, socket_timeout=1)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.05)
    url = f"redis://127.0.0.1:{port}/0"
    settings.REDIS_URL = url
    settings.LYCEUM_REDIS_PREFIX = f"runend{port}"
    limits.redis_client.cache_clear()
    try:
        yield url
    finally:
        client.close()
        server.terminate()
        server.wait(10)
        limits.redis_client.cache_clear()


def _finish(run: Run) -> bool:
    host = run_host.DjangoRunHost(run, [])
    end = ev.Complete(input_tokens=30, output_tokens=12, usage_estimated=False, text="Done.")
    return transitions.finish_run(host, Run.Status.COMPLETED, end, [], Usage(30, 12))


@pytest.mark.django_db(transaction=True)
def test_a_run_ending_while_redis_is_down_ends_completed(alice, settings):
    # Nothing listens on this port: every Redis command fails, as during a restart.
    settings.REDIS_URL = f"redis://127.0.0.1:{_free_port()}/0"
    limits.redis_client.cache_clear()
    chat = store.create_chat(alice, title="t", model="demo")
    run = Run.objects.create(chat=chat, model="demo", claimed=True)
    try:
        assert _finish(run)
    finally:
        limits.redis_client.cache_clear()
    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    ends = store.run_events(chat.pk, str(run.pk), {"complete", "cancelled", "error"})
    assert [e.kind for e in ends] == ["complete"]
    # The usage is recorded in the database all the same (a counter seeds from it).
    assert UsageRecord.objects.get(run_id=run.pk).total_tokens == 42


@pytest.mark.django_db(transaction=True)
def test_the_budget_counter_counts_a_run_once_redis_answers(alice, redis_url):
    RelayLimit.objects.create(user=alice, monthly_tokens=1000)
    limits.check_run(alice.pk)  # seeds the user's counter in Redis from the records (none)
    chat = store.create_chat(alice, title="t", model="demo")
    run = Run.objects.create(chat=chat, model="demo", claimed=True)
    assert _finish(run)
    key = limits._budget_key(f"user:{alice.pk}", limits.period_of())
    client = redis.Redis.from_url(redis_url)
    try:
        assert int(client.hget(key, "used")) == 42
    finally:
        client.close()
