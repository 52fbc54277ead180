"""A model that streams its reasoning in a class chat: the reasoning is shown folded,
once, with the first persona's reply, as in a plain chat; the personas' text stays clean."""

from __future__ import annotations

import html
import re
import uuid

import pytest

from chat import actions as chat_actions
from chat.models import Provider, ProviderModel, Run
from classroom import actions
from tests.classroom.test_access import as_user
from tests.fakeopenai import Script
from tests.runhost.conftest import runner_state  # noqa: F401 - a fixture used by name
from tests.runhost.helpers import adb, check_chat, display, settle

pytestmark = pytest.mark.django_db(transaction=True)

REASONING = "Ada should lead; Maya can ask about the denominator."


@pytest.fixture(autouse=True)
def _runtime(settings, tmp_path, runner_state):  # noqa: F811
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.05


@pytest.fixture
def fake_model(fake_openai):
    fake_openai.respond_with(
        lambda _request: Script(
            text="<Ada>Start with the halves.</Ada><Maya>Why a common denominator?</Maya>",
            reasoning=REASONING,
            n_tokens=9,
        )
    )
    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=fake_openai.base_url, api_key="sk-test-secret"
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
    )
    return fake_openai


async def test_the_reasoning_is_folded_with_the_first_persona(make_user, default_agent, fake_model):
    teacher = await adb(make_user)("tess", teacher=True)
    student = await adb(make_user)("sam")
    room = await adb(actions.create_classroom)(teacher, title="Fractions", model="fake-model")
    await adb(actions.save_scene)(teacher, room.pk, title="Halves", content="# Halves")
    await adb(actions.join_classroom)(student, room.join_code)
    link = await adb(actions.open_class_chat)(student, room.pk)
    await adb(chat_actions.send_message)(student, link.chat_id, "How?", uuid.uuid4().hex)
    await settle()
    runs = await adb(check_chat)(link.chat)
    assert [r.status for r in runs] == [Run.Status.COMPLETED]
    replies = [
        e.payload
        for e in await adb(display)(link.chat)
        if e.kind == "msg" and e.payload["role"] == "assistant"
    ]
    assert [(r["sender_name"], r["content"]) for r in replies] == [
        ("Ada", "Start with the halves."),
        ("Maya", "Why a common denominator?"),
    ]
    assert replies[0].get("reasoning_content") == REASONING
    assert not replies[1].get("reasoning_content")

    page = html.unescape(
        (await adb(lambda: as_user(student).get(f"/classes/{room.pk}/chat/"))()).content.decode()
    )
    folded = re.findall(r'<details class="reasoning"( open)?>', page)
    assert folded == [""]  # one, closed
    assert page.count(REASONING) == 1
    assert page.index(REASONING) < page.index("Start with the halves.")
