"""Rate limits and monthly token budgets, per user and per API key, that hold under concurrency.

A *policy* is one scope's limits: a bucket of ``burst`` requests refilled at
``requests_per_minute``, and a monthly token budget (0: none). A request is admitted
when every policy that applies lets it through, all at once or not at all:

* the bucket has a whole request left (it is taken);
* what the request may cost (its prompt estimate plus ``max_tokens``, or
  ``LYCEUM_RELAY_RESERVE_TOKENS``) fits in the budget beside the tokens already used and
  those held by requests still running (it is held).

When the request ends, :func:`settle` swaps what was held for what was used. With
``REDIS_URL`` the check-and-take is one Lua script (atomic in Redis); without it, one
transaction with the scopes' ``UsageCounter`` rows locked (``select_for_update``; SQLite's
IMMEDIATE transactions serialise it the same way). Chat runs add their tokens with
:func:`add_used` and are checked with :func:`check_run`: the same budget for the UI and
the relay.

The same buckets guard the other doors (``chat/throttle.py``: sign-in, bad API keys;
``chat/quotas.py``: messages per user): :func:`take` one request from a bucket that may
have a *lockout* (once refused, it stays shut that long, however slowly the caller
retries), :func:`reset` it, or :func:`give_back` a request that turned out fine.
"""

from __future__ import annotations

import asyncio
import calendar
import hashlib
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import Least
from django.utils.translation import gettext_noop

from chat import rows
from chat.models import RelayLimit, UsageCounter, UsageRecord
from chat.relay import redisline, ttlcache


@dataclass(frozen=True)
class Policy:
    scope: str  # "user:<id>", "key:<id>", or a door's ("login:user:<hash>", ...)
    requests_per_minute: float
    burst: int
    monthly_tokens: int  # 0: no budget
    lockout: float = 0.0  # seconds a refused bucket stays shut (0: until a request refills)


