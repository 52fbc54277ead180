"""Rate limits and budgets hold under concurrency: 50 parallel requests, exactly 10 through."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from unittest import mock

import httpx
import pytest
from asgiref.sync import sync_to_async

from chat.core.tokens import estimate_tokens
from chat.llm.wire import messages_from_openai
from chat.models import RelayLimit, Run, UsageCounter, UsageRecord
from chat.relay import limits, redisline
from tests.fakeopenai import Script
from tests.relay.conftest import wait_for_records

MESSAGES = [{"role": "user", "content": "count me"}]
MAX_TOKENS = 20
COST = estimate_tokens(messages_from_openai(MESSAGES)) + MAX_TOKENS


def _fire(relay, count: int = 50) -> list[httpx.Response]:
    body = {"model": "gpt-relay", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    headers = {"Authorization": f"Bearer {relay.key}"}

    def one(_: int) -> httpx.Response:
        return httpx.post(f"{relay.url}/chat/completions", json=body, headers=headers, timeout=30)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.django_db(transaction=True)
def test_fifty_parallel_clients_against_a_burst_of_ten(relay):
    RelayLimit.objects.create(user=relay.user, requests_per_minute=1, burst=10)
    responses = _fire(relay)
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) == 10 and statuses.count(429) == 40
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    records = wait_for_records(50)
    assert len(records) == 50  # none lost, none twice
    assert sorted(r.status for r in records).count("ok") == 10
    assert len(relay.upstream.chat_requests()) == 10


@pytest.mark.django_db(transaction=True)
def test_fifty_parallel_clients_against_a_budget_of_ten_requests(relay):
    # Each request holds COST tokens while it runs and then uses exactly COST: ten fit.
    RelayLimit.objects.create(user=relay.user, monthly_tokens=10 * COST)
    relay.upstream.default = Script(tokens=["x"] * 4, prompt_tokens=COST - 4, headers_delay=0.2)
    responses = _fire(relay)
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 10 and statuses.count(429) == 40
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["error"]["code"] == "insufficient_quota"
    records = wait_for_records(50)
    ok = [r for r in records if r.status == "ok"]
    assert len(ok) == 10 and sum(r.total_tokens for r in ok) == 10 * COST
    counter = UsageCounter.objects.get(scope=f"user:{relay.user.pk}")
    assert (counter.used_tokens, counter.reserved_tokens) == (10 * COST, 0)


def _limits_in_redis(settings):
    """The limits in Redis under a prefix of their own, deleted afterwards."""
    import redis

    url = settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    prefix = settings.LYCEUM_REDIS_PREFIX = f"test-relay-{uuid.uuid4().hex[:8]}"
    yield settings
    client = redis.Redis.from_url(url)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


@pytest.fixture
def redis_limits(settings):
    yield from _limits_in_redis(settings)


def _admit_many(policies, cost: int, count: int = 50) -> list[limits.Admission | None]:
    def one(_: int) -> limits.Admission | None:
        try:
            return limits.admit(policies, cost)
        except limits.Refused:
            return None

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.django_db
def test_redis_holds_a_burst_of_ten_under_fifty_threads(redis_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 1, 10, 0)]
    admitted = [a for a in _admit_many(policies, 5) if a is not None]
    assert len(admitted) == 10


@pytest.mark.django_db
def test_redis_holds_a_budget_of_ten_and_settles_once(redis_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 6000, 1000, 10 * 7)]
    admitted = [a for a in _admit_many(policies, 7) if a is not None]
    assert len(admitted) == 10
    for admission in admitted:
        limits.settle(admission, 3)
        limits.settle(admission, 3)  # a second settle counts nothing
    import redis

    client = redis.Redis.from_url(redis_limits.REDIS_URL)
    key = f"{redis_limits.LYCEUM_REDIS_PREFIX}:relay:budget:user:{alice.pk}:{limits.period_of()}"
    assert client.hgetall(key) == {b"used": b"30", b"held": b"0"}
    assert len([a for a in _admit_many(policies, 7, 20) if a is not None]) == 5


@pytest.mark.django_db
def test_a_refusal_explains_itself(alice, settings):
    settings.REDIS_URL = ""
    policies = [limits.Policy(f"user:{alice.pk}", 60, 1, 100)]
    limits.admit(policies, 10)
    with pytest.raises(limits.Refused) as rate:
        limits.admit(policies, 10)
    assert rate.value.reason == "rate_limit" and rate.value.retry_after == 1
    with pytest.raises(limits.Refused) as budget:
        limits.admit([limits.Policy(f"user:{alice.pk}", 60, 5, 100)], 95)
    assert budget.value.reason == "budget" and budget.value.retry_after > 1


@pytest.mark.django_db
def test_chat_runs_count_against_the_same_budget(alice, settings):
    from chat import actions, store
    from chat.llm.types import Usage
    from chat.relay.usage import record_run_usage

    settings.REDIS_URL = ""
    RelayLimit.objects.create(user=alice, monthly_tokens=100)
    chat = store.create_chat(alice, title="t", model="demo")
    limits.check_run(alice.pk)  # creates the counter, seeded from the records (none)
    run = Run.objects.create(chat=chat, model="demo")
    record_run_usage(run, Usage(input_tokens=60, output_tokens=40), Run.Status.COMPLETED)
    (record,) = UsageRecord.objects.filter(user=alice)
    assert (record.source, record.total_tokens) == ("chat", 100)
    assert UsageCounter.objects.get(scope=f"user:{alice.pk}").used_tokens == 100
    with pytest.raises(actions.ActionError) as caught:
        actions.send_message(alice, chat.pk, "one more", "client-1")
    assert caught.value.code == "over_budget"


async def _pending_many(policies, cost: int, count: int = 50) -> list[limits.Admission | None]:
    """``count`` admissions sent at once from one event loop (one pipelined connection)."""

    async def answer(pending: limits.Pending) -> limits.Admission | None:
        try:
            return await pending.result()
        except limits.Refused:
            return None

    pendings = [limits.admit_later(policies, cost) for _ in range(count)]
    assert all(p is not None for p in pendings)
    return list(await asyncio.gather(*(answer(p) for p in pendings if p is not None)))


def _budget(settings, user) -> dict[Any, Any]:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.LYCEUM_REDIS_PREFIX}:relay:budget:user:{user.pk}:{limits.period_of()}"
    return client.hgetall(key)


@pytest.mark.django_db(transaction=True)
async def test_an_admission_answered_later_holds_a_budget_of_ten(redis_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 6000, 1000, 10 * 7)]
    pending = limits.admit_later(policies, 7)
    assert pending is not None and await pending.result() is None  # no budget: seed first
    await sync_to_async(limits.admit)(policies, 7)  # the usual way seeds it (and takes one)
    admitted = [a for a in await _pending_many(policies, 7) if a is not None]
    assert len(admitted) == 9
    assert _budget(redis_limits, alice) == {b"used": b"0", b"held": b"70"}


@pytest.mark.django_db
async def test_fifty_admissions_on_one_connection_against_a_burst_of_ten(redis_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 1, 10, 0)]
    results = await _pending_many(policies, 5)
    assert len([a for a in results if a is not None]) == 10


@pytest.mark.django_db
async def test_an_admission_answered_later_survives_a_script_flush(redis_limits, alice):
    import redis

    policies = [limits.Policy(f"user:{alice.pk}", 1, 2, 0)]
    redis.Redis.from_url(redis_limits.REDIS_URL).script_flush()
    pendings = [limits.admit_later(policies, 0) for _ in range(3)]
    results = []
    for pending in pendings:
        assert pending is not None
        try:
            results.append(await pending.result())
        except limits.Refused as exc:
            results.append(exc.reason)
    assert isinstance(results[0], limits.Admission) and isinstance(results[1], limits.Admission)
    assert results[2] == "rate_limit"
    after = limits.admit_later(policies, 0)  # the connection is still in step with its answers
    assert after is not None
    with pytest.raises(limits.Refused):
        await after.result()


@pytest.fixture
def relay_with_redis(relay_settings):
    """The relay's limits in Redis (set before the live server forks)."""
    yield from _limits_in_redis(relay_settings)


