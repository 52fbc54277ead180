"""A few seconds of memory for what every relay request would otherwise read again.

API keys, the whitelist, the pools and the limits of a user change rarely; reading them
costs more database time than the rest of a request. They are kept
``LYCEUM_RELAY_CACHE_SECONDS`` (0 turns this off): a revoked key or a changed limit takes
effect within that time in every process. Admission itself (buckets, budgets) is never
cached.
"""

from __future__ import annotations

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
    """Not in memory, and ``offline()`` forbids loading it here."""


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
            raise Miss(key)
        return load()
    now = time.monotonic()
    hit = _store.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]  # type: ignore[no-any-return]
    if _offline.get():
        raise Miss(key)
    value = load()
    if len(_store) > 10_000:
        _store.clear()
    _store[key] = (now + ttl, value)
    return value


def clear() -> None:
    _store.clear()
