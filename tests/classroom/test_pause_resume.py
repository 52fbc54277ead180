"""Pause and resume leave no message unanswered: a message whose run Pause stopped before
the run took it, and one queued behind a running reply, are both answered on resume; and
while paused no run starts for them."""

from __future__ import annotations

import uuid

import pytest

from chat import actions as chat_actions
from chat.models import QueuedInput, Run
from classroom import actions
from classroom.models import HeldInput
from tests.runhost.conftest import runner_state  # noqa: F401 - a fixture used by name
from tests.runhost.helpers import adb, display, settle, until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _runtime(settings, tmp_path, runner_state):  # noqa: F811
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.05


@pytest.fixture
def world(make_user, default_agent):
    teacher = make_user("tess", teacher=True)
    room = actions.create_classroom(teacher, title="Algebra", model="demo-fast")
    actions.save_scene(teacher, room.pk, title="Equations", content="x")
    student = make_user("sam")
    actions.join_classroom(student, room.join_code)
    link = actions.open_class_chat(student, room.pk)
    return {"teacher": teacher, "student": student, "room": room, "chat": link.chat}


def replies_to(chat, seq: int) -> list[str]:
    """The persona replies written after display seq ``seq``."""
    from chat import store

    return [
        str(e.payload.get("content"))
        for e in store.display_events_after(chat.pk, seq)
        if e.kind == "msg" and e.payload.get("role") == "assistant"
    ]


async def test_a_message_whose_run_pause_stopped_before_it_started_is_answered_on_resume(
    world,
):
    chat, teacher, room = world["chat"], world["teacher"], world["room"].pk

    def send_then_pause():
        # One trip to the database thread: the run is launched on commit, but its task
        # needs this thread to claim it, so Pause comes before the run takes the message.
        sent = chat_actions.send_message(world["student"], chat.pk, "What is x?", "c1")
        actions.pause_ai(teacher, room)
        return sent

    sent = await adb(send_then_pause)()
    await settle()
    run = await Run.objects.aget(pk=sent.run_id)
    assert run.status == Run.Status.CANCELLED
    assert not run.claimed  # it never ran: no model call while paused
    assert await HeldInput.objects.acount() == 1
    assert await adb(replies_to)(chat, sent.display_seq) == []

    await adb(actions.resume_ai)(teacher, room)
    await until(lambda: Run.objects.filter(chat=chat, status="completed").exists())
    await settle()
    answered = await adb(replies_to)(chat, sent.display_seq)
    assert answered and any("What is x?" in text for text in answered)
    assert not await HeldInput.objects.aexists()
    assert not await QueuedInput.objects.filter(consumed=False).aexists()


async def test_a_message_queued_behind_a_running_reply_is_held_and_answered_on_resume(world):
    chat, teacher, room = world["chat"], world["teacher"], world["room"].pk
    await adb(chat.__class__.objects.filter(pk=chat.pk).update)(model="demo")
    first = await adb(chat_actions.send_message)(
        world["student"], chat.pk, "tell me something long", uuid.uuid4().hex
    )
    await until(lambda: Run.objects.get(pk=first.run_id).partial_text != "")
    queued = await adb(chat_actions.send_message)(
        world["student"], chat.pk, "And the second question?", uuid.uuid4().hex
    )
    await adb(actions.pause_ai)(teacher, room)
    await settle()
    assert (await Run.objects.aget(pk=first.run_id)).status == Run.Status.CANCELLED
    # The stopped reply started no other run for the message queued behind it.
    assert await Run.objects.filter(chat=chat).acount() == 1
    assert await HeldInput.objects.acount() == 1

    await adb(actions.resume_ai)(teacher, room)
    await until(lambda: Run.objects.filter(chat=chat, status="completed").exists())
    await settle()
    answered = await adb(replies_to)(chat, queued.display_seq)
    assert any("And the second question?" in text for text in answered)
    kinds = [e.kind for e in await adb(display)(chat)]
    assert "cancelled" in kinds
