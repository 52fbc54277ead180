"""The teacher in charge: the wall socket, step in, broadcast, pause and resume, move,
flags, the audit the student sees, and the exports; with the access matrix of every
new URL and socket action (the class's teacher, a teacher of another class, the
student, another student, anonymous)."""

from __future__ import annotations

import asyncio
import csv
import io
import uuid
import zipfile

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client

from chat import actions as chat_actions
from chat import store
from chat.actions import ActionError
from chat.models import QueuedInput, Run
from chatsite.asgi import application
from classroom import actions
from classroom.models import Flag, HeldInput, OnFlag, PendingNote, TeacherView
from tests.live.test_consumer import ORIGIN, session_cookie
from tests.runhost.conftest import runner_state  # noqa: F401 - a fixture used by name
from tests.runhost.helpers import adb, display, session_messages, settle, until

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 10


@pytest.fixture(autouse=True)
def _runtime(settings, tmp_path, runner_state):  # noqa: F811
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.05


@pytest.fixture
def world(make_user, default_agent):
    teacher = make_user("tess", teacher=True)
    other_teacher = make_user("otto", teacher=True)
    room = actions.create_classroom(teacher, title="Algebra", model="demo-fast")
    scene = actions.save_scene(teacher, room.pk, title="Equations", content="x")
    scene2 = actions.save_scene(teacher, room.pk, title="Graphs", content="y")
    other_room = actions.create_classroom(other_teacher, title="History", model="demo-fast")
    student = make_user("sam")
    classmate = make_user("cleo")
    other_student = make_user("olga")
    actions.join_classroom(student, room.join_code)
    actions.join_classroom(classmate, room.join_code)
    actions.join_classroom(other_student, other_room.join_code)
    link = actions.open_class_chat(student, room.pk)
    return {
        "teacher": teacher,
        "other_teacher": other_teacher,
        "student": student,
        "classmate": classmate,
        "other_student": other_student,
        "room": room,
        "scenes": (scene, scene2),
        "chat": link.chat,
    }


