"""§6: workers and dispatchers outlive a Redis outage (a Redis of our own, port 6392)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator

import pytest
from channels.layers import get_channel_layer

from chat.models import Run
from tests.hardening import ownredis
from tests.runhost.test_worker import (  # noqa: F401 - fixtures
    Worker,
    run_reaches,
    start_run,
    start_worker,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def own_redis() -> Iterator[None]:
    ownredis.start()
    try:
        yield
    finally:
        ownredis.stop()


@pytest.fixture
def redis_layer(settings, own_redis) -> Iterator[dict[str, str]]:
    """As tests.runhost.test_worker's, on our own Redis."""
    prefix = f"lyceumtest-{uuid.uuid4().hex[:12]}:"
    channel = f"lyceum-runs-{uuid.uuid4().hex[:8]}"
    hosts = [{"address": ownredis.URL, "socket_timeout": 30}]
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": hosts, "prefix": prefix, "expiry": 30},
        },
        "live": {
            "BACKEND": "chat.live.layers.PipelinedPubSubChannelLayer",
            "CONFIG": {"hosts": hosts, "prefix": prefix},
        },
    }
    settings.LYCEUM_RUNNER = "worker"
    settings.LYCEUM_WORKER_CHANNEL = channel
    yield {
        "REDIS_URL": ownredis.URL,
        "LYCEUM_REDIS_PREFIX": prefix,
        "LYCEUM_RUNNER": "worker",
        "LYCEUM_WORKER_CHANNEL": channel,
    }


async def _close_pools() -> None:
    layer = get_channel_layer()
    with contextlib.suppress(Exception):  # connections to a dead server
        await layer.close_pools()


async def test_a_worker_survives_a_redis_restart_and_runs_what_comes_after(
    alice,
    default_agent,
    start_worker,  # noqa: F811 - the fixture
    redis_layer,
):
    worker: Worker = start_worker()
    _chat, run_id = await start_run(alice, "demo-fast", "before the outage")
    run = await run_reaches(run_id, {"completed", "failed"}, [worker])
    assert run.status == Run.Status.COMPLETED

    ownredis.stop()
    await asyncio.sleep(3)  # the worker's blocking receive fails, more than once
    assert worker.process.poll() is None, worker.output()
    ownredis.start()
    await asyncio.sleep(1)
    assert worker.process.poll() is None, worker.output()

    await _close_pools()  # this process's pooled connections died with the server
    _chat, run_id = await start_run(alice, "demo-fast", "after the outage")
    run = await run_reaches(run_id, {"completed", "failed"}, [worker])
    assert run.status == Run.Status.COMPLETED, run.error_message
    assert worker.process.poll() is None
    assert "receiving on" in worker.output()
    await _close_pools()
