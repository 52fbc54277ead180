"""A few seconds of memory for what every relay request would otherwise read again.

API keys, the whitelist, the pools and the limits of a user change rarely; reading them
costs more database time than the rest of a request. They are kept
``LYCEUM_RELAY_CACHE_SECONDS`` (0 turns this off): a revoked key or a changed limit takes
effect within that time in every process. Admission itself (buckets, budgets) is never
cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

from django.conf import settings

T = TypeVar("T")
_store: dict[Hashable, tuple[float, Any]] = {}
_offline: contextvars.ContextVar[bool] = contextvars.ContextVar("relay_offline", default=False)


class Miss(Exception):
    """Not in memory, and ``offline()`` forbids loading it here.

    ``key`` and ``load`` (when known) let the caller :func:`fill` it and try again.
    """

    def __init__(self, key: Hashable, load: Callable[[], Any] | None = None) -> None:
        super().__init__(key)
        self.key, self.load = key, load


_filling: dict[Hashable, asyncio.Future[Any]] = {}


async def fill(key: Hashable, load: Callable[[], Any]) -> Any:
    """``cached(key, load)`` on the database thread, once however many requests ask at once
    (a burst after the entry expired makes one database trip, not one per request)."""
    from channels.db import database_sync_to_async

    running = _filling.get(key)
    if running is None:
        running = asyncio.ensure_future(database_sync_to_async(cached)(key, load))
        _filling[key] = running
        running.add_done_callback(lambda _done: _filling.pop(key, None))
    return await asyncio.shield(running)


@contextlib.contextmanager
def offline() -> Iterator[None]:
    token = _offline.set(True)
    try:
        yield
    finally:
        _offline.reset(token)


def is_offline() -> bool:
    return _offline.get()


def peek(key: Hashable) -> tuple[bool, Any]:
    """(True, value) when ``key`` is held and fresh, else (False, None); never loads."""
    if settings.LYCEUM_RELAY_CACHE_SECONDS <= 0:
        return False, None
    hit = _store.get(key)
    if hit is not None and hit[0] > time.monotonic():
        return True, hit[1]
    return False, None


def cached(key: Hashable, load: Callable[[], T]) -> T:
    ttl = settings.LYCEUM_RELAY_CACHE_SECONDS
    if ttl <= 0:
        if _offline.get():
            raise Miss(key)  # nothing kept: nothing to fill
        return load()
    now = time.monotonic()
    hit = _store.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]  # type: ignore[no-any-return]
    if _offline.get():
        raise Miss(key, load)
    value = load()
    if len(_store) > 10_000:
        _store.clear()
    _store[key] = (now + ttl, value)
    return value


def clear() -> None:
    _store.clear()