@pytest.mark.django_db(transaction=True)
def test_fifty_parallel_clients_against_a_budget_of_ten_with_redis(relay_with_redis, relay):
    import redis

    RelayLimit.objects.create(user=relay.user, monthly_tokens=10 * COST)
    relay.upstream.default = Script(tokens=["x"] * 4, prompt_tokens=COST - 4, headers_delay=0.2)
    responses = _fire(relay)
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 10 and statuses.count(429) == 40
    records = wait_for_records(50)
    ok = [r for r in records if r.status == "ok"]
    assert len(records) == 50
    assert len(ok) == 10 and sum(r.total_tokens for r in ok) == 10 * COST
    assert len(relay.upstream.chat_requests()) == 10
    client = redis.Redis.from_url(relay_with_redis.REDIS_URL)
    prefix = relay_with_redis.LYCEUM_REDIS_PREFIX
    key = f"{prefix}:relay:budget:user:{relay.user.pk}:{limits.period_of()}"
    deadline = time.monotonic() + 5
    while client.hget(key, "held") != b"0" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.hgetall(key) == {b"used": str(10 * COST).encode(), b"held": b"0"}


def test_a_new_redis_connection_reads_no_package_metadata(redis_limits):
    """redis-py would look its version up for each new connection (a burst of admissions
    opens many); the client gives it once."""
    client = limits.redis_client(redis_limits.REDIS_URL)
    with mock.patch("importlib.metadata.version", side_effect=AssertionError("metadata read")):
        connection = client.connection_pool.make_connection()
        try:
            connection.connect()
            connection.send_command("PING")
            assert connection.read_response() in (b"PONG", "PONG", True)
        finally:
            connection.disconnect()


