"""The optional model check of a class's guardrails, offline with the demo model: each
student message and each persona reply is read by one short call after the commit; a
"FLAG" answer becomes a flag the wall is told of; the chat itself never waits for it."""

from __future__ import annotations

import uuid

import pytest

from chat import actions as chat_actions
from chat.core.messages import ChatMessage
from chat.core.prompts import MODERATION_PROMPT, moderation_verdict
from chat.llm.demo.rules import plan_reply
from chat.llm.types import ChatRequest
from chat.models import Run
from classroom import actions, llmcheck
from classroom.models import Flag, FlagCategory, Guardrails, HeldInput, OnFlag
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
    actions.save_guardrails(
        teacher,
        room.pk,
        categories=[],
        words="",
        on_flag=OnFlag.NOTIFY,
        check_model="demo-fast",
    )
    return {"teacher": teacher, "student": student, "room": room, "chat": link.chat}


def ask(text: str) -> str:
    request = ChatRequest(
        model="demo-fast",
        messages=[ChatMessage(role="user", content=text)],
        system_prompt=MODERATION_PROMPT,
    )
    return plan_reply(request).text


def test_the_demo_model_answers_the_check_deterministically():
    assert ask("How do I solve 2x = 4?") == "OK"
    flagged = ask("this is UNSAFE-DEMO talk")
    assert flagged.startswith("FLAG:") and "unsafe-demo" in flagged
    assert moderation_verdict(flagged) == "the demo check found “unsafe-demo”"
    assert moderation_verdict("OK") is None
    assert moderation_verdict("") is None
    assert moderation_verdict("flag: rude\nmore") == "rude"


def llm_flags() -> list[tuple[str, str]]:
    rows = Flag.objects.filter(category=FlagCategory.LLM).order_by("pk")
    return list(rows.values_list("source", "reason"))


async def send(world, text: str):
    return await adb(chat_actions.send_message)(
        world["student"], world["chat"].pk, text, uuid.uuid4().hex
    )


async def test_a_student_message_and_the_replies_quoting_it_are_flagged(world):
    result = await send(world, "Is unsafe-demo allowed here?")
    assert result.run_id  # the reply was not held for the check
    await settle()
    flags = await until(lambda: len(llm_flags()) >= 2 and llm_flags())
    await llmcheck.pending()
    flags = await adb(llm_flags)()
    sources = [source for source, _ in flags]
    assert sources[0] == "student" and "persona" in sources
    assert all(reason.startswith("model check: ") for _, reason in flags)
    run = await Run.objects.aget(pk=result.run_id)
    assert run.status == Run.Status.COMPLETED
    # on_flag "notify": nothing is added to the student's chat.
    texts = [e.payload.get("content") for e in await adb(display)(world["chat"])]
    assert llmcheck.MODEL_FLAG_NOTICE not in texts


async def test_a_clean_message_makes_no_flag(world):
    await send(world, "How do I solve 2x = 4?")
    await settle()
    await llmcheck.pending()
    assert await adb(llm_flags)() == []


async def test_with_a_notice_setting_the_student_is_told(world):
    await Guardrails.objects.filter(classroom=world["room"]).aupdate(on_flag=OnFlag.NOTICE)
    await send(world, "unsafe-demo")
    await settle()
    await until(llm_flags)
    await llmcheck.pending()
    texts = [e.payload.get("content") for e in await adb(display)(world["chat"])]
    assert llmcheck.MODEL_FLAG_NOTICE in texts


async def test_no_check_while_paused_then_checked_on_resume(world):
    teacher, room = world["teacher"], world["room"].pk
    await adb(actions.pause_ai)(teacher, room)
    await send(world, "unsafe-demo while paused")
    await llmcheck.pending()
    assert await adb(llm_flags)() == []
    assert await HeldInput.objects.acount() == 1
    await adb(actions.resume_ai)(teacher, room)
    await until(llm_flags)
    await settle()
    await llmcheck.pending()
    assert (await adb(llm_flags)())[0][0] == "student"


async def test_without_a_check_model_no_call_is_made(world, monkeypatch):
    await Guardrails.objects.filter(classroom=world["room"]).aupdate(check_model="")
    calls = []
    monkeypatch.setattr(llmcheck, "check_on_commit", calls.append)
    await send(world, "unsafe-demo")
    await settle()
    assert calls == []
    assert await adb(llm_flags)() == []


async def test_a_failing_check_model_is_logged_and_skipped(world, monkeypatch, caplog):
    async def broken(self, request):
        raise RuntimeError("upstream down")

    monkeypatch.setattr("chat.llm.demo.mechanics.DemoProvider.complete", broken)
    result = await send(world, "unsafe-demo")
    await settle()
    await llmcheck.pending()
    assert await adb(llm_flags)() == []
    run = await Run.objects.aget(pk=result.run_id)
    assert run.status == Run.Status.COMPLETED
    assert "model check of chat" in caplog.text
