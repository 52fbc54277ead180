"""A run recovered after its process died, interrupted in its second reply (after a tool
call and its approval), gives an API client each token once (found by bench/soak.py: the
partial reply was written as round 0, and the follower sent it again)."""

from __future__ import annotations

import pytest

from chat import store
from chat.api.follow import RunFollower
from chat.core.messages import ToolCall, assistant
from chat.models import Run
from chat.runhost import transitions
from chat.runhost.host import DjangoRunHost

pytestmark = pytest.mark.django_db(transaction=True)

STREAMED = "The answer is 42, because six times seven"


def _run_dead_in_its_second_reply(user) -> tuple[Run, int]:
    """A run that wrote a tool call (round 0), then streamed part of its answer; its
    process died before the next checkpoint. Returns it and the seq before it."""
    chat = store.create_chat(user, title="t", model="demo")
    start = store.display_events_after(chat.pk, 0)
    before = start[-1].seq if start else 0
    run = Run.objects.create(chat=chat, model="demo", claimed=True)
    host = DjangoRunHost(run, [])
    call = ToolCall("call_1", "calculator", '{"expression": "6*7"}')
    host.channels.push_both(assistant("", tool_calls=[call]))
    store.append_display_messages(chat.pk, host.take_new_display())
    Run.objects.filter(pk=run.pk).update(iteration=2, partial_text=STREAMED[:20])
    run.refresh_from_db()
    return run, before


def test_an_api_client_gets_the_interrupted_reply_once(alice):
    run, before = _run_dead_in_its_second_reply(alice)
    follower = RunFollower(chat_id=str(run.chat_id), last_seq=before, run_id=str(run.pk))
    # What the client had streamed of the second reply before the process died.
    deltas = follower.apply_snapshot({"run_id": str(run.pk), "round": 1, "text": STREAMED})
    assert transitions._recover(run)
    deltas += follower.apply_events(store.display_events_after(run.chat_id, before))
    text = "".join(d["text"] for d in deltas if d["type"] == "delta")
    assert text == STREAMED
    assert [d["type"] for d in deltas][-1] == "error"


def test_the_kept_reply_is_numbered_after_the_written_one(alice):
    run, _before = _run_dead_in_its_second_reply(alice)
    assert transitions._recover(run)
    replies = [
        e.payload
        for e in store.display_events_after(run.chat_id, 0)
        if e.kind == "msg" and e.payload.get("role") == "assistant"
    ]
    assert [r["extra"].get("round") for r in replies] == [0, 1]
    assert replies[-1]["content"] == STREAMED[:20]
    run.refresh_from_db()
    assert run.status == Run.Status.INTERRUPTED
