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


def peek(key: Hashable, load: Callable[[], Any] | None = None) -> tuple[bool, Any]:
    """(True, value) when ``key`` is held and fresh, else (False, None); never loads here
    (with ``load``, an entry past half its time is refreshed in the background)."""
    ttl = settings.LYCEUM_RELAY_CACHE_SECONDS
    if ttl <= 0:
        return False, None
    hit = _store.get(key)
    now = time.monotonic()
    if hit is not None and hit[0] > now:
        if load is not None and hit[0] - now < ttl / 2:
            _refresh_ahead(key, load)
        return True, hit[1]
    return False, None


def _refresh_ahead(key: Hashable, load: Callable[[], Any]) -> None:
    """Reload ``key`` on the database thread while its value still serves: steady traffic
    never waits for a load, and a value is still never older than the cache time."""
    if key in _filling:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(_reload(key, load), context=contextvars.Context())
    _filling[key] = task
    task.add_done_callback(lambda _done: _filling.pop(key, None))


async def _reload(key: Hashable, load: Callable[[], Any]) -> Any:
    from channels.db import database_sync_to_async

    def reload() -> Any:
        value = load()
        _put(key, value)
        return value

    return await database_sync_to_async(reload)()


def _put(key: Hashable, value: Any) -> None:
    if len(_store) > 10_000:
        _store.clear()
    _store[key] = (time.monotonic() + settings.LYCEUM_RELAY_CACHE_SECONDS, value)


def cached(key: Hashable, load: Callable[[], T]) -> T:
    ttl = settings.LYCEUM_RELAY_CACHE_SECONDS
    if ttl <= 0:
        if _offline.get():
            raise Miss(key)  # nothing kept: nothing to fill
        return load()
    now = time.monotonic()
    hit = _store.get(key)
    if hit is not None and hit[0] > now:
        if hit[0] - now < ttl / 2 and _offline.get():
            _refresh_ahead(key, load)
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
