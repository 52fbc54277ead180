"""A few seconds of memory for what every relay request would otherwise read again.

API keys, the whitelist, the pools and the limits of a user change rarely; reading them
costs more database time than the rest of a request. They are kept
``LYCEUM_RELAY_CACHE_SECONDS`` (0 turns this off): a revoked key or a changed limit takes
effect within that time in every process. Admission itself (buckets, budgets) is never
cached.

Entries are kept fresh by a keeper task (:func:`ensure_keeper`), not by the requests that
read them: an entry used in the last ``KEEP_WARM_SECONDS`` is reloaded before it expires,
all such entries in one trip to the database thread. A reload started by a request ran on
the database thread while that request was being admitted and its upstream called, and
the two threads' handing over of the GIL (up to 5 ms a turn) came on top of its first
token: a paced stream a second long started every reload itself, and paid for it each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

from django.conf import settings

from chat.relay import quiet

logger = logging.getLogger(__name__)
T = TypeVar("T")
KEEP_WARM_SECONDS = 10.0  # an entry not read for this long is left to expire
_store: dict[Hashable, tuple[float, Any]] = {}
_loaders: dict[Hashable, Callable[[], Any]] = {}
_used: dict[Hashable, float] = {}  # key -> when last read (monotonic)
_offline: contextvars.ContextVar[bool] = contextvars.ContextVar("relay_offline", default=False)


class Miss(Exception):
    """Not in memory, and ``offline()`` forbids loading it here.

    ``key`` and ``load`` (when known) let the caller :func:`fill` it and try again.
    """

    def __init__(self, key: Hashable, load: Callable[[], Any] | None = None) -> None:
        super().__init__(key)
        self.key, self.load = key, load


_filling: dict[Hashable, asyncio.Future[Any]] = {}


async def fill(key: Hashable, load: Callable[[], Any], *, keep: bool = True) -> Any:
    """``cached(key, load)`` on the database thread, once however many requests ask at once
    (a burst after the entry expired makes one database trip, not one per request)."""
    from channels.db import database_sync_to_async

    running = _filling.get(key)
    if running is None:
        running = asyncio.ensure_future(database_sync_to_async(cached)(key, load, keep=keep))
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
    (with ``load``, the keeper reloads the entry before it expires while it is read)."""
    ttl = settings.LYCEUM_RELAY_CACHE_SECONDS
    if ttl <= 0:
        return False, None
    hit = _store.get(key)
    now = time.monotonic()
    if hit is not None and hit[0] > now:
        _used[key] = now
        if load is not None:
            _loaders[key] = load
        return True, hit[1]
    return False, None


def ensure_keeper() -> None:
    """Start this event loop's keeper (call from the loop; cheap when it runs)."""
    global _keeper
    if settings.LYCEUM_RELAY_CACHE_SECONDS <= 0 or (_keeper is not None and not _keeper.done()):
        return
    loop = asyncio.get_running_loop()
    # A fresh context: its database calls go to the process's own database thread.
    _keeper = loop.create_task(_keep(), context=contextvars.Context())


_keeper: asyncio.Task[None] | None = None


async def _keep() -> None:
    from channels.db import database_sync_to_async

    while True:
        ttl = settings.LYCEUM_RELAY_CACHE_SECONDS
        await asyncio.sleep(max(0.05, ttl / 4))
        due = _due(time.monotonic(), ttl)
        if due:
            await quiet.moment()
            await database_sync_to_async(_reload)(due)


def _due(now: float, ttl: float) -> list[tuple[Hashable, Callable[[], Any]]]:
    """The entries read lately that expire within half the cache time."""
    due = []
    for key, used in list(_used.items()):
        if now - used > KEEP_WARM_SECONDS:
            _used.pop(key, None)
            _loaders.pop(key, None)
            continue
        hit, load = _store.get(key), _loaders.get(key)
        if hit is not None and load is not None and hit[0] - now < ttl / 2:
            due.append((key, load))
    return due


def _reload(due: list[tuple[Hashable, Callable[[], Any]]]) -> None:
    for key, load in due:
        try:
            _put(key, load())
        except Exception:  # noqa: BLE001 - a request loads it again (and sees the error)
            _store.pop(key, None)
            logger.warning("reloading a relay cache entry failed", exc_info=True)


def _put(key: Hashable, value: Any) -> None:
    if len(_store) > 10_000:
        clear()
    _store[key] = (time.monotonic() + settings.LYCEUM_RELAY_CACHE_SECONDS, value)


def cached(key: Hashable, load: Callable[[], T], *, keep: bool = True) -> T:
    """``key``'s value, loaded with ``load`` when not held (``keep``: the keeper reloads
    it while it is read; not for a one-off such as a warm-up that loads other entries)."""
    ttl = settings.LYCEUM_RELAY_CACHE_SECONDS
    if ttl <= 0:
        if _offline.get():
            raise Miss(key)  # nothing kept: nothing to fill
        return load()
    now = time.monotonic()
    hit = _store.get(key)
    if keep:
        _used[key] = now
        _loaders[key] = load
    if hit is not None and hit[0] > now:
        return hit[1]  # type: ignore[no-any-return]
    if _offline.get():
        raise Miss(key, load)
    value = load()
    _put(key, value)
    return value


def forget(key: Hashable) -> None:
    """Drop ``key`` (what it holds changed in this process): the next read loads it."""
    _store.pop(key, None)


def forget_where(test: Callable[[Hashable], bool]) -> None:
    for key in [key for key in _store if test(key)]:
        _store.pop(key, None)


def clear() -> None:
    _store.clear()
    _used.clear()
    _loaders.clear()
