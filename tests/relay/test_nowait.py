"""The database admission in the event loop (chat/relay/nowait.py): exact beside the
database thread's admissions, and never waiting for a lock."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings

from chat.models import RelayLimit, UsageCounter
from chat.relay import limits, nowait


@pytest.fixture
def db_limits(settings, transactional_db):
    settings.REDIS_URL = ""
    nowait.close()
    yield settings
    nowait.close()


def _counter(policy: limits.Policy) -> UsageCounter:
    return UsageCounter.objects.get(scope=policy.scope, period=limits.period_of())


def _made(policies: list[limits.Policy]) -> None:
    """The counters created (and seeded) the usual way, nothing taken."""
    limits.admit(policies, 0, take=False, hold=False)


def _writer_lock():
    from chatsite.sqlite.base import WriterLock

    return WriterLock(f"{django_settings.DATABASES['default']['NAME']}-writer")


def test_loop_and_thread_admissions_together_hold_a_burst_of_ten(db_limits, alice):
    # Burst 10 and a budget of 10 requests; half the takers admit in "their event loop"
    # (nowait, each thread its own connection; the database thread when it would wait),
    # half on Django's connection, all at once.
    cost = 7
    policies = [
        limits.Policy(f"user:{alice.pk}", 1, 10, 0),
        limits.Policy("key:1", 6000, 1000, 10 * cost),
    ]
    _made(policies)
    now_admitted = []

    def by_loop(_: int) -> limits.Admission | None:
        try:
            admission = nowait.admit(policies, cost)
            if admission is not None:
                now_admitted.append(admission)
                return admission
            return limits.admit(policies, cost)
        except limits.Refused:
            return None
        finally:
            nowait.close()

    def by_thread(_: int) -> limits.Admission | None:
        try:
            return limits.admit(policies, cost)
        except limits.Refused:
            return None

    with ThreadPoolExecutor(20) as pool:
        loop_side = pool.map(by_loop, range(25))
        thread_side = pool.map(by_thread, range(25))
        admitted = [a for a in [*loop_side, *thread_side] if a is not None]
    assert len(admitted) == 10
    assert now_admitted  # the event loop's way was taken
    assert _counter(policies[1]).reserved_tokens == 10 * cost
    assert _counter(policies[0]).bucket < 1
    for admission in admitted:
        limits.settle(admission, cost)
    assert (_counter(policies[1]).used_tokens, _counter(policies[1]).reserved_tokens) == (
        10 * cost,
        0,
    )


def test_the_loop_admission_takes_and_refuses_as_the_database_does(db_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 60, 2, 100)]
    _made(policies)
    assert nowait.admit(policies, 40) is not None
    with pytest.raises(limits.Refused) as budget:
        nowait.admit(policies, 61)
    assert budget.value.reason == "budget"
    assert nowait.admit(policies, 40) is not None
    with pytest.raises(limits.Refused) as rate:
        nowait.admit(policies, 1)
    assert rate.value.reason == "rate_limit" and rate.value.retry_after == 1
    counter = _counter(policies[0])
    assert counter.reserved_tokens == 80 and counter.bucket < 1


def test_a_held_writer_lock_is_not_waited_for(db_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 60, 5, 100)]
    _made(policies)
    lock = _writer_lock()
    lock.acquire()  # another connection (of any process) about to write
    try:
        started = time.monotonic()
        assert nowait.admit(policies, 10) is None
        assert time.monotonic() - started < 0.5
    finally:
        lock.close()
    counter = _counter(policies[0])
    assert counter.reserved_tokens == 0 and counter.bucket == -1.0  # nothing taken
    assert nowait.admit(policies, 10) is not None  # free again: admitted here


def test_sqlites_own_lock_held_is_not_waited_for(db_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 60, 5, 100)]
    _made(policies)
    other = sqlite3.connect(django_settings.DATABASES["default"]["NAME"], isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a writer that does not take the writer lock
    try:
        started = time.monotonic()
        assert nowait.admit(policies, 10) is None
        assert time.monotonic() - started < 0.5
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert _counter(policies[0]).reserved_tokens == 0
    assert nowait.admit(policies, 10) is not None


def test_a_counter_to_create_is_left_to_the_database_thread(db_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 60, 5, 100)]
    assert nowait.admit(policies, 10) is None
    assert not UsageCounter.objects.exists()  # the seeding from the records is not done here


def test_limits_in_redis_or_a_lockout_are_not_admitted_here(db_limits, alice):
    policies = [limits.Policy(f"user:{alice.pk}", 60, 5, 100)]
    _made(policies)
    db_limits.REDIS_URL = "rediss://127.0.0.1:6379/0"  # Redis, admitted on the database thread
    assert nowait.admit(policies, 10) is None
    db_limits.REDIS_URL = ""
    assert nowait.admit([limits.Policy(f"user:{alice.pk}", 60, 5, 100, lockout=30)], 1) is None
    assert _counter(policies[0]).reserved_tokens == 0


def test_a_database_other_than_sqlite_is_admitted_on_the_database_thread(
    db_limits, alice, monkeypatch
):
    policies = [limits.Policy(f"user:{alice.pk}", 60, 5, 100)]
    _made(policies)
    default = django_settings.DATABASES["default"]
    monkeypatch.setitem(default, "ENGINE", "django.db.backends.postgresql")
    nowait.close()
    assert nowait.admit(policies, 10) is None
    monkeypatch.undo()
    assert nowait.admit(policies, 10) is not None  # the same request, SQLite again
    assert _counter(policies[0]).reserved_tokens == 10


@pytest.mark.django_db(transaction=True)
async def test_the_relay_admits_without_the_database_thread(relay_settings, relay_data, alice):
    """With the counters made, a relay request is admitted in the event loop: the
    database thread held busy the whole time does not hold it up."""
    from chat.apikeys import authenticate_api_key
    from chat.relay import service, writer

    nowait.close()
    _provider, raw = relay_data
    await sync_to_async(RelayLimit.objects.create)(user=alice, monthly_tokens=10_000)
    api_key = await sync_to_async(authenticate_api_key)(raw)
    body = {"model": "gpt-relay", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    first = await service.prepared(api_key, dict(body))  # the caches filled, the counter made
    service.finish(first, service.Outcome(status="ok"))
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait)())  # the database thread held
    try:
        prep = await asyncio.wait_for(service.prepared(api_key, dict(body)), 2)
    finally:
        release.set()
        await busy
    assert prep.admission is not None and prep.admission.held == prep.cost
    counter = await sync_to_async(UsageCounter.objects.get)(scope=f"user:{alice.pk}")
    assert counter.reserved_tokens >= prep.cost
    service.finish(prep, service.Outcome(status="ok"))
    await sync_to_async(writer.flush)()  # the two records, before the test's data goes
    nowait.close()
