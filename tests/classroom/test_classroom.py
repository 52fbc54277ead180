"""Classrooms: the actions and their validation, the prompt, and a class chat's run end to end.

Runs go through the in-process runner with the offline demo model (``demo-fast``), the
way the page's socket starts them (``chat.actions.send_message`` on the class chat).
"""

from __future__ import annotations

import uuid

import pytest
from django.http import Http404

from chat import actions as chat_actions
from chat import store
from chat.actions import ActionError
from chat.models import ChatSession, Run
from chat.runhost.setup import setup_for
from classroom import actions
from classroom.models import SCENE_CONTENT_MAX, Classroom, ClassroomChat, Enrollment, Persona
from classroom.prompt import build_scene_context, content_outline
from tests.runhost.conftest import runner_state  # noqa: F401 - a fixture used by name
from tests.runhost.helpers import adb, check_chat, display, settle, until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _runtime(settings, tmp_path, runner_state):  # noqa: F811
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.05


@pytest.fixture
def teacher(make_user):
    return make_user("tess", teacher=True)


@pytest.fixture
def classroom(teacher, default_agent) -> Classroom:
    room = actions.create_classroom(teacher, title="Algebra 1", subject="Maths", model="demo-fast")
    actions.save_scene(
        teacher,
        room.pk,
        title="Linear equations",
        kind="practice",
        content="# Solving for x\n\nMove terms across. Then divide.\n\n- isolate x\n- check",
    )
    return Classroom.objects.get(pk=room.pk)


@pytest.fixture
def student(make_user, classroom):
    user = make_user("sam")
    actions.join_classroom(user, classroom.join_code)
    return user


# --- the objects and their validation -------------------------------------------------------


def test_a_new_class_has_the_preset_cast_and_a_code(classroom):
    cast = list(classroom.personas.values_list("name", "role"))
    assert cast == [
        ("Ada", "teacher"),
        ("Theo", "assistant"),
        ("Maya", "student"),
        ("Leo", "student"),
    ]
    assert len(classroom.join_code) == 8
    assert not set(classroom.join_code) & set("01OIL")
    assert classroom.current_scene.title == "Linear equations"  # the first scene is current


def test_only_teachers_create_classes(make_user, default_agent):
    with pytest.raises(ActionError, match="Only teachers"):
        actions.create_classroom(make_user("kid"), title="Mine")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"title": "  "}, "needs a title"),
        ({"title": "Ok", "model": "gpt-nope"}, "not available"),
    ],
)
def test_class_validation(teacher, default_agent, fields, message):
    with pytest.raises(ActionError, match=message):
        actions.create_classroom(teacher, **fields)


def test_persona_and_scene_validation(teacher, classroom):
    with pytest.raises(ActionError, match="already has a persona named maya"):
        actions.save_persona(teacher, classroom.pk, name="maya", role="student")
    with pytest.raises(ActionError, match="needs a name"):
        actions.save_persona(teacher, classroom.pk, name=" ", role="student")
    with pytest.raises(ActionError, match="name is up to 40"):
        actions.save_persona(teacher, classroom.pk, name="<Ada>", role="student")
    with pytest.raises(ActionError, match="not available"):
        actions.save_persona(teacher, classroom.pk, name="Zoe", role="student", model="nope")
    with pytest.raises(ActionError, match="needs a title"):
        actions.save_scene(teacher, classroom.pk, title="")
    with pytest.raises(ActionError, match="scene content is too long"):
        actions.save_scene(
            teacher, classroom.pk, title="Big", content="x" * (SCENE_CONTENT_MAX + 1)
        )
    zoe = actions.save_persona(teacher, classroom.pk, name="Zoe", role="student", colour="#112233")
    assert zoe.position == 4 and zoe.colour == "#112233"


def test_join_codes(make_user, teacher, classroom):
    kid = make_user("kid")
    with pytest.raises(ActionError, match="wrong or no longer valid"):
        actions.join_classroom(kid, "NOPE2345")
    code = classroom.join_code
    assert actions.join_classroom(kid, f" {code[:4].lower()}-{code[4:]} ").pk == classroom.pk
    actions.join_classroom(kid, code)  # twice: harmless
    assert Enrollment.objects.filter(classroom=classroom, student=kid).count() == 1
    new = actions.regenerate_join_code(teacher, classroom.pk)
    assert new != code
    with pytest.raises(ActionError, match="wrong or no longer valid"):
        actions.join_classroom(make_user("late"), code)
    actions.set_archived(teacher, classroom.pk, True)
    with pytest.raises(ActionError, match="wrong or no longer valid"):
        actions.join_classroom(make_user("later"), new)


def test_a_removed_student_loses_the_class(teacher, student, classroom):
    enrollment = Enrollment.objects.get(student=student)
    assert actions.remove_student(teacher, classroom.pk, enrollment.pk) == "sam"
    with pytest.raises(Http404):
        actions.open_class_chat(student, classroom.pk)


def test_scenes_reorder(teacher, classroom):
    second = actions.save_scene(teacher, classroom.pk, title="Quadratics", kind="lecture")
    assert [s.title for s in classroom.scenes.all()] == ["Linear equations", "Quadratics"]
    actions.move_scene(teacher, classroom.pk, second.pk, "up")
    assert [s.title for s in classroom.scenes.all()] == ["Quadratics", "Linear equations"]
    second.refresh_from_db()
    assert second.number == 1


# --- the prompt -------------------------------------------------------------------------------


