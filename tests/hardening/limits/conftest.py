"""Fixtures of the tests of §4 (rate limits and quotas): the two counter stores and a clock."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest

from chat import throttle
from chat.relay import limits, ttlcache

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["database", "redis"])
def counters(request, settings):
    """The limits' counters in the database (no REDIS_URL) or in Redis (a prefix of its own)."""
    settings.REDIS_URL = ""
    throttle.forget()
    ttlcache.clear()
    if request.param == "database":
        yield "database"
        throttle.forget()
        return
    import redis

    settings.REDIS_URL = REDIS_URL
    settings.LYCEUM_REDIS_PREFIX = f"test-ratelimits-{uuid.uuid4().hex[:10]}"
    yield "redis"
    throttle.forget()
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{settings.LYCEUM_REDIS_PREFIX}:*"):
        client.delete(key)


class Clock:
    """Time as the limits see it, moved forward by the test."""

    def __init__(self) -> None:
        self.offset = 0.0

    def time(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    fake = SimpleNamespace(time=clock.time, monotonic=time.monotonic)
    monkeypatch.setattr(limits, "time", fake)
    monkeypatch.setattr(throttle, "time", fake)
    return clock
