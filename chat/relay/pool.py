"""The upstream keys of a provider: spread over, cooled down, recorded.

A provider's pool is its enabled ``ProviderKey`` rows plus the provider's own ``api_key``
(one key for the environment bootstrap). Requests take them round robin; a key that
answered 429 or 401/403 cools down for ``LYCEUM_RELAY_KEY_COOLDOWN`` (in the database, so
every process sees it, and in this process); what each request did is added to the key's
counters. Clear keys live only in this process's memory, never in a log or an error.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from chat.catalog import ENV_PROVIDER
from chat.models import Provider, ProviderKey
from chat.relay import secrets
from chat.relay.ttlcache import cached


@dataclass(frozen=True)
class PoolKey:
    provider: str
    key_id: int | None  # None: the provider's own api_key
    secret: str

    def __repr__(self) -> str:  # never the secret
        return f"PoolKey({self.provider}/{self.key_id})"


@dataclass(frozen=True)
class Upstream:
    provider: str
    base_url: str
    keys: list[PoolKey]  # in the order to try
    cooling_for: float  # when every key cools down: seconds until the first is back


_turns: dict[str, itertools.count[int]] = {}
_cooling: dict[tuple[str, int | None], float] = {}  # (provider, key id) -> monotonic end


Pooled = tuple[str, str, list[PoolKey]]  # provider name, base URL, keys


def pool_of(provider_name: str) -> Pooled:
    """The provider's pool, read at most once per cache time (takes no turn)."""
    return cached(("pool", provider_name), lambda: _load(provider_name))


def upstream_for(provider_name: str) -> Upstream:
    """The provider's keys in the order to try (takes the next turn of the round robin)."""
    return ordered(pool_of(provider_name))


def ordered(pooled: Pooled) -> Upstream:
    return _ordered(*pooled)


def _load(provider_name: str) -> Pooled:
    if provider_name == ENV_PROVIDER:
        keys = [PoolKey(ENV_PROVIDER, None, settings.LYCEUM_OPENAI_API_KEY)]
        return ENV_PROVIDER, settings.LYCEUM_OPENAI_BASE_URL, keys
    row = Provider.objects.get(name=provider_name)
    now = timezone.now()
    keys = []
    pooled = list(ProviderKey.objects.filter(provider=row, enabled=True).order_by("pk"))
    for key in pooled:
        if key.cooldown_until is not None and key.cooldown_until > now:
            remaining = (key.cooldown_until - now).total_seconds()
            _cooling[(row.name, key.pk)] = time.monotonic() + remaining
            continue
        keys.append(PoolKey(row.name, key.pk, secrets.decrypt(key.secret)))
    if row.api_key or not pooled:  # a provider without any key (a local server) too
        keys.append(PoolKey(row.name, None, secrets.decrypt(row.api_key)))
    return row.name, row.base_url, keys


def _ordered(provider: str, base_url: str, keys: list[PoolKey]) -> Upstream:
    now = time.monotonic()
    ready = [k for k in keys if _cooling.get((provider, k.key_id), 0) <= now]
    cooling_for = 0.0
    if not ready:
        ends = [_cooling.get((provider, k.key_id), now) for k in keys]
        ends += [end for (name, _id), end in _cooling.items() if name == provider and end > now]
        cooling_for = min(ends, default=now + 1) - now
    if len(ready) > 1:
        start = next(_turns.setdefault(provider, itertools.count())) % len(ready)
        ready = ready[start:] + ready[:start]
    return Upstream(provider, base_url.rstrip("/"), ready, max(0.0, cooling_for))


def cool_down(key: PoolKey, seconds: float | None = None) -> None:
    seconds = settings.LYCEUM_RELAY_KEY_COOLDOWN if seconds is None else seconds
    _cooling[(key.provider, key.key_id)] = time.monotonic() + seconds


@dataclass(frozen=True)
class KeyOutcome:
    key: PoolKey
    status: int | None  # HTTP status, None for a network failure
    failed: bool
    error: str = ""
    cooled: bool = False


def record_outcomes(outcomes: list[KeyOutcome]) -> None:
    """Add the attempts to their keys' records (and store cool-downs): one update per key.

    Call from a sync thread; ``outcomes`` may be those of many requests, oldest first.
    """
    now = timezone.now()
    per_key: dict[int, list[KeyOutcome]] = {}
    for outcome in outcomes:
        if outcome.key.key_id is not None:
            per_key.setdefault(outcome.key.key_id, []).append(outcome)
    for key_id, attempts in per_key.items():
        last = attempts[-1]
        failures = [a for a in attempts if a.failed]
        updates: dict[str, object] = {
            "requests": F("requests") + len(attempts),
            "last_status": last.status,
            "last_used_at": now,
        }
        if failures:
            updates["failures"] = F("failures") + len(failures)
            updates["last_error"] = failures[-1].error[:200]
        if any(a.cooled for a in attempts):
            updates["cooldown_until"] = now + timedelta(seconds=settings.LYCEUM_RELAY_KEY_COOLDOWN)
        ProviderKey.objects.filter(pk=key_id).update(**updates)
