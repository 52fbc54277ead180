"""The doors anyone can knock on: sign-in and API keys, throttled per username and address.

Both are buckets of ``chat/relay/limits.py`` with a lockout (one code for every limit,
Redis or the database):

* Sign-in takes one attempt from the username's bucket and the address's *before* the
  password is hashed: a flood of guesses is refused for the price of a counter, and
  concurrent guesses cannot slip past the count. A sign-in that succeeds fills the
  username's bucket again and gives the address its attempt back.
* A bad API key (unknown, revoked) takes one from its address's bucket. Once refused,
  the address is remembered in this process until the lockout ends, so a bad key from it
  costs no key lookup and no counter at all.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from chat.relay import limits


class Locked(Exception):
    """A door shut for ``retry_after`` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(retry_after)
        self.retry_after = max(1, int(retry_after))

    @property
    def minutes(self) -> int:
        return max(1, math.ceil(self.retry_after / 60))


def client_address(remote_addr: str, headers: Mapping[str, str]) -> str:
    """The caller's address: the connection's, or the trusted proxy header's
    (``LYCEUM_CLIENT_ADDRESS_HEADER``). IPv6 counts per /64: one host holds all of one."""
    name = settings.LYCEUM_CLIENT_ADDRESS_HEADER
    raw = remote_addr or ""
    if name:
        value = headers.get(name) or headers.get(name.lower()) or ""
        # A proxy appends the address it saw: the last one is the only one it vouches for.
        candidate = value.split(",")[-1].strip()
        if candidate:
            raw = candidate
    try:
        address = ipaddress.ip_address(raw.strip("[]"))
    except ValueError:
        return raw[:64] or "unknown"
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def request_address(request: Any) -> str:
    return client_address(request.META.get("REMOTE_ADDR", ""), request.headers)


def scope_address(scope: Mapping[str, Any], headers: Mapping[bytes, bytes]) -> str:
    """:func:`client_address` of a raw ASGI request."""
    client = scope.get("client") or ("", 0)
    name = settings.LYCEUM_CLIENT_ADDRESS_HEADER
    value = headers.get(name.lower().encode("latin-1"), b"").decode("latin-1") if name else ""
    return client_address(str(client[0] or ""), {name: value} if name else {})


def _scope(kind: str, value: str) -> str:
    # UsageCounter.scope holds 64 characters; usernames and addresses may be longer.
    return f"{kind}:{hashlib.sha256(value.encode('utf-8')).hexdigest()[:40]}"


def _policy(
    scope: str, attempts: int, window_minutes: float, lockout_minutes: float
) -> limits.Policy:
    return limits.Policy(
        scope,
        requests_per_minute=attempts / window_minutes,
        burst=attempts,
        monthly_tokens=0,
        lockout=lockout_minutes * 60,
    )


# --- sign-in --------------------------------------------------------------------------------------


def _login_policies(username: str, address: str) -> list[limits.Policy]:
    window = settings.LYCEUM_LOGIN_WINDOW_MINUTES
    lockout = settings.LYCEUM_LOGIN_LOCKOUT_MINUTES
    policies = []
    if settings.LYCEUM_LOGIN_ATTEMPTS:
        name = username.strip().casefold()
        policies.append(
            _policy(_scope("login:u", name), settings.LYCEUM_LOGIN_ATTEMPTS, window, lockout)
        )
    if settings.LYCEUM_LOGIN_ADDRESS_ATTEMPTS:
        attempts = settings.LYCEUM_LOGIN_ADDRESS_ATTEMPTS
        policies.append(_policy(_scope("login:a", address), attempts, window, lockout))
    return policies


def begin_login(username: str, address: str) -> None:
    """Count a sign-in attempt (before its password is checked), or raise :class:`Locked`."""
    policies = _login_policies(username, address)
    if not policies:
        return
    try:
        limits.admit(policies, 0, take=True, hold=False)
    except limits.Refused as exc:
        raise Locked(exc.retry_after) from None


def login_succeeded(username: str, address: str) -> None:
    """The attempt was right: the username starts afresh, the address gets it back."""
    for policy in _login_policies(username, address):
        if policy.scope.startswith("login:u:"):
            limits.reset(policy)
        else:
            limits.give_back(policy)


# --- API keys -------------------------------------------------------------------------------------

_shut: dict[str, float] = {}  # address -> when its lockout ends (this process's memory)


def key_door_shut(address: str) -> Locked | None:
    """The lockout of ``address`` as this process remembers it (no trip anywhere)."""
    until = _shut.get(address)
    if until is None:
        return None
    left = until - time.time()
    if left <= 0:
        _shut.pop(address, None)
        return None
    return Locked(math.ceil(left))


def bad_key(address: str) -> Locked | None:
    """Count an unknown or revoked key from ``address``; its lockout when that was one
    too many (sync: the database thread when the counters are in the database)."""
    attempts = settings.LYCEUM_BAD_KEY_ATTEMPTS
    if not attempts:
        return None
    lockout = settings.LYCEUM_BAD_KEY_LOCKOUT_MINUTES
    try:
        limits.take(_policy(_scope("badkey:a", address), attempts, lockout, lockout))
    except limits.Refused as exc:
        if len(_shut) > 10_000:
            _shut.clear()
        _shut[address] = time.time() + exc.retry_after
        return Locked(exc.retry_after)
    return None


def forget() -> None:
    """Drop this process's memory of shut addresses (tests)."""
    _shut.clear()