def as_user(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def new_urls(w) -> list[tuple[str, str]]:
    c, s = w["room"].pk, w["student"].pk
    return [
        ("get", f"/classes/{c}/live/"),
        ("get", f"/classes/{c}/live/{s}/"),
        ("post", f"/classes/{c}/guardrails/"),
        ("get", f"/classes/{c}/export.zip"),
        ("get", f"/classes/{c}/students/{s}/transcript.md"),
    ]


@pytest.mark.parametrize("who", ["other_teacher", "student", "classmate", "other_student"])
def test_only_the_class_teacher_gets_the_new_urls(world, who):
    client = as_user(world[who])
    for method, url in new_urls(world):
        response = getattr(client, method)(url)
        assert response.status_code == 404, (who, method, url, response.status_code)
    assert not TeacherView.objects.exists()


def test_anonymous_visitors_get_the_login_page(world):
    for method, url in new_urls(world):
        response = getattr(as_user(None), method)(url)
        assert response.status_code == 302 and "/login/" in response["Location"], url


def test_the_teacher_gets_them_and_every_read_is_audited(world):
    client = as_user(world["teacher"])
    c, s = world["room"].pk, world["student"].pk
    wall = client.get(f"/classes/{c}/live/").content.decode()
    assert 'aria-label="Class wall"' in wall and 'aria-label="sam"' in wall
    assert 'aria-label="cleo"' in wall  # enrolled, no chat yet: a tile all the same
    assert "Pause AI" in wall and "Move class" in wall and "Broadcast" in wall
    assert client.get(f"/classes/{c}/live/{s}/").status_code == 200
    archive = client.get(f"/classes/{c}/export.zip")
    assert archive["Content-Disposition"].startswith("attachment;")
    transcript = client.get(f"/classes/{c}/students/{s}/transcript.md")
    assert transcript["Content-Disposition"].startswith("attachment;")
    hows = sorted(TeacherView.objects.values_list("how", flat=True))
    assert hows == ["export", "export", "page"]
    assert set(TeacherView.objects.values_list("chat_id", flat=True)) == {world["chat"].pk}
    # The student sees it, in their class chat; a classmate's chat shows none of it.
    page = as_user(world["student"]).get(f"/classes/{c}/chat/").content.decode()
    assert "Who viewed this chat" in page and "tess · export · 2 times" in page
    assert "tess · page · 1 time" in page
    theirs = as_user(world["classmate"]).get(f"/classes/{c}/chat/").content.decode()
    assert "No teacher has viewed this chat yet." in theirs


async def open_wall(user, classroom_id, *, query: str = ""):
    headers = [(b"origin", ORIGIN)]
    if user is not None:
        sid = await adb(session_cookie)(user)
        headers.append((b"cookie", f"{django_settings.SESSION_COOKIE_NAME}={sid}".encode()))
    comm = WebsocketCommunicator(application, f"/ws/classes/{classroom_id}/live/{query}", headers)
    connected, code = await comm.connect(timeout=WAIT)
    return comm, connected, code


async def frames_until(comm, text: str, timeout: float = WAIT) -> str:
    seen = []
    async with asyncio.timeout(timeout):
        while True:
            frame = await comm.receive_from(timeout)
            seen.append(frame)
            if text in frame:
                return "".join(seen)


SOCKET_ACTIONS = [
    {"action": "resync", "seqs": {}},
    {"action": "step_in", "student": 0, "message": "hi"},
    {"action": "broadcast", "message": "hi"},
    {"action": "pause"},
    {"action": "resume"},
    {"action": "move", "scene": 0},
    {"action": "review", "flag": 0},
]


async def test_the_wall_socket_refuses_everyone_but_the_class_teacher(world):
    room = world["room"].pk
    for who in ("other_teacher", "student", "classmate", "other_student", None):
        _comm, ok, code = await open_wall(world[who] if who else None, room)
        assert not ok, who
        assert code in (4401, 4404), (who, code)
    assert not await adb(TeacherView.objects.exists)()


async def test_every_socket_action_is_checked_again(world, django_user_model):
    comm, ok, _ = await open_wall(world["teacher"], world["room"].pk)
    assert ok
    # The teacher loses the class (co-teaching ends, or the class changes hands).
    room = world["room"]
    room.owner = world["other_teacher"]
    await adb(room.save)()
    await comm.send_json_to(SOCKET_ACTIONS[3])
    frame = await comm.receive_output(WAIT)
    assert "You can no longer watch this class." in frame.get("text", "")
    closed = await comm.receive_output(WAIT)
    assert closed["type"] == "websocket.close" and closed["code"] == 4403
    assert not (await adb(type(room).objects.get)(pk=room.pk)).ai_paused


async def test_the_wall_follows_every_class_chat_live(world):
    comm, ok, _ = await open_wall(world["teacher"], world["room"].pk)
    assert ok
    chat = world["chat"]
    await comm.send_json_to({"action": "resync", "seqs": {str(chat.pk): chat.last_display_seq}})
    await chat_actions_send(world["student"], chat.pk, "How do I solve 2x = 4?")
    frames = await frames_until(comm, "Ada")
    assert f"tile-msgs-{chat.pk}" in frames and "How do I solve 2x = 4?" in frames
    await settle()
    # The tile's "writing…" line is cleared once the reply is written: in the frame that
    # brought the reply, or in one after it.
    idle = f'id="tile-stream-{chat.pk}" class="tile-stream" '
    if idle not in frames[frames.index("Ada") :]:
        await frames_until(comm, idle)
    # A new student appears: their tile, then their chat's messages.
    newcomer = await adb(lambda: type(world["student"]).objects.create_user("nia", password="x"))()
    await adb(actions.join_classroom)(newcomer, world["room"].join_code)
    assert 'aria-label="nia"' in await frames_until(comm, 'aria-label="nia"')
    link = await adb(actions.open_class_chat)(newcomer, world["room"].pk)
    frames = await frames_until(comm, "Scene 1: Equations")
    assert f'id="tile-seq-{link.chat_id}" class="tile-seq" data-seq="1"' in frames
    await comm.disconnect()
    hows = await adb(lambda: sorted(TeacherView.objects.values_list("how", flat=True)))()
    assert hows == ["wall", "wall"]  # sam's chat at connect, nia's when it appeared


async def chat_actions_send(user, chat_id, text: str):
    return await adb(chat_actions.send_message)(user, chat_id, text, uuid.uuid4().hex)


async def test_step_in_writes_a_labelled_teacher_message_the_personas_see_next(world):
    chat = world["chat"]
    seq = await adb(actions.step_in)(
        world["teacher"], world["room"].pk, world["student"].pk, "Remember to check your work."
    )
    events = await adb(display)(chat)
    (note,) = [e for e in events if e.seq == seq]
    assert note.payload["sender_name"] == "tess" and note.payload["extra"]["teacher"] is True
    assert note.payload["content"] == "Remember to check your work."
    context = await adb(session_messages)(chat)
    assert context[-1]["content"] == "<tess>Remember to check your work.</tess>"
    # The student's page shows it labelled, in the teacher's style.
    page = await adb(lambda: as_user(world["student"]).get(f"/chat/{chat.pk}/"))()
    assert "teacher-note" in page.content.decode()
    with pytest.raises(ActionError):
        await adb(actions.step_in)(world["teacher"], world["room"].pk, world["classmate"].pk, "x")


async def test_a_teacher_message_during_a_reply_enters_context_after_it(world, settings):
    chat = world["chat"]
    await adb(chat.__class__.objects.filter(pk=chat.pk).update)(model="demo")
    sent = await chat_actions_send(world["student"], chat.pk, "tell me something long")
    await until(lambda: Run.objects.get(pk=sent.run_id).partial_text != "")
    await adb(actions.step_in)(world["teacher"], world["room"].pk, world["student"].pk, "Hi all")
    assert await adb(PendingNote.objects.count)() == 1
    await adb(chat_actions.cancel_run)(world["student"], chat.pk)
    await settle()
    context = await adb(session_messages)(chat)
    assert context[-1]["content"] == "<tess>Hi all</tess>"
    assert context[-2]["role"] == "assistant"
    assert await adb(PendingNote.objects.count)() == 0


async def test_broadcast_reaches_every_class_chat(world):
    other = await adb(actions.open_class_chat)(world["classmate"], world["room"].pk)
    count = await adb(actions.broadcast)(world["teacher"], world["room"].pk, "Five minutes left")
    assert count == 2
    for chat in (world["chat"], other.chat):
        events = await adb(display)(chat)
        assert events[-1].payload["content"] == "Five minutes left"


async def test_pause_keeps_messages_unanswered_and_resume_answers_them(world):
    chat = world["chat"]
    await adb(actions.pause_ai)(world["teacher"], world["room"].pk)
    sent = await chat_actions_send(world["student"], chat.pk, "Are you there?")
    assert sent.held and sent.run_id is None
    await settle()
    assert not await adb(Run.objects.filter(chat=chat).exists)()
    events = await adb(display)(chat)
    assert events[-1].payload["content"] == actions.PAUSED_NOTICE
    assert await adb(HeldInput.objects.count)() == 1
    # The sweeper leaves a held message alone.
    assert await adb(lambda: QueuedInput.objects.get(pk=sent.input_id).consumed)()
    await adb(actions.resume_ai)(world["teacher"], world["room"].pk)
    await until(lambda: Run.objects.filter(chat=chat, status="completed").exists())
    await settle()
    replies = [e for e in await adb(display)(chat) if e.payload.get("role") == "assistant"]
    assert replies and "Are you there?" in str(await adb(session_messages)(chat))


async def test_pause_stops_a_running_reply_keeping_its_text(world):
    chat = world["chat"]
    await adb(chat.__class__.objects.filter(pk=chat.pk).update)(model="demo")
    sent = await chat_actions_send(world["student"], chat.pk, "tell me something long")
    await until(lambda: Run.objects.get(pk=sent.run_id).partial_text != "")
    await adb(actions.pause_ai)(world["teacher"], world["room"].pk)
    await settle()
    run = await adb(Run.objects.get)(pk=sent.run_id)
    assert run.status == "cancelled"
    kinds = [e.kind for e in await adb(display)(chat)]
    assert "cancelled" in kinds


async def test_move_class_marks_every_chat(world):
    _scene, graphs = world["scenes"]
    comm, ok, _ = await open_wall(world["teacher"], world["room"].pk)
    await comm.send_json_to({"action": "resync", "seqs": {}})
    await comm.send_json_to({"action": "move", "scene": graphs.pk})
    frames = await frames_until(comm, "Scene 2: Graphs")
    await comm.disconnect()
    assert "Scene 2: Graphs" in frames
    events = await adb(display)(world["chat"])
    assert events[-1].kind == "scene" and events[-1].payload["title"] == "Graphs"


async def test_a_flagged_message_shows_on_the_tile_and_is_reviewed(world):
    chat = world["chat"]
    comm, ok, _ = await open_wall(world["teacher"], world["room"].pk)
    await comm.send_json_to({"action": "resync", "seqs": {str(chat.pk): chat.last_display_seq}})
    await chat_actions_send(world["student"], chat.pk, "my email is sam@example.com")
    frames = await frames_until(comm, "personal data: an email address")
    assert f'id="tile-flags-{chat.pk}"' in frames
    await settle()  # the personas quote the address back: their replies are flagged too
    flag = await adb(Flag.objects.get)(source="student")
    assert flag.severity == Flag.Severity.MEDIUM and flag.seq > 0
    for each in await adb(lambda: list(Flag.objects.all()))():
        await comm.send_json_to({"action": "review", "flag": each.pk})
    await frames_until(comm, f'id="tile-flags-{chat.pk}" class="tile-flags" hx-swap-oob')
    await comm.disconnect()
    assert not await adb(Flag.objects.filter(reviewed_at__isnull=True).exists)()


async def test_hold_keeps_the_reply_until_the_flag_is_reviewed(world):
    room = world["room"]
    await adb(actions.save_guardrails)(
        world["teacher"], room.pk, categories=["bullying"], words="", on_flag=OnFlag.HOLD
    )
    chat = world["chat"]
    sent = await chat_actions_send(world["student"], chat.pk, "you are stupid")
    assert sent.held
    assert (await adb(display)(chat))[-1].payload["content"] == actions.HOLD_NOTICE
    await settle()
    assert not await adb(Run.objects.filter(chat=chat).exists)()
    flag = await adb(Flag.objects.get)()
    await adb(actions.review_flag)(world["teacher"], room.pk, flag.pk)
    await until(lambda: Run.objects.filter(chat=chat, status="completed").exists())
    await settle()


async def test_a_persona_reply_is_moderated_when_the_run_ends(world):
    room = world["room"]
    await adb(actions.save_guardrails)(
        world["teacher"], room.pk, categories=["teacher_words"], words="Equations", on_flag="notice"
    )
    chat = world["chat"]
    await chat_actions_send(world["student"], chat.pk, "hello")
    await until(lambda: Run.objects.filter(chat=chat, status="completed").exists())
    await settle()
    flags = await adb(lambda: list(Flag.objects.filter(source="persona")))()
    assert flags and flags[0].speaker  # the demo's personas name the scene, "Equations"
    assert (await adb(display)(chat))[-1].payload["content"] == actions.REPLY_FLAG_NOTICE


def test_the_class_export(world):
    chat = world["chat"]
    actions.step_in(world["teacher"], world["room"].pk, world["student"].pk, "Well done")
    chat_actions.send_message(world["student"], chat.pk, "call me on 0612345678", "c1")
    response = as_user(world["teacher"]).get(f"/classes/{world['room'].pk}/export.zip")
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    names = sorted(archive.namelist())
    assert names == ["flags.csv", "summary.csv", f"transcripts/sam-{world['student'].pk}.md"]
    transcript = archive.read(names[-1]).decode()
    assert "## tess (teacher)" in transcript and "## sam" in transcript
    summary = list(csv.DictReader(io.StringIO(archive.read("summary.csv").decode())))
    assert summary[0]["student"] == "sam" and summary[0]["flags"] == "1"
    flags = list(csv.DictReader(io.StringIO(archive.read("flags.csv").decode())))
    assert flags[0]["reason"] == "personal data: a phone number"
    assert store.last_display_seq(chat.pk) > 0


async def test_the_api_answers_a_held_message_at_once(world):
    from django.test import AsyncClient

    from chat.apikeys import create_api_key

    await adb(actions.pause_ai)(world["teacher"], world["room"].pk)
    _key, raw = await adb(create_api_key)(world["student"], "t")
    response = await AsyncClient().post(
        f"/api/v1/classrooms/{world['room'].pk}/chat",
        data={"user_message": "hello?"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {raw}"},
    )
    assert response.status_code == 202
    body = response.json()
    assert body["type"] == "held" and body["message"] == actions.PAUSED_NOTICE
    assert body["messages"][0]["content"] == "hello?"