class Refused(Exception):
    """Over a limit: answer 429 with ``Retry-After: retry_after``."""

    def __init__(self, reason: str, retry_after: int, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # "rate_limit" or "budget"
        self.retry_after = max(1, retry_after)
        self.message = message


@dataclass
class Admission:
    policies: list[Policy]
    period: str
    held: int  # tokens held against each budget
    settled: bool = field(default=False)


def policies_for(user: Any, api_key: Any = None) -> list[Policy]:
    rows = {
        ("user" if row.user_id else "key"): row
        for row in RelayLimit.objects.filter(
            Q(user=user) | (Q(api_key=api_key) if api_key is not None else Q(pk__in=[]))
        )
    }
    policies = [_policy(f"user:{user.pk}", rows.get("user"))]
    if "key" in rows:
        policies.append(_policy(f"key:{api_key.pk}", rows["key"]))
    return policies


def user_policy(user_id: Any) -> Policy:
    """The user's own limits (no API key's), kept a few seconds like the relay's.

    Every chat send and run end asks for it; a changed limit takes effect within
    ``LYCEUM_RELAY_CACHE_SECONDS``, as in the relay.
    """

    def load() -> Policy:
        return _policy(f"user:{user_id}", _user_limits(user_id))

    return ttlcache.cached(("user-policy", user_id), load)


def _user_limits(user_id: Any) -> RelayLimit | None:
    """The user's row of limits (one at most), in a written-out statement: every send of a
    user not asked for a few seconds reads it on the process's one database thread, where
    the ORM's building of the query cost more than running it (chat/rows.py)."""
    sql = (
        f"SELECT {rows.select_list(RelayLimit, 'r')} FROM {rows.table(RelayLimit)} r "
        f"WHERE r.{rows.column(RelayLimit, 'user')} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [rows.prep(RelayLimit, "user", user_id)])
        row = cursor.fetchone()
    return None if row is None else rows.instance(RelayLimit, row)


def _policy(scope: str, row: RelayLimit | None) -> Policy:
    def pick(name: str, default: int) -> int:
        value = getattr(row, name, None) if row is not None else None
        return default if value is None else int(value)

    return Policy(
        scope,
        max(1, pick("requests_per_minute", settings.LYCEUM_RELAY_RPM)),
        max(1, pick("burst", settings.LYCEUM_RELAY_BURST)),
        pick("monthly_tokens", settings.LYCEUM_MONTHLY_TOKENS),
    )


def period_of(when: datetime | None = None) -> str:
    when = when or datetime.now(UTC)
    return f"{when.year:04d}-{when.month:02d}"


def seconds_to_next_period(when: datetime | None = None) -> int:
    when = when or datetime.now(UTC)
    days = calendar.monthrange(when.year, when.month)[1]
    end = datetime(when.year, when.month, days, tzinfo=UTC).timestamp() + 86400
    return max(1, math.ceil(end - when.timestamp()))


def used_in_period(scope: str, period: str) -> int:
    """Tokens the usage records of ``scope`` count in ``period`` (seeds a counter)."""
    year, month = (int(part) for part in period.split("-"))
    kind, _, raw_ident = scope.partition(":")
    ident = int(raw_ident)
    records = UsageRecord.objects.filter(created_at__year=year, created_at__month=month)
    records = records.filter(user_id=ident) if kind == "user" else records.filter(api_key_id=ident)
    total = records.aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    return int(total["p"] or 0) + int(total["c"] or 0)


def admit(policies: list[Policy], cost: int, *, take: bool = True, hold: bool = True) -> Admission:
    """Take one request from every bucket and hold ``cost`` tokens, or raise :class:`Refused`."""
    period = period_of()
    if settings.REDIS_URL:
        _redis_admit(policies, period, cost, take, hold)
    else:
        if ttlcache.is_offline():  # the database's counters: only on the database thread
            raise ttlcache.Miss("limits")
        _db_admit(policies, period, cost, take, hold)
    return Admission(policies, period, cost if hold else 0)


def settle(admission: Admission, used: int) -> None:
    """The request ended: release what it held, count what it used (once)."""
    if admission.settled:
        return
    admission.settled = True
    _change(admission.policies, admission.period, used=used, held=-admission.held)


def settle_many(settled: list[tuple[Admission, int]]) -> None:
    """:func:`settle` for many requests: one counter change per scope and period."""
    totals: dict[tuple[Policy, str], list[int]] = {}
    for admission, used in settled:
        if admission.settled:
            continue
        admission.settled = True
        for policy in admission.policies:
            total = totals.setdefault((policy, admission.period), [0, 0])
            total[0] += used
            total[1] -= admission.held
    for (policy, period), (used, held) in totals.items():
        _change([policy], period, used=used, held=held)


def add_used(policies: list[Policy], used: int) -> None:
    """Count tokens used outside the relay (a chat run)."""
    if used:
        _change(policies, period_of(), used=used, held=0)


def check_run(user_id: Any) -> None:
    """Refuse a chat run when the user's budget is spent (the bucket is the relay's alone)."""
    policy = user_policy(user_id)
    if policy.monthly_tokens:
        admit([policy], 1, take=False, hold=False)


def take(policy: Policy) -> None:
    """Take one request from ``policy``'s bucket, or raise :class:`Refused` (a refusal
    starts the policy's lockout)."""
    admit([policy], 0, take=True, hold=False)


def reset(policy: Policy) -> None:
    """Fill ``policy``'s bucket again and lift its lockout (a sign-in that succeeded)."""
    if settings.REDIS_URL:
        _redis().delete(_bucket_key(policy.scope))
        return
    UsageCounter.objects.filter(scope=policy.scope, period=period_of()).update(
        bucket=-1.0, bucket_at=0.0, locked_until=0.0
    )


def give_back(policy: Policy) -> None:
    """Return one request to ``policy``'s bucket (taken for a request that turned out fine);
    a lockout already started stays."""
    if settings.REDIS_URL:
        _redis().register_script(_GIVE_BACK)(keys=[_bucket_key(policy.scope)], args=[policy.burst])
        return
    UsageCounter.objects.filter(scope=policy.scope, period=period_of(), bucket__gte=0).update(
        bucket=Least(F("bucket") + 1, float(policy.burst))
    )


def _change(policies: list[Policy], period: str, *, used: int, held: int) -> None:
    budgeted = [p for p in policies if p.monthly_tokens]
    if not budgeted or (not used and not held):
        return
    if settings.REDIS_URL:
        client = _redis()
        pipe = client.pipeline(transaction=True)
        for policy in budgeted:
            key = _budget_key(policy.scope, period)
            if client.exists(key):
                pipe.hincrby(key, "used", used)
                pipe.hincrby(key, "held", held)
        pipe.execute()
        return
    UsageCounter.objects.filter(scope__in=[p.scope for p in budgeted], period=period).update(
        used_tokens=F("used_tokens") + used, reserved_tokens=F("reserved_tokens") + held
    )


# In English in the relay's OpenAI-shaped errors; a chat page shows them translated
# (``gettext`` of the message, chat/actions.py).
BUDGET_SPENT = gettext_noop(
    "The monthly token budget is spent (or too little is left for this request's max_tokens)."
)
TOO_MANY_REQUESTS = gettext_noop("Too many requests: slow down and retry after a moment.")


def _refusal(reason: str, wait: float) -> Refused:
    if reason == "budget":
        return Refused("budget", seconds_to_next_period(), BUDGET_SPENT)
    return Refused("rate_limit", math.ceil(wait), TOO_MANY_REQUESTS)


# --- the database ---------------------------------------------------------------------------


def _db_admit(policies: list[Policy], period: str, cost: int, take: bool, hold: bool) -> None:
    """The check-and-take in one transaction: the scopes' counters read and locked in one
    statement, then one update per counter (raw SQL: the ORM's query building cost more
    than the statements themselves, about 0.8 ms of CPU for two policies)."""
    now = time.time()
    with transaction.atomic():
        connection = transaction.get_connection()
        counters = _locked_counters(connection, policies, period)
        levels, shut, wait, reason = _verdict(policies, counters, now, cost, take)
        if reason:
            for policy, counter in zip(policies, counters, strict=True):
                if counter[0] in shut:
                    UsageCounter.objects.filter(pk=counter[0]).update(
                        locked_until=now + policy.lockout
                    )
        else:
            _db_take(connection, policies, counters, levels, now, cost, take, hold)
    if reason:  # raised out of the block, the lockout just written would be rolled back
        raise _refusal(reason, wait)


def _verdict(
    policies: list[Policy], counters: list[Counter], now: float, cost: int, take: bool
) -> tuple[list[float], list[int], float, str]:
    """What the counters say of a request costing ``cost``: each bucket's level now, the
    counters whose lockout a refusal starts, the wait, and the refusal's reason ("" when
    admitted)."""
    wait, reason = 0.0, ""
    levels = []
    shut: list[int] = []  # counters whose lockout this refusal starts
    for policy, counter in zip(policies, counters, strict=True):
        pk, used, reserved, bucket, bucket_at, locked_until = counter
        level = _refill(policy, bucket, bucket_at, now)
        levels.append(level)
        if take and locked_until > now:
            wait = max(wait, locked_until - now)
            reason = reason or "rate_limit"
        elif take and level < 1:
            if policy.lockout:
                shut.append(pk)
                wait = max(wait, policy.lockout)
            else:
                wait = max(wait, (1 - level) * 60 / policy.requests_per_minute)
            reason = reason or "rate_limit"
        budget = policy.monthly_tokens
        if budget and used + reserved + cost > budget:
            reason = "budget"
    return levels, shut, wait, reason


# One counter as _db_admit reads it: pk, used_tokens, reserved_tokens, bucket, bucket_at,
# locked_until.
Counter = tuple[int, int, int, float, float, float]


def _db_take(
    connection: Any,
    policies: list[Policy],
    counters: list[Counter],
    levels: list[float],
    now: float,
    cost: int,
    take: bool,
    hold: bool,
) -> None:
    table = connection.ops.quote_name(UsageCounter._meta.db_table)
    with connection.cursor() as cursor:
        for sql, params in _take_statements(
            table, "%s", policies, counters, levels, now, cost, take, hold
        ):
            cursor.execute(sql, params)


def _take_statements(
    table: str,
    mark: str,
    policies: list[Policy],
    counters: list[Counter],
    levels: list[float],
    now: float,
    cost: int,
    take: bool,
    hold: bool,
) -> list[tuple[str, list[Any]]]:
    """The updates that take a request (one per counter), with ``mark`` as the
    placeholder (``%s`` through Django, ``?`` on a bare sqlite3 connection)."""
    statements = []
    for policy, counter, level in zip(policies, counters, levels, strict=True):
        sets: list[str] = []
        params: list[Any] = []
        if take:
            sets.append(f"bucket = {mark}, bucket_at = {mark}")
            params += [level - 1, now]
        if hold and policy.monthly_tokens:
            sets.append(f"reserved_tokens = reserved_tokens + {mark}")
            params.append(cost)
        if sets:
            sql = f"UPDATE {table} SET {', '.join(sets)} WHERE id = {mark}"  # noqa: S608 - no user text
            statements.append((sql, [*params, counter[0]]))
    return statements


def _refill(policy: Policy, bucket: float, at: float, now: float) -> float:
    if bucket < 0:
        return float(policy.burst)
    return min(float(policy.burst), bucket + max(0.0, now - at) * policy.requests_per_minute / 60)


def _locked_counters(connection: Any, policies: list[Policy], period: str) -> list[Counter]:
    """The policies' counters in ``period``, in their order, locked until the transaction
    ends (one ``SELECT ... FOR UPDATE`` in the rows' order; SQLite's IMMEDIATE transaction
    holds the whole database instead); a counter missing is created first."""
    table = connection.ops.quote_name(UsageCounter._meta.db_table)
    scopes = [policy.scope for policy in policies]
    sql = (
        "SELECT scope, id, used_tokens, reserved_tokens, bucket, bucket_at, locked_until "  # noqa: S608
        f"FROM {table} WHERE period = %s AND scope IN ({', '.join(['%s'] * len(scopes))}) "
        "ORDER BY id" + (" FOR UPDATE" if connection.features.has_select_for_update else "")
    )
    for _ in range(2):
        with connection.cursor() as cursor:
            cursor.execute(sql, [period, *scopes])
            found = {row[0]: tuple(row[1:]) for row in cursor.fetchall()}
        missing = [policy for policy in policies if policy.scope not in found]
        if not missing:
            return [found[scope] for scope in scopes]  # type: ignore[misc]
        for policy in missing:
            _create_counter(policy, period)
    raise RuntimeError("the usage counters could not be created")


def _create_counter(policy: Policy, period: str) -> None:
    seed = used_in_period(policy.scope, period) if policy.monthly_tokens else 0
    try:
        with transaction.atomic():
            UsageCounter.objects.create(scope=policy.scope, period=period, used_tokens=seed)
    except IntegrityError:
        pass  # another request created it first


# --- Redis ----------------------------------------------------------------------------------

# KEYS: bucket and budget key of each policy. ARGV: now, cost, take, hold, then per policy
# rpm, burst, budget, lockout. Returns {1} (admitted), {0, reason, wait} or {-1, i} (seed
# budget i). A refused bucket with a lockout is shut until now + lockout ('until').
_ADMIT = """
local now, cost = tonumber(ARGV[1]), tonumber(ARGV[2])
local take, hold = ARGV[3] == '1', ARGV[4] == '1'
local n = #KEYS / 2
local levels, shut, wait, reason = {}, {}, 0, ''
for i = 1, n do
  local rpm, burst = tonumber(ARGV[1 + 4 * i]), tonumber(ARGV[2 + 4 * i])
  local budget, lockout = tonumber(ARGV[3 + 4 * i]), tonumber(ARGV[4 + 4 * i])
  if take then
    local b = redis.call('HMGET', KEYS[2 * i - 1], 'level', 'at', 'until')
    local level, at, locked = tonumber(b[1]), tonumber(b[2]), tonumber(b[3]) or 0
    if level == nil then level = burst else level = math.min(burst, level + math.max(0, now - at) * rpm / 60) end
    levels[i] = level
    if locked > now then
      wait = math.max(wait, locked - now)
      if reason == '' then reason = 'rate_limit' end
    elseif level < 1 then
      if lockout > 0 then
        shut[#shut + 1] = i
        wait = math.max(wait, lockout)
      else
        wait = math.max(wait, (1 - level) * 60 / rpm)
      end
      if reason == '' then reason = 'rate_limit' end
    end
  end
  if budget > 0 then
    local u = redis.call('HMGET', KEYS[2 * i], 'used', 'held')
    if u[1] == false then return {-1, i} end
    if tonumber(u[1]) + (tonumber(u[2]) or 0) + cost > budget then reason = 'budget' end
  end
end
if reason ~= '' then
  for _, i in ipairs(shut) do
    local rpm, burst = tonumber(ARGV[1 + 4 * i]), tonumber(ARGV[2 + 4 * i])
    local lockout = tonumber(ARGV[4 + 4 * i])
    redis.call('HSET', KEYS[2 * i - 1], 'until', tostring(now + lockout))
    redis.call('EXPIRE', KEYS[2 * i - 1], math.ceil(lockout + burst * 60 / rpm) + 60)
  end
  return {0, reason, tostring(wait)}
end
for i = 1, n do
  local rpm, burst = tonumber(ARGV[1 + 4 * i]), tonumber(ARGV[2 + 4 * i])
  if take then
    redis.call('HSET', KEYS[2 * i - 1], 'level', tostring(levels[i] - 1), 'at', tostring(now))
    redis.call('EXPIRE', KEYS[2 * i - 1], math.ceil(burst * 60 / rpm) + 60)
  end
  if hold and tonumber(ARGV[3 + 4 * i]) > 0 then redis.call('HINCRBY', KEYS[2 * i], 'held', cost) end
end
return {1}
"""

# KEYS: a bucket. ARGV: its burst. One request back, when the bucket exists.
_GIVE_BACK = """
local level = tonumber(redis.call('HGET', KEYS[1], 'level'))
if level ~= nil then
  redis.call('HSET', KEYS[1], 'level', tostring(math.min(tonumber(ARGV[1]), level + 1)))
end
return 1
"""


MAX_REDIS_CONNECTIONS = 10_000


@lru_cache(maxsize=2)
def redis_client(url: str) -> Any:
    """A synchronous Redis client for ``url``, one per process (limits, recovery).

    The library's version given once: left out, redis-py looks its own version up in the
    installed packages' metadata for every new connection (about 0.4 ms of CPU each; a
    burst of a hundred relay admissions opens a hundred), then sends the same value.
    Threads may hold many connections at once (the database thread, the chat's own
    threads); the cap is Redis's own default ``maxclients`` rather than redis-py's 100.
    The relay's admissions in the event loop do not use this client
    (:class:`Pending`, ``chat/relay/redisline.py``).
    """
    import redis
    from redis.driver_info import DriverInfo

    return redis.Redis.from_url(
        url,
        socket_timeout=5,
        driver_info=DriverInfo(name="redis-py", lib_version=redis.__version__),
        max_connections=MAX_REDIS_CONNECTIONS,
    )


def _redis() -> Any:
    return redis_client(settings.REDIS_URL)


@lru_cache(maxsize=2)
def _admit_script(url: str) -> Any:
    return redis_client(url).register_script(_ADMIT)


def _prefix() -> str:
    return f"{settings.LYCEUM_REDIS_PREFIX}:relay"


def _bucket_key(scope: str) -> str:
    return f"{_prefix()}:bucket:{scope}"


def _budget_key(scope: str, period: str) -> str:
    return f"{_prefix()}:budget:{scope}:{period}"


def _script_keys_args(
    policies: list[Policy], period: str, cost: int, take: bool, hold: bool
) -> tuple[list[str], list[Any]]:
    keys: list[str] = []
    args: list[Any] = [repr(time.time()), cost, int(take), int(hold)]
    for policy in policies:
        keys += [_bucket_key(policy.scope), _budget_key(policy.scope, period)]
        args += [
            repr(float(policy.requests_per_minute)),
            policy.burst,
            policy.monthly_tokens,
            repr(float(policy.lockout)),
        ]
    return keys, args


def _admitted(result: Any) -> bool:
    """True for the script's {1}, :class:`Refused` for {0, ...}, False for {-1, i} (seed)."""
    if int(result[0]) == 1:
        return True
    if int(result[0]) == 0:
        reason = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
        raise _refusal(reason, float(result[2]))
    return False


class Pending:
    """A relay admission sent to Redis whose answer comes later (:meth:`result`).

    The script is written at once on this event loop's one connection to Redis
    (``chat/relay/redisline.py``, pipelined with every other admission waiting for its
    answer) and the caller does something else meanwhile (the relay connects to its
    upstream): Redis's round trip and the connect overlap. The answer is taken in
    whatever happens in between, so a caller that gives up can still learn what it was
    given (:meth:`add_done_callback`).
    """

    def __init__(self, connection: Any, policies: list[Policy], cost: int) -> None:
        self.policies, self.cost = policies, cost
        self.period = period_of()
        self._keys, self._args = _script_keys_args(policies, self.period, cost, True, True)
        self._connection = connection
        self._reply: Any = None
        self._done = False
        self._waiter: Any = None
        self._callbacks: list[Any] = []
        self._send(b"EVALSHA", _ADMIT_SHA)

    def _send(self, command: bytes, script: bytes) -> None:
        payload = redisline.encode(command, script, len(self._keys), *self._keys, *self._args)
        self._connection.send(payload, self._answered)

    def _answered(self, reply: Any) -> None:
        if isinstance(reply, redisline.ReplyError) and str(reply).startswith("NOSCRIPT"):
            self._send(b"EVAL", _ADMIT.encode())  # Redis lost its scripts; nothing was run
            return
        self._reply, self._done = reply, True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Any) -> None:
        """``callback(self)`` once the answer is in (now, when it is)."""
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    async def result(self) -> Admission | None:
        """The admission, :class:`Refused`, :class:`Unavailable`, or None: a budget not in
        Redis yet (nothing was taken; the caller admits the usual way, which seeds it)."""
        if not self._done:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self.answer()

    def answer(self) -> Admission | None:
        """:meth:`result` once :meth:`done`."""
        if not self._done:
            raise RuntimeError("the admission is not answered yet")
        reply = self._reply
        if isinstance(reply, redisline.Unavailable):
            raise Unavailable(str(reply))
        if isinstance(reply, redisline.ReplyError) or not isinstance(reply, list) or not reply:
            raise Unavailable(f"Redis answered the admission with an error: {reply}")
        if _admitted(reply):
            return Admission(self.policies, self.period, self.cost)
        return None


class Unavailable(Exception):
    """The limits could not be checked (Redis or the database unreachable or failing):
    nothing is known of what was taken. The relay answers 503 and records the request."""


_ADMIT_SHA = hashlib.sha1(_ADMIT.encode()).hexdigest().encode()  # noqa: S324 - Redis's own id


def admit_later(policies: list[Policy], cost: int) -> Pending | None:
    """:func:`admit` (take and hold) started now (call from the event loop) and answered
    by ``Pending.result()``, when the limits are in Redis at a ``redis://`` or ``unix://``
    URL; else None (admit the usual way)."""
    if not settings.REDIS_URL:
        return None
    connection = redisline.line_for(settings.REDIS_URL)
    if connection is None:
        return None
    return Pending(connection, policies, cost)


def _redis_admit(policies: list[Policy], period: str, cost: int, take: bool, hold: bool) -> None:
    client = _redis()
    keys, args = _script_keys_args(policies, period, cost, take, hold)
    script = _admit_script(settings.REDIS_URL)
    for _ in range(len(policies) + 1):
        result = script(keys=keys, args=args)
        if _admitted(result):
            return
        if ttlcache.is_offline():  # seeding reads the records: the database thread's work
            raise ttlcache.Miss("budget")
        policy = policies[int(result[1]) - 1]  # a budget not in Redis yet: seed it from records
        key = _budget_key(policy.scope, period)
        client.hsetnx(key, "used", used_in_period(policy.scope, period))
        client.expire(key, 40 * 86400)
    raise RuntimeError("could not seed the budget counters")
