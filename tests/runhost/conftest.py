"""Fixtures of the run tests: an in-process runner with small timeouts, a clean runner
state around each test, the fake OpenAI server as an admin-configured provider, and a
clock for the run's hang guard that a test can move forward.

Modules outside this folder that need them import them by name (see
tests/api/test_events_contract.py).
"""

from __future__ import annotations

import time

import pytest

from chat.models import Provider, ProviderModel
from chat.runhost import executor
from tests.fakeopenai import FakeOpenAI
from tests.runhost.helpers import API_KEY


@pytest.fixture
def runtime(settings, tmp_path):
    """In-process runner, small retry/backoff, a private workspace root."""
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_MAX_RETRIES = 1
    settings.LYCEUM_RETRY_BACKOFF = 0.01
    settings.LYCEUM_FIRST_BYTE_TIMEOUT = 5.0
    settings.LYCEUM_IDLE_TIMEOUT = 5.0
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.05
    settings.LYCEUM_RUN_GUARD_SECONDS = 60.0
    settings.LYCEUM_APPROVAL_TIMEOUT = 900.0
    return settings


@pytest.fixture
async def runner_state(transactional_db):
    """The test starts and ends with no run task and no sweeper (they are module state)."""
    assert not executor._tasks
    yield
    await executor.stop_all()


@pytest.fixture
def fake_model(fake_openai: FakeOpenAI, transactional_db) -> FakeOpenAI:
    """The fake server as an admin-configured provider: alias ``fake-model`` → ``gpt-fake``."""
    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=fake_openai.base_url, api_key=API_KEY
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
    )
    return fake_openai


class GuardClock:
    """``time`` as chat.runhost.executor sees it, with ``monotonic`` movable forward.

    The hang guard measures a run's time with ``time.monotonic``; a test moves this clock
    past the guard instead of sleeping until it fires. Real time still passes too.
    """

    def __init__(self) -> None:
        self.skew = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skew

    def advance(self, seconds: float) -> None:
        self.skew += seconds

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def guard_clock(monkeypatch) -> GuardClock:
    clock = GuardClock()
    monkeypatch.setattr(executor, "time", clock)
    return clock
