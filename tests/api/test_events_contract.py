# ruff: noqa: F811 - the fixtures imported from tests.runhost.conftest are requested by parameter name
"""The run-event contract: every event type round-trips through JSON, and what the runner
stores and the API follower yields parses back into typed events.

Clients (the SSE API, scripts, the browser's resync) rely on it: snake_case fields, a
``type`` field naming the event, and exactly one terminal event per run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import typing
import uuid
from typing import Any

import pytest

from chat import actions, store
from chat.agent import events as ev
from chat.api import follow
from chat.models import Run
from chat.runhost import executor, transitions
from tests.fakeopenai import Script

# The run fixtures live beside the run tests; they are requested here by parameter name.
from tests.runhost.conftest import fake_model, runner_state, runtime  # noqa: F401
from tests.runhost.helpers import (
    WAIT,
    adb,
    check_chat,
    new_chat,
    send,
    settle,
    until,
    wait_for_approval,
)

SNAKE_CASE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
BASE_FIELDS = {"chat_id", "run_id", "seq"}
SAMPLES: dict[Any, Any] = {
    str: "some text — ünïcode",
    int: 7,
    float: 1.5,
    bool: True,
    Any: {"nested": [1, "two", None], "flag": False},
}


def sample_event(cls: type[ev.RunEvent]) -> ev.RunEvent:
    """An instance with a distinct, JSON-able value in every field."""
    hints = typing.get_type_hints(cls)
    values = {}
    for item in dataclasses.fields(cls):
        values[item.name] = SAMPLES[hints[item.name]]
    values.update(chat_id=str(uuid.uuid4()), run_id=str(uuid.uuid4()), seq=42)
    return cls(**values)


def documented_fields() -> dict[str, set[str]]:
    """The field table of the events module's docstring, by type."""
    table = {}
    for row in re.findall(r"^\| ``(\w+)`` \| (.*) \|$", ev.__doc__ or "", re.M):
        name, fields = row
        words = re.findall(r"[a-z_]+", re.sub(r"\(.*?\)", "", fields))
        table[name] = set(words)
    return table


@pytest.mark.parametrize("event_type", sorted(ev.EVENT_TYPES))
def test_every_event_type_round_trips_through_json(event_type: str):
    cls = ev.EVENT_TYPES[event_type]
    assert cls.type == event_type
    event = sample_event(cls)
    data = event.to_dict()
    assert data["type"] == event_type
    assert all(SNAKE_CASE.match(key) for key in data), sorted(data)
    wire = json.loads(event.to_json())
    assert wire == json.loads(json.dumps(data)) == data
    parsed = ev.event_from_dict(wire)
    assert type(parsed) is cls
    assert parsed == event
    assert parsed.to_dict() == data


def test_the_documented_field_table_matches_the_event_classes():
    table = documented_fields()
    assert set(table) == set(ev.EVENT_TYPES)
    for name, cls in ev.EVENT_TYPES.items():
        fields = {f.name for f in dataclasses.fields(cls)} - BASE_FIELDS
        assert table[name] == fields, name


def test_exactly_three_terminal_types():
    assert {"complete", "cancelled", "error"} == ev.TERMINAL_TYPES
    assert {name for name, cls in ev.EVENT_TYPES.items() if cls.terminal} == ev.TERMINAL_TYPES
    # Deltas are pushed live, never stored; everything else is stored.
    assert {name for name, cls in ev.EVENT_TYPES.items() if not cls.persisted} == {
        "delta",
        "thinking_delta",
    }


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "no_such_event"},
        {"text": "no type at all"},
        {"type": "delta", "text": "x", "unexpected": 1},
        {"type": "delta", "Text": "x"},
    ],
    ids=["unknown type", "missing type", "unknown field", "camel case field"],
)
def test_malformed_events_are_rejected(payload: dict[str, Any]):
    with pytest.raises(ValueError):
        ev.event_from_dict(payload)


def test_a_missing_required_field_is_rejected():
    with pytest.raises(TypeError):
        ev.event_from_dict({"type": "delta"})


