"""Fixtures of the hardening tests: the in-process runner and a channel layer."""

from __future__ import annotations

import uuid

import pytest
from channels.layers import get_channel_layer

from chat.live.layers import live_layer
from chat.runhost import executor

REDIS_URL = "redis://127.0.0.1:6379"


@pytest.fixture
def layer_kind(request) -> str:
    return getattr(request, "param", "memory")


@pytest.fixture
async def socket_env(settings, tmp_path, layer_kind, transactional_db):
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.002
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.02
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.02
    if layer_kind == "redis":
        prefix = f"lyceum-test-{uuid.uuid4().hex[:12]}"
        hosts = [{"address": REDIS_URL, "socket_timeout": 30.0}]
        settings.CHANNEL_LAYERS = {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {"hosts": hosts, "prefix": prefix},
            },
            "live": {
                "BACKEND": "chat.live.layers.PipelinedPubSubChannelLayer",
                "CONFIG": {"hosts": hosts, "prefix": prefix},
            },
        }
    else:
        settings.CHANNEL_LAYERS = {
            "default": {"BACKEND": "chat.live.layers.LeanInMemoryChannelLayer"}
        }
    layer = get_channel_layer()
    yield layer
    await executor.stop_all()
    await layer.flush()
    await live_layer().flush()
    if layer_kind == "redis":
        await layer.close_pools()