@pytest.mark.django_db
async def test_two_hundred_admissions_answered_later_at_once(redis_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 60000, 1000, 0)]
    results = await _pending_many(policies, 1, 200)
    assert len(results) == 200 and all(isinstance(r, limits.Admission) for r in results)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends


@pytest.mark.django_db
async def test_an_admission_with_redis_unreachable_is_unavailable(redis_limits, alice):
    redis_limits.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    pending = limits.admit_later([limits.Policy(f"user:{alice.pk}", 60, 10, 0)], 1)
    assert pending is not None
    with pytest.raises(limits.Unavailable):
        await pending.result()


@pytest.mark.django_db
async def test_admissions_on_a_killed_connection_are_unavailable_and_the_next_reconnects(
    redis_limits, alice
):
    import redis

    admin = redis.Redis.from_url(redis_limits.REDIS_URL)
    policies = [limits.Policy(f"user:{alice.pk}", 60000, 1000, 0)]
    first = limits.admit_later(policies, 1)
    assert first is not None and isinstance(await first.result(), limits.Admission)
    line = redisline.line_for(redis_limits.REDIS_URL)._line  # type: ignore[union-attr]
    host, port = line.transport.get_extra_info("sockname")[:2]
    address = f"{host}:{port}"
    admin.client_pause(3000, all=False)  # write commands (the admission script) wait
    try:
        waiting = [limits.admit_later(policies, 1) for _ in range(5)]
        await asyncio.sleep(0.1)
        assert not any(p.done() for p in waiting if p is not None)
        assert admin.client_kill_filter(_type=None, addr=address) == 1
        for pending in waiting:
            assert pending is not None
            with pytest.raises(limits.Unavailable):
                await pending.result()
    finally:
        admin.client_unpause()
    again = limits.admit_later(policies, 1)
    assert again is not None and isinstance(await again.result(), limits.Admission)


@pytest.fixture
def relay_with_redis_unreachable(relay_settings):
    """The relay's limits in a Redis that is not there (set before the live server forks)."""
    relay_settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    return relay_settings


@pytest.mark.django_db(transaction=True)
def test_redis_unreachable_answers_503_and_leaves_a_failed_record(
    relay_with_redis_unreachable, relay
):
    import openai

    headers = {"Authorization": f"Bearer {relay.key}"}
    for stream in (False, True):
        body = {"model": "gpt-relay", "messages": MESSAGES, "stream": stream}
        response = httpx.post(f"{relay.url}/chat/completions", json=body, headers=headers)
        assert response.status_code == 503
        assert int(response.headers["Retry-After"]) >= 1
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("api_error", "limits_unavailable")
        assert set(error) == {"message", "type", "code"}
    with pytest.raises(openai.InternalServerError):
        relay.client().chat.completions.create(model="gpt-relay", messages=MESSAGES)
    records = wait_for_records(3)
    assert [(r.status, r.http_status, r.stream) for r in records] == [
        ("failed", 503, False),
        ("failed", 503, True),
        ("failed", 503, False),
    ]
    assert all(r.error.startswith("limits unavailable") and r.total_tokens == 0 for r in records)
    assert relay.upstream.chat_requests() == []


