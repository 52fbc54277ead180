"""A run's record: the Run row, its checkpoints while streaming, the one terminal event,
and the keeper's bookkeeping.

Runs start the way the views start them (``actions.send_message``); every test checks
what the database says afterwards (see ``check_chat`` in tests/runhost/helpers.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from chat import actions, store
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


async def test_a_completed_run_has_its_record_and_one_complete_event(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(Script(text="Hello there, Alice.", reasoning="Say hello."))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hi")
    assert sent.run_id and not sent.queued
    await settle()

    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.COMPLETED
    assert run.model == "fake-model"
    assert run.started_at <= run.finished_at
    assert (run.input_tokens, run.usage_estimated) == (11, False)  # the fake's prompt_tokens
    assert run.output_tokens > 0
    assert (run.error_category, run.error_message, run.partial_text) == ("", "", "")
    events = await adb(display)(chat)
    complete = terminal_of(events, run.pk)
    assert complete["text"] == "Hello there, Alice."
    assert (complete["input_tokens"], complete["output_tokens"]) == (11, run.output_tokens)
    replies = [p for p in events_of(events, run.pk, "msg") if p["role"] == "assistant"]
    assert [(p["content"], p["reasoning_content"]) for p in replies] == [
        ("Hello there, Alice.", "Say hello.")
    ]
    assert [m.content for m in await adb(store.load_context)(chat.pk)] == [
        "hi",
        "Hello there, Alice.",
    ]
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_the_partial_reply_is_checkpointed_while_streaming(alice, agent, runtime, fake_model):
    tokens = [f"word{i} " for i in range(30)]
    fake_model.enqueue(Script(tokens=tokens, token_delay=0.03))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "stream slowly")
    seen: list[str] = []

    def checkpoint() -> bool:
        run = run_row(sent.run_id)
        if run.status == Run.Status.RUNNING and run.partial_text:
            assert run.checkpoint_at is not None
            if not seen or seen[-1] != run.partial_text:
                seen.append(run.partial_text)
        return run.status != Run.Status.RUNNING

    await until(checkpoint)
    await settle()
    # Several growing checkpoints of the same reply were written before it completed.
    assert len(seen) >= 2
    assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:], strict=False))
    assert "".join(tokens).startswith(seen[-1])
    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.COMPLETED and run.partial_text == ""
    await adb(check_chat)(chat)


@pytest.mark.persistence
async def test_a_cancel_whose_doorbell_was_lost_still_stops_the_run(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(Script(tokens=[f"tok{i} " for i in range(400)], token_delay=0.02))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "a long one please")
    await until(lambda: run_row(sent.run_id).partial_text)

    # The flag alone, as when the run.cancel message never reached this process.
    await adb(Run.objects.filter(pk=sent.run_id).update)(cancel_requested=True)
    await settle(timeout=3.0)

    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.CANCELLED
    assert terminal_of(await adb(display)(chat), run.pk)["partial_text"] == run.partial_text
    await adb(check_chat)(chat)


@pytest.mark.persistence
def test_the_bookkeeping_of_many_runs_is_one_transaction_of_three_statements(alice, agent):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.runhost.keeper import Checkpoint, keep_runs

    chats = [actions.new_chat(alice) for _ in range(30)]
    running = [running_run(chat, partial="", heartbeat_age=600) for chat in chats[:28]]
    waiting = running_run(chats[28], partial="Kept", heartbeat_age=600)
    Run.objects.filter(pk=waiting.pk).update(status=Run.Status.WAITING)
    cancelled = running_run(chats[29], partial="", heartbeat_age=600)
    Run.objects.filter(pk=cancelled.pk).update(cancel_requested=True)
    everyone = [*running, waiting, cancelled]
    checkpoints = [
        Checkpoint(str(run.pk), f"Reply {i}", f"Thought {i}") for i, run in enumerate(everyone)
    ]

    with CaptureQueriesContext(connection) as queries:
        asked_to_cancel = keep_runs([str(run.pk) for run in everyone], checkpoints)

    assert asked_to_cancel == {str(cancelled.pk)}
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")
    statements = [q["sql"] for q in queries if not q["sql"].startswith(control)]
    assert len(statements) == 3, statements  # checkpoints (one executemany), beats, cancels
    for i, run in enumerate(running):
        run.refresh_from_db()
        assert (run.partial_text, run.partial_reasoning) == (f"Reply {i}", f"Thought {i}")
        assert timezone.now() - run.heartbeat_at < timedelta(seconds=5)
        assert run.checkpoint_at is not None
    # A run that stopped running (waiting for approval here) is neither refilled nor beaten.
    waiting.refresh_from_db()
    assert waiting.partial_text == "Kept"
    assert timezone.now() - waiting.heartbeat_at > timedelta(seconds=500)


def test_the_default_checkpoint_interval_is_at_most_a_second():
    from django.conf import settings

    assert settings.LYCEUM_CHECKPOINT_INTERVAL <= 1.0
