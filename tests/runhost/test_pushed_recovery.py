"""Recovery keeps what the pages were shown: the run's last pushed snapshot, kept in Redis
with each push, when it is newer than the database's checkpoint and of the round being
recovered (chat/runhost/pushed.py). Found by bench/soak.py: a worker killed between two
checkpoints lost up to a second of text its pages had shown."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from chat import store
from chat.models import Run
from chat.runhost import pushed, transitions

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = "redis://127.0.0.1:6379/3"
CHECKPOINTED = "Rivers begin as"
SHOWN = "Rivers begin as springs high in the hills"


@pytest.fixture
def redis_keys(settings) -> Iterator[redis.Redis]:
    settings.REDIS_URL = REDIS_URL
    settings.LYCEUM_REDIS_PREFIX = f"lyceumtest-{uuid.uuid4().hex[:12]}"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        yield client
    finally:
        keys = list(client.scan_iter(match=f"{settings.LYCEUM_REDIS_PREFIX}*"))
        if keys:
            client.delete(*keys)
        client.close()


def _dead_run(user, checkpoint_age: float = 2.0) -> Run:
    """A run streaming its first reply whose process died; its last checkpoint is
    ``checkpoint_age`` seconds old."""
    chat = store.create_chat(user, title="t", model="demo")
    at = timezone.now() - timedelta(seconds=checkpoint_age)
    return Run.objects.create(
        chat=chat, model="demo", claimed=True, partial_text=CHECKPOINTED, checkpoint_at=at
    )


def _push(client: redis.Redis, run: Run, round_: int, text: str, at: float) -> None:
    """What a push at ``at`` would have left in Redis."""
    client.set(pushed.pushed_key(run.pk), json.dumps([round_, text, "", at]))


def _kept(run: Run) -> tuple[str, list[str]]:
    assert transitions._recover(run)
    run.refresh_from_db()
    replies = [
        e.payload["content"]
        for e in store.display_events_after(run.chat_id, 0)
        if e.kind == "msg" and e.payload.get("role") == "assistant"
    ]
    return run.partial_text, replies


def test_the_last_push_wins_over_an_older_checkpoint(alice, redis_keys):
    run = _dead_run(alice)
    _push(redis_keys, run, 0, SHOWN, time.time() - 0.1)
    assert _kept(run) == (SHOWN, [SHOWN])
    assert run.status == Run.Status.INTERRUPTED


def test_a_checkpoint_newer_than_the_last_push_wins(alice, redis_keys):
    run = _dead_run(alice, checkpoint_age=0.1)
    _push(redis_keys, run, 0, SHOWN[:6], time.time() - 1.0)
    assert _kept(run) == (CHECKPOINTED, [CHECKPOINTED])


def test_a_push_of_another_round_is_not_taken(alice, redis_keys):
    """Round 0 was written as a message; the push left behind is of it, not of round 1."""
    run = _dead_run(alice)
    _push(redis_keys, run, 1, SHOWN, time.time())
    assert _kept(run) == (CHECKPOINTED, [CHECKPOINTED])


def test_without_a_pushed_copy_the_checkpoint_is_kept(alice, redis_keys):
    run = _dead_run(alice)
    assert _kept(run) == (CHECKPOINTED, [CHECKPOINTED])


def test_redis_down_recovers_from_the_checkpoint(alice, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    run = _dead_run(alice)
    assert _kept(run) == (CHECKPOINTED, [CHECKPOINTED])


def test_a_push_is_read_back_as_written():
    before = time.time()
    copy = pushed.decode(pushed.encode(3, "text", "thought"))
    assert copy is not None
    assert (copy.round, copy.text, copy.reasoning) == (3, "text", "thought")
    assert before <= copy.at <= time.time()


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'{"a": 1}'])
def test_a_garbled_copy_is_ignored(raw):
    assert pushed.decode(raw) is None
