"""§6: the first Redis command after a Redis restart is retried once on a fresh connection,
on the default layer (dispatch, groups) and the live pub/sub layer (doorbells)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from channels_redis.core import RedisChannelLayer

from chat.live.layers import PipelinedPubSubChannelLayer
from chatsite.redishosts import redis_host
from tests.hardening import ownredis


@pytest.fixture
def own_redis() -> Iterator[None]:
    ownredis.start()
    try:
        yield
    finally:
        ownredis.stop()


async def test_a_send_after_a_redis_restart_goes_through(own_redis):
    prefix = f"retry-{uuid.uuid4().hex[:8]}"
    layer = RedisChannelLayer(hosts=[redis_host(ownredis.URL)], prefix=prefix)
    try:
        await layer.send("runs", {"type": "run.execute", "run_id": "1"})
        await layer.group_add("chat.1", "runs")
        ownredis.stop()
        ownredis.start()
        # The pooled connection is dead; the command is retried on a fresh one.
        await layer.send("runs", {"type": "run.execute", "run_id": "2"})
        await layer.group_send("chat.1", {"type": "chat.events"})  # no members left: none
        assert (await layer.receive("runs"))["run_id"] == "2"
    finally:
        with contextlib.suppress(Exception):
            await layer.close_pools()


async def test_a_doorbell_after_a_redis_restart_is_published(own_redis):
    prefix = f"retry-{uuid.uuid4().hex[:8]}"
    layer = PipelinedPubSubChannelLayer(hosts=[redis_host(ownredis.URL)], prefix=prefix)
    try:
        await layer.group_send("chat.1", {"type": "chat.events"})
        ownredis.stop()
        ownredis.start()
        await layer.group_send("chat.1", {"type": "chat.events"})
    finally:
        with contextlib.suppress(Exception):
            await layer.flush()