@pytest.mark.django_db(transaction=True)
async def test_a_request_gone_while_redis_answers_leaves_a_record_and_gives_back(
    relay_settings, redis_limits, relay_data, alice
):
    """Cancelled while its admission is on its way: the answer is still taken, the request
    recorded as cancelled, and the tokens its admission held given back."""
    import redis

    from chat.apikeys import authenticate_api_key
    from chat.relay import service

    _provider, raw = relay_data
    await sync_to_async(RelayLimit.objects.create)(user=alice, monthly_tokens=10_000)
    api_key = await sync_to_async(authenticate_api_key)(raw)
    admin = redis.Redis.from_url(redis_limits.REDIS_URL)
    budget = f"{redis_limits.LYCEUM_REDIS_PREFIX}:relay:budget:user:{alice.pk}:{limits.period_of()}"
    admin.hset(budget, mapping={"used": 0, "held": 0})  # seeded: admitted in the event loop
    body = {"model": "gpt-relay", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    admin.client_pause(5000, all=False)  # the admission script waits in Redis
    try:
        task = asyncio.ensure_future(service.prepared(api_key, dict(body)))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _budget(redis_limits, alice) == {b"used": b"0", b"held": b"0"}  # still paused
    finally:
        admin.client_unpause()
    await _records_written(1)
    (record,) = [r async for r in UsageRecord.objects.filter(user=alice)]
    assert (record.status, record.error) == ("cancelled", "the client disconnected")
    assert _budget(redis_limits, alice) == {
        b"used": str(record.total_tokens).encode(),
        b"held": b"0",
    }


@pytest.mark.django_db(transaction=True)
async def test_a_request_gone_while_the_database_admits_leaves_a_record_and_gives_back(
    relay_settings, relay_data, alice
):
    """The limits in the database: cancelled while the database thread admits it (the
    upstream connected meanwhile), the request is still recorded as cancelled and the
    tokens its admission held given back."""
    from chat.apikeys import authenticate_api_key
    from chat.relay import service

    _provider, raw = relay_data
    await sync_to_async(RelayLimit.objects.create)(user=alice, monthly_tokens=10_000)
    api_key = await sync_to_async(authenticate_api_key)(raw)
    body = {"model": "gpt-relay", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    first = await service.prepared(api_key, dict(body))  # the caches filled, the counter made
    service.finish(first, service.Outcome(status="ok"))
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)())  # the database thread held
    # Another writer holds the database: the event loop's admission (chat/relay/nowait.py)
    # does not wait for it and leaves the request to the database thread.
    from django.conf import settings as django_settings

    from chatsite.sqlite.base import WriterLock

    writer_lock = None
    if "sqlite" in django_settings.DATABASES["default"]["ENGINE"]:
        writer_lock = WriterLock(f"{django_settings.DATABASES['default']['NAME']}-writer")
        writer_lock.acquire()
    try:
        task = asyncio.ensure_future(service.prepared(api_key, dict(body)))
        await asyncio.sleep(0.3)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        if writer_lock is not None:
            writer_lock.close()
        release.set()
    await busy
    await _records_written(2)
    records = [r async for r in UsageRecord.objects.filter(user=alice).order_by("pk")]
    assert [(r.status, r.error) for r in records] == [
        ("ok", ""),
        ("cancelled", "the client disconnected"),
    ]
    counter = await sync_to_async(UsageCounter.objects.get)(scope=f"user:{alice.pk}")
    assert counter.reserved_tokens == 0


async def _records_written(count: int) -> None:
    """Wait (up to 5 s) for ``count`` usage records queued by the relay, then write them."""
    from chat.relay import writer

    deadline = time.monotonic() + 5
    while writer.writer.pending() < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await sync_to_async(writer.flush)()
