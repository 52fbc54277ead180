"""How the channel layers connect to Redis (used by the settings, and by tests)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

# channels_redis blocks 5 s per BZPOPMIN; redis-py >= 8 times reads out after 5 s by
# default, which races it and kills idle receive loops. Reads must outlast the pop.
SOCKET_TIMEOUT = 30.0


def redis_host(url: str, **extra: Any) -> dict[str, Any]:
    """One Redis host of a channel layer.

    A connection pooled before a Redis restart fails its first command ("Connection
    closed by server"); ``retry_on_error`` makes redis-py retry such a command once on
    that connection, reconnected, instead of failing it (and whatever sent it).
    """
    return {
        "address": url,
        "socket_timeout": SOCKET_TIMEOUT,
        "retry_on_error": [RedisConnectionError],
        **extra,
    }
