"""Recovery after a restart: runs whose process died are interrupted with their last
checkpoint.
"""

from __future__ import annotations

import asyncio

import pytest
from django.utils import timezone

from chat import actions, store
from chat.models import Run
from chat.runhost import executor, transitions
from tests.fakeopenai import Script
from tests.runhost.helpers import (
    adb,
    assert_nothing_live,
    check_chat,
    display,
    new_chat,
    partial_messages,
    run_row,
    running_run,
    send,
    settle,
    terminal_of,
    until,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]


def test_start_up_recovery_interrupts_every_running_run_with_its_checkpoint(alice, agent):
    chat = actions.new_chat(alice, model="demo-fast")
    actions.send_message(alice, chat.pk, "hello", "c1")  # creates the live run
    run = Run.objects.get(chat=chat)
    Run.objects.filter(pk=run.pk).update(
        partial_text="Half a rep", partial_reasoning="Thinking", heartbeat_at=timezone.now()
    )

    assert transitions.recover_stale_runs(everything=True) == [str(run.pk)]
    assert transitions.recover_stale_runs(everything=True) == []  # once only

    run.refresh_from_db()
    assert (run.status, run.partial_text) == (Run.Status.INTERRUPTED, "Half a rep")
    events = display(chat)
    error = terminal_of(events, run.pk)
    assert (error["category"], error["status"], error["partial_text"]) == (
        "interrupted",
        "interrupted",
        "Half a rep",
    )
    (partial,) = partial_messages(events)
    assert (partial["content"], partial["reasoning_content"]) == ("Half a rep", "Thinking")
    assert partial["extra"]["ended"] == "interrupted"
    assert [m.content for m in store.load_context(chat.pk)][-1] == "Half a rep"
    check_chat(chat)


@pytest.mark.persistence
def test_only_runs_with_a_stale_heartbeat_are_recovered_while_running(alice, agent):
    stale_chat = actions.new_chat(alice, model="demo-fast")
    silent_chat = actions.new_chat(alice, model="demo-fast")
    alive_chat = actions.new_chat(alice, model="demo-fast")
    stale = running_run(stale_chat, partial="Old text", heartbeat_age=600)
    silent = running_run(silent_chat, partial="", heartbeat_age=None)  # never beat, old
    alive = running_run(alive_chat, partial="Fresh text", heartbeat_age=0.5)

    assert sorted(transitions.recover_stale_runs()) == sorted([str(stale.pk), str(silent.pk)])
    assert Run.objects.get(pk=alive.pk).status == Run.Status.RUNNING
    assert Run.objects.get(pk=stale.pk).status == Run.Status.INTERRUPTED
    assert Run.objects.get(pk=silent.pk).status == Run.Status.INTERRUPTED
    assert [p["content"] for p in partial_messages(display(stale_chat))] == ["Old text"]
    assert partial_messages(display(silent_chat)) == []  # nothing was written: no message
    check_chat(stale_chat)
    check_chat(silent_chat)


@pytest.mark.persistence
async def test_a_run_whose_process_died_is_interrupted_with_its_last_checkpoint(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(Script(tokens=[f"t{i} " for i in range(300)], token_delay=0.02))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "go on")
    await until(lambda: len(run_row(sent.run_id).partial_text) > 10)
    # The process goes away: its task dies without writing a terminal state.
    task = executor.local_task(sent.run_id)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.RUNNING
    checkpoint = run.partial_text

    assert await adb(transitions.recover_stale_runs)(everything=True) == [sent.run_id]
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.partial_text) == (Run.Status.INTERRUPTED, checkpoint)
    events = await adb(display)(chat)
    assert terminal_of(events, run.pk)["partial_text"] == checkpoint
    assert [p["content"] for p in partial_messages(events)] == [checkpoint]
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()