# --- what the runner stores -----------------------------------------------------------------------


def _assert_stored_events_parse(chat) -> set[str]:
    kinds = set()
    for stored in store.display_events_after(chat.pk, 0):
        kinds.add(stored.kind)
        if stored.kind == "msg":  # a display message, not a run event
            assert stored.payload["role"] in {"user", "assistant", "tool", "system"}
            continue
        assert stored.payload["type"] == stored.kind
        assert "seq" not in stored.payload  # the row's seq is the event's seq
        if "run_id" not in stored.payload:  # a chat-level event (e.g. model_switched)
            assert stored.kind not in ev.EVENT_TYPES
            continue
        parsed = ev.event_from_dict(stored.payload)
        assert parsed.run_id and parsed.chat_id == str(chat.pk)
        assert {k: v for k, v in parsed.to_dict().items() if k != "seq"} == stored.payload
    return kinds


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runner_state")
async def test_the_events_the_runner_stores_parse(alice, agent, runtime, fake_model):
    chat = await new_chat(alice)
    for text in ("calculate 12*7", "delegate find three facts about owls", "fail midway"):
        await send(alice, chat, text)
        await settle()
    _run_id, approval = await wait_for_approval(alice, chat, "write file notes.md")
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=False, reason="no")
    await settle()
    await wait_for_approval(alice, chat, "write file notes.md")
    await adb(actions.cancel_run)(alice, chat.pk)
    await adb(actions.switch_model)(alice, chat.pk, "fake-model")
    fake_model.enqueue(
        Script(tokens=[f"t{i} " for i in range(300)], token_delay=0.02),
        Script(status=500),
        Script(text="Retried."),
    )
    # A run left running by a "dead process", then recovered.
    dying = await send(alice, chat, "hello")
    await until(lambda: Run.objects.get(pk=dying.run_id).partial_text)
    task = executor.local_task(dying.run_id)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await adb(transitions.recover_stale_runs)(everything=True) == [dying.run_id]
    await send(alice, chat, "through the fake server")
    await settle()

    kinds = await adb(_assert_stored_events_parse)(chat)
    assert {
        "run_start",
        "iteration_start",
        "input_taken",
        "context_usage",
        "tool_start",
        "tool_end",
        "approval_required",
        "approval_decided",
        "hand_start",
        "hand_end",
        "subtask_status",
        "retrying",
        "complete",
        "cancelled",
        "error",
    } <= kinds
    await adb(check_chat)(chat)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runner_state")
async def test_the_events_the_api_follower_yields_parse(alice, agent, runtime):
    runtime.LYCEUM_DEMO_TOKEN_DELAY = 0.002
    runtime.LYCEUM_STREAM_PUSH_INTERVAL = 0.0
    chat = await new_chat(alice, "demo")
    sent = await adb(actions.send_message)(alice, chat.pk, "calculate 6*7", uuid.uuid4().hex)
    follower = follow.RunFollower(
        chat_id=str(chat.pk),
        last_seq=sent.display_seq,
        input_seq=sent.display_seq,
        run_id=sent.run_id,
    )
    items: list[dict[str, Any]] = []

    async def collect() -> None:
        async for item in follow.follow_run(follower):
            items.append(item)

    collector = asyncio.create_task(collect())
    await asyncio.wait_for(collector, WAIT)
    await settle()

    parsed = [ev.event_from_dict(item) for item in items]
    assert all(event.run_id == sent.run_id for event in parsed)
    assert [e.type for e in parsed if e.terminal] == ["complete"]
    assert parsed[-1].terminal
    complete = parsed[-1]
    assert isinstance(complete, ev.Complete) and "42" in complete.text
    # The deltas add up to what was written, per round: here the last reply.
    streamed = "".join(e.text for e in parsed if isinstance(e, ev.Delta))
    assert streamed.endswith(complete.text)
    seqs = [e.seq for e in parsed]
    assert seqs == sorted(seqs)
