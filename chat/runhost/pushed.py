"""The reply so far as the pages last saw it: a copy in Redis, written with every push.

The keeper checkpoints a run's reply to the database once per
``LYCEUM_CHECKPOINT_INTERVAL`` (a second), while pages are pushed it every
``LYCEUM_STREAM_PUSH_INTERVAL`` (a tenth of that). A process killed between two
checkpoints took with it text the pages had already shown. Writing the checkpoint at
every push would be ten transactions a second per process, each rewriting every
streaming reply; instead, with Redis, each stream snapshot sets the run's key in the
same pipeline as its publish, and before it: whatever a page was shown is in Redis.
Recovery (``transitions``) takes that copy when it is newer than the checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from chat.relay.limits import redis_client

logger = logging.getLogger(__name__)

# Long enough for a sweeper to find a dead run (its stale window) many times over.
PUSHED_TTL_SECONDS = 3600


@dataclass(frozen=True)
class PushedReply:
    round: int
    text: str
    reasoning: str
    at: float  # time.time() of the push


def pushed_key(run_id: Any) -> str:
    return f"{settings.LYCEUM_REDIS_PREFIX}:pushed:{run_id}"


def keep_args(run_id: str, round_: int, text: str, reasoning: str) -> tuple[str, bytes, int] | None:
    """What a stream snapshot's doorbell sets in Redis along with its publish (none
    without Redis: a lone process killed takes its pages with it)."""
    if not settings.REDIS_URL:
        return None
    return pushed_key(run_id), encode(round_, text, reasoning), PUSHED_TTL_SECONDS


def encode(round_: int, text: str, reasoning: str) -> bytes:
    return json.dumps([round_, text, reasoning, time.time()]).encode()


def decode(raw: bytes) -> PushedReply | None:
    try:
        round_, text, reasoning, at = json.loads(raw)
        return PushedReply(int(round_), str(text), str(reasoning), float(at))
    except (ValueError, TypeError):
        return None


def last_pushed(run_id: Any) -> PushedReply | None:
    """The run's last pushed snapshot, if Redis has one (never raises: the database's
    checkpoint is the fallback)."""
    if not settings.REDIS_URL:
        return None
    try:
        raw = redis_client(settings.REDIS_URL).get(pushed_key(run_id))
    except Exception:  # noqa: BLE001 - Redis down: recover from the checkpoint
        logger.warning("reading the pushed reply of run %s failed", run_id, exc_info=True)
        return None
    return decode(raw) if raw else None


def newer_than_checkpoint(
    pushed: PushedReply | None, round_: int, checkpoint_at: datetime | None
) -> bool:
    """Whether the pushed copy is of the round being recovered and later than the
    checkpoint (a retried reply starts again: the later one is the truth, not the
    longer)."""
    if pushed is None or pushed.round != round_:
        return False
    return checkpoint_at is None or pushed.at > checkpoint_at.timestamp()


def forget_soon(run_id: Any) -> None:
    """The run has ended: its copy is not needed any more (it would expire anyway)."""
    from chat.live.layers import live_layer

    layer = live_layer()
    if settings.REDIS_URL and hasattr(layer, "forget_soon"):
        layer.forget_soon(pushed_key(run_id))