def test_the_scene_context_is_a_bounded_digest(classroom):
    scene = classroom.current_scene
    assert scene.scene_context == (
        "Course: Algebra 1 (Maths)\nScene: Linear equations (practice)\n"
        "Outline:\n# Solving for x\nMove terms across.\n- isolate x\n- check"
    )
    long = "\n\n".join(f"## Part {n}\n\nSentence {n} is here." for n in range(400))
    scene.content = long
    assert len(build_scene_context(classroom, scene)) <= 2000
    assert content_outline("```\n# not a heading\n```\ntext") == ["text"]


def test_the_prompt_holds_scene_guardrail_and_cast_and_follows_scene_changes(
    teacher, student, classroom
):
    link = actions.open_class_chat(student, classroom.pk)
    setup = setup_for(link.chat)
    assert setup.speakers == ["Ada", "Theo", "Maya", "Leo"]  # the AI teacher first
    assert setup.tools == [] and setup.max_rounds == 1
    assert "Current scene: Linear equations" in setup.system_prompt
    assert classroom.current_scene.scene_context in setup.system_prompt
    assert "never give the final answer" in setup.system_prompt
    assert setup.roles["Theo"].startswith("teaching assistant. A practical teaching assistant")
    assert setup.roles["Maya"].startswith("AI classmate.")

    quad = actions.save_scene(
        teacher,
        classroom.pk,
        title="Quadratics",
        content="Completing the square.",
        guardrail="Only hints.",
    )
    assert setup_for(link.chat).system_prompt == setup.system_prompt  # not current yet
    actions.set_current_scene(teacher, classroom.pk, quad.pk)
    changed = setup_for(link.chat).system_prompt
    assert "Current scene: Quadratics" in changed and "Completing the square." in changed
    assert "Only hints." in changed and "Linear equations" not in changed
    markers = [e.payload for e in display(link.chat) if e.kind == "scene"]
    assert [(m["number"], m["title"]) for m in markers] == [
        (1, "Linear equations"),
        (2, "Quadratics"),
    ]
    # A disabled persona leaves the cast; an AI teacher added later still leads it.
    Persona.objects.filter(name="Leo").update(enabled=False)
    assert setup_for(link.chat).speakers == ["Ada", "Theo", "Maya"]


def test_one_class_chat_per_student_and_class(student, classroom):
    first = actions.open_class_chat(student, classroom.pk)
    again = actions.open_class_chat(student, classroom.pk)
    assert first.chat_id == again.chat_id
    assert first.chat.kind == ChatSession.Kind.CLASSROOM
    assert ClassroomChat.objects.count() == 1


# --- a run end to end -------------------------------------------------------------------------


async def test_one_call_answers_with_two_labelled_personas(student, classroom):
    link = await adb(actions.open_class_chat)(student, classroom.pk)
    sent = await adb(chat_actions.send_message)(
        student, link.chat_id, "How do I start?", uuid.uuid4().hex
    )
    await settle()
    runs = await adb(check_chat)(link.chat)
    assert [r.status for r in runs] == [Run.Status.COMPLETED]
    assert runs[0].speakers == ["Ada", "Theo", "Maya", "Leo"]
    events = await adb(display)(link.chat)
    replies = [
        e.payload
        for e in events
        if e.kind == "msg" and e.payload["role"] == "assistant" and e.seq > sent.display_seq
    ]
    assert [r["sender_name"] for r in replies] == ["Ada", "Maya"]
    assert all("Linear equations" in r["content"] for r in replies)
    assert all("<" not in r["content"] for r in replies)  # clean text in display
    context = await adb(store.load_context)(link.chat_id)
    assert context[-2].content.startswith("<Ada>") and context[-2].content.endswith("</Ada>")
    assert context[-1].content.startswith("<Maya>")


@pytest.mark.parametrize(
    ("text", "speakers"),
    [
        ("let's discuss, everyone", ["Ada", "Maya", "Leo"]),
        ("I need a hint", ["Ada", "Theo"]),
        ("just tell me the answer", ["Ada"]),
        ("stranger things", ["Ada"]),
        ("unparseable please", ["Ada"]),
    ],
)
async def test_the_demo_cast_follows_the_triggers(student, classroom, text, speakers):
    link = await adb(actions.open_class_chat)(student, classroom.pk)
    await adb(chat_actions.send_message)(student, link.chat_id, text, uuid.uuid4().hex)
    await settle()
    events = await adb(display)(link.chat)
    replies = [e.payload for e in events if e.kind == "msg" and e.payload["role"] == "assistant"]
    assert [r["sender_name"] for r in replies] == speakers
    if text.startswith("unparseable"):
        assert replies[0]["content"].startswith("Plain words about “Linear equations”")


async def test_stop_keeps_each_personas_partial_text(settings, teacher, student, classroom):
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.01
    await adb(actions.update_classroom)(
        teacher, classroom.pk, title="Algebra 1", subject="Maths", model="demo"
    )
    link = await adb(actions.open_class_chat)(student, classroom.pk)
    assert link.chat.model == "demo"
    sent = await adb(chat_actions.send_message)(
        student, link.chat_id, "a long one please", uuid.uuid4().hex
    )
    await until(lambda: len(Run.objects.get(pk=sent.run_id).partial_text) > 80)
    await adb(chat_actions.cancel_run)(student, link.chat_id)
    await settle()
    runs = await adb(check_chat)(link.chat)
    assert runs[0].status == Run.Status.CANCELLED
    kept = [
        e.payload
        for e in await adb(display)(link.chat)
        if e.kind == "msg" and e.payload["role"] == "assistant"
    ]
    assert [k["sender_name"] for k in kept] == ["Ada"]
    assert kept[0]["extra"]["ended"] == "cancelled"
    assert kept[0]["content"].startswith("Step 1 of “Linear equations”")
    assert "<Ada>" not in kept[0]["content"]
