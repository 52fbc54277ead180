"""A worker handed one run takes along the others nobody claimed."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from chat import actions
from chat.models import QueuedInput, Run
from chat.runhost import executor, transitions, worker
from tests.runhost.helpers import adb, assert_nothing_live, check_chat, new_chat, settle

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]


async def test_a_worker_handed_one_run_starts_the_others_nobody_claimed(alice, agent, runtime):
    chats = [await new_chat(alice) for _ in range(3)]
    sent = [
        await adb(actions.send_message)(alice, chat.pk, "hello", uuid.uuid4().hex) for chat in chats
    ]
    consumer = worker.RunWorkerConsumer()

    await consumer.run_execute({"type": "run.execute", "run_id": sent[0].run_id})
    await worker.taken_along()
    await settle()
    statuses = [(await Run.objects.aget(pk=result.run_id)).status for result in sent]
    assert statuses == [Run.Status.COMPLETED] * 3
    # The other runs' own messages come late: each finds its run claimed and does nothing.
    for result in sent[1:]:
        await consumer.run_execute({"type": "run.execute", "run_id": result.run_id})
    await settle()

    for chat in chats:
        (run,) = await adb(check_chat)(chat)  # one run each, answered once
        assert run.status == Run.Status.COMPLETED
    assert await adb(transitions.unclaimed_runs)(10) == []
    await adb(assert_nothing_live)()


async def test_a_run_waiting_for_approval_is_not_taken_along(alice, agent, runtime):
    runtime.LYCEUM_RUNNER = "worker"  # sends hand runs to workers; none listens here
    waiting_chat, other_chat = await new_chat(alice), await new_chat(alice)
    waiting = await adb(actions.send_message)(alice, waiting_chat.pk, "x", uuid.uuid4().hex)
    await Run.objects.filter(pk=waiting.run_id).aupdate(status=Run.Status.WAITING)
    other = await adb(actions.send_message)(alice, other_chat.pk, "hello", uuid.uuid4().hex)

    await worker.RunWorkerConsumer().run_execute({"type": "run.execute", "run_id": other.run_id})
    await worker.taken_along()
    await settle()

    run = await Run.objects.aget(pk=waiting.run_id)
    assert run.status == Run.Status.WAITING and not run.claimed


async def test_a_run_taken_along_has_its_message_taken_in_its_claim(alice, agent, runtime):
    """Taken along (a resume with nothing to resume), a new run gets its inputs with its
    claim, as a run started by its own message does: no trip more before its request."""
    runtime.LYCEUM_RUNNER = "worker"  # sends hand runs to workers; none listens here
    chat = await new_chat(alice)
    sent = await adb(actions.send_message)(alice, chat.pk, "hello", uuid.uuid4().hex)

    prepared = await adb(executor._prepare)(sent.run_id, True)

    assert prepared is not None and prepared.resume is None
    assert [queued.text for queued in prepared.queued or []] == ["hello"]
    assert not await QueuedInput.objects.filter(chat=chat, consumed=False).aexists()


async def test_runs_handed_over_at_once_make_one_look_for_others_at_a_time(monkeypatch):
    """The consumer takes the next message without waiting for the look for unclaimed
    runs; the runs handed over while a look is out make one more look, not one each."""
    looks, started = [], []
    looking, answer = threading.Event(), threading.Event()

    def unclaimed_runs(limit: int) -> list[str]:
        looks.append(limit)
        looking.set()
        answer.wait(5)  # the database thread is busy
        return []

    monkeypatch.setattr(transitions, "unclaimed_runs", unclaimed_runs)
    monkeypatch.setattr(worker, "start_local", lambda run_id, resume=False: started.append(run_id))
    consumer = worker.RunWorkerConsumer()

    await consumer.run_execute({"type": "run.execute", "run_id": "run-0"})
    assert await asyncio.to_thread(looking.wait, 5)
    for number in range(1, 50):
        await consumer.run_execute({"type": "run.execute", "run_id": f"run-{number}"})
    assert started == [f"run-{number}" for number in range(50)]  # each at once
    answer.set()
    await worker.taken_along()

    assert len(looks) == 2
