"""A few seconds of memory for what every relay request would otherwise read again.

API keys, the whitelist, the pools and the limits of a user change rarely; reading them
costs more database time than the rest of a request. They are kept
``LYCEUM_RELAY_CACHE_SECONDS`` (0 turns this off): a revoked key or a changed limit takes
effect within that time in every process. Admission itself (buckets, budgets) is never
cached.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from django.conf import settings

T = TypeVar("T")
_store: dict[Hashable, tuple[float, Any]] = {}


def cached(key: Hashable, load: Callable[[], T]) -> T:
    ttl = settings.LYCEUM_RELAY_CACHE_SECONDS
    if ttl <= 0:
        return load()
    now = time.monotonic()
    hit = _store.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]  # type: ignore[no-any-return]
    value = load()
    if len(_store) > 10_000:
        _store.clear()
    _store[key] = (now + ttl, value)
    return value


def clear() -> None:
    _store.clear()
