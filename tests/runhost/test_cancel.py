"""Cancelling a run, and the hang guard ending one that does not complete."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer
from django.http import Http404

from chat import actions, store
from chat.models import Run
from chat.runhost import executor
from tests.fakeopenai import Script
from tests.runhost.helpers import (
    adb,
    assert_nothing_live,
    check_chat,
    display,
    new_chat,
    partial_messages,
    run_row,
    send,
    settle,
    terminal_of,
    until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]


@pytest.mark.persistence
async def test_cancel_closes_the_upstream_request_and_keeps_the_partial_text(
    alice, bob, agent, runtime, fake_model
):
    tokens = [f"tok{i} " for i in range(400)]
    fake_model.enqueue(Script(tokens=tokens, token_delay=0.02))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "a long one please")
    await until(lambda: run_row(sent.run_id).partial_text)

    with pytest.raises(Http404):  # another user's chat looks like no chat at all
        await adb(actions.cancel_run)(bob, chat.pk)
    assert await adb(actions.cancel_run)(alice, chat.pk) == sent.run_id
    # The upstream HTTP request is closed within a second of the cancel.
    assert await fake_model.wait_for_disconnect_async(1, timeout=1.0)
    assert await adb(actions.cancel_run)(alice, chat.pk) in (sent.run_id, None)  # idempotent
    await settle()
    assert await adb(actions.cancel_run)(alice, chat.pk) is None  # idle: nothing to cancel

    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.CANCELLED
    assert run.partial_text and "".join(tokens).startswith(run.partial_text)
    events = await adb(display)(chat)
    cancelled = terminal_of(events, run.pk)
    assert cancelled["partial_text"] == run.partial_text
    (partial,) = partial_messages(events)
    assert partial["content"] == run.partial_text
    assert partial["extra"]["ended"] == "cancelled"
    context = await adb(store.load_context)(chat.pk)
    assert context[-1].content == run.partial_text
    assert context[-1].extra.get("ended") == "cancelled"
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_the_hang_guard_ends_a_run_that_does_not_complete(
    alice, agent, runtime, fake_model, guard_clock
):
    # Longer than the test takes in real time: only the clock moved forward ends it.
    runtime.LYCEUM_RUN_GUARD_SECONDS = 20.0
    runtime.LYCEUM_IDLE_TIMEOUT = 30.0
    fake_model.enqueue(
        Script(tokens=["Still ", "thinking ", "about ", "it"], fault_after=2, stall=30)
    )
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hang please")
    await until(lambda: run_row(sent.run_id).partial_text == "Still thinking ")  # stalled
    guard_clock.advance(21.0)
    await settle()

    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "timed_out")
    assert run.partial_text == "Still thinking "
    events = await adb(display)(chat)
    error = terminal_of(events, run.pk)
    assert (error["category"], error["partial_text"]) == ("timed_out", "Still thinking ")
    assert [p["content"] for p in partial_messages(events)] == ["Still thinking "]
    assert await fake_model.wait_for_disconnect_async(1, timeout=1.0)
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_the_hang_guard_is_reported_even_when_leaving_the_group_takes_time(
    alice, agent, runtime, fake_model, monkeypatch, guard_clock
):
    """With Redis, leaving the control group is a network round trip."""
    runtime.LYCEUM_RUN_GUARD_SECONDS = 20.0
    runtime.LYCEUM_IDLE_TIMEOUT = 30.0
    layer = get_channel_layer()
    original = layer.group_discard

    async def slow_group_discard(group: str, channel: str) -> None:
        await asyncio.sleep(0.05)
        await original(group, channel)

    monkeypatch.setattr(layer, "group_discard", slow_group_discard)
    fake_model.enqueue(Script(tokens=["Half ", "way ", "there"], fault_after=2, stall=30))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hang please")
    await until(lambda: run_row(sent.run_id).partial_text == "Half way ")  # stalled
    guard_clock.advance(21.0)
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "timed_out")
    assert terminal_of(await adb(display)(chat), run.pk)["category"] == "timed_out"


async def test_the_watcher_keeps_one_receive_pending_from_look_to_look(
    alice, agent, runtime, fake_model, guard_clock, monkeypatch
):
    """A run's watcher looks for a cancel (and at the guard) every WATCH_INTERVAL, but
    waits on one receive of its control channel all along, not a new one per look."""
    runtime.LYCEUM_RUN_GUARD_SECONDS = 20.0
    runtime.LYCEUM_IDLE_TIMEOUT = 30.0
    monkeypatch.setattr(executor, "WATCH_INTERVAL", 0.01)
    looks: list[float] = []
    clock_now = guard_clock.monotonic

    def looked() -> float:
        looks.append(1.0)
        return clock_now()

    monkeypatch.setattr(guard_clock, "monotonic", looked)
    layer = get_channel_layer()
    receives: list[str] = []
    real_receive = layer.receive

    async def counted_receive(channel: str) -> dict:
        receives.append(channel)
        return await real_receive(channel)

    monkeypatch.setattr(layer, "receive", counted_receive)
    fake_model.enqueue(
        Script(tokens=["Still ", "thinking ", "about ", "it"], fault_after=2, stall=30)
    )
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hang please")
    await until(lambda: run_row(sent.run_id).partial_text == "Still thinking ")  # stalled
    await until(lambda: len(looks) >= 10)
    assert len(receives) == 1
    guard_clock.advance(21.0)  # the guard is still read at a look
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "timed_out")
