"""The relay under test: a live Daphne in front of the loopback fake upstream."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from chat.apikeys import create_api_key
from chat.models import Provider, ProviderKey, ProviderModel, UsageRecord
from chat.relay import secrets
from tests.fakeopenai import FakeOpenAI

UPSTREAM_KEYS = ["sk-upstream-first-0123456789abcdef", "sk-upstream-second-0123456789abcdef"]


@dataclass
class Relay:
    url: str  # base URL for an OpenAI client: <site>/api/v1/relay
    key: str  # a Lyceum API key of alice
    user: object
    upstream: FakeOpenAI
    provider: Provider

    def client(self, **kwargs):
        import openai

        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 15)
        kwargs.setdefault("api_key", self.key)
        return openai.OpenAI(base_url=self.url, **kwargs)


def wait_for_records(count: int, timeout: float = 10.0, **filters) -> list[UsageRecord]:
    deadline = time.monotonic() + timeout
    while True:
        records = list(UsageRecord.objects.filter(**filters).order_by("pk"))
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.02)


@pytest.fixture
def relay_settings(settings):
    """Short timeouts; set before the live server forks, so it runs with them."""
    settings.LYCEUM_RELAY_IDLE_TIMEOUT = 1.0
    settings.LYCEUM_RELAY_FIRST_BYTE_TIMEOUT = 2.0
    settings.LYCEUM_RELAY_KEY_COOLDOWN = 30.0
    settings.LYCEUM_RELAY_RPM = 6000
    settings.LYCEUM_RELAY_BURST = 1000
    settings.REDIS_URL = ""
    return settings


@pytest.fixture
def relay_data(transactional_db, fake_openai, alice):
    provider = Provider.objects.create(name="up", base_url=fake_openai.base_url)
    ProviderModel.objects.create(
        provider=provider, alias="gpt-relay", model_id="fake-model", max_output_tokens=4096
    )
    for index, raw in enumerate(UPSTREAM_KEYS):
        ProviderKey.objects.create(
            provider=provider, label=f"k{index}", secret=secrets.encrypt(raw)
        )
    _key, raw = create_api_key(alice, "relay")
    return provider, raw


@pytest.fixture
def relay(relay_settings, relay_data, fake_openai, alice, live_server_url) -> Relay:
    provider, raw = relay_data
    return Relay(f"{live_server_url}/api/v1/relay", raw, alice, fake_openai, provider)
