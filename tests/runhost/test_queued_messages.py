"""One run per chat: a message sent while a run is busy is queued, then drained into the
run or answered by the next one.
"""

from __future__ import annotations

import pytest

from chat import actions
from chat.models import Run
from tests.fakeopenai import Script
from tests.runhost.helpers import (
    adb,
    assert_nothing_live,
    check_chat,
    display,
    events_of,
    new_chat,
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


async def test_a_message_sent_while_busy_is_queued_then_drained_into_the_run(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(
        Script(tokens=[f"a{i} " for i in range(60)], token_delay=0.02),
        Script(text="Second answer."),
    )
    chat = await new_chat(alice, "fake-model")
    first = await send(alice, chat, "first question")
    await until(lambda: run_row(first.run_id).partial_text)
    second = await send(alice, chat, "second question")
    assert second.queued and second.run_id is None
    events = await adb(display)(chat)
    shown = next(e for e in events if e.seq == second.display_seq)
    assert shown.payload["content"] == "second question"
    assert shown.payload["extra"]["queued"] is True
    await settle()

    assert await adb(Run.objects.filter(chat=chat).count)() == 1
    run = await adb(run_row)(first.run_id)
    assert run.status == Run.Status.COMPLETED
    events = await adb(display)(chat)
    taken = [p["input_seq"] for p in events_of(events, run.pk, "input_taken")]
    assert taken == [first.display_seq, second.display_seq]
    # The second request carried the queued message, marked as appended mid-run.
    last_user = [m for m in fake_model.chat_requests()[1].json["messages"] if m["role"] == "user"]
    assert last_user[-1]["content"].endswith("second question")
    assert terminal_of(events, run.pk)["text"] == "Second answer."
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_a_message_left_queued_starts_the_next_run_when_the_current_one_ends(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(
        Script(tokens=[f"b{i} " for i in range(300)], token_delay=0.02),
        Script(text="Answer to the queued one."),
    )
    chat = await new_chat(alice, "fake-model")
    first = await send(alice, chat, "first")
    await until(lambda: run_row(first.run_id).partial_text)
    second = await send(alice, chat, "queued while busy")
    assert second.queued
    await adb(actions.cancel_run)(alice, chat.pk)
    await settle()

    chat_runs = await adb(check_chat)(chat)
    assert [r.status for r in chat_runs] == [Run.Status.CANCELLED, Run.Status.COMPLETED]
    events = await adb(display)(chat)
    next_run = chat_runs[1]
    assert [p["input_seq"] for p in events_of(events, next_run.pk, "input_taken")] == [
        second.display_seq
    ]
    assert terminal_of(events, next_run.pk)["text"] == "Answer to the queued one."
    await adb(assert_nothing_live)()
