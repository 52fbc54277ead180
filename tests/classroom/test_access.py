"""Who sees what in classrooms: every classroom URL, the class chat's socket and the API.

Outsiders (a student of another class, a teacher of another class) get a 404 exactly
like a class that does not exist; an anonymous visitor gets the login page (or a 401
from the API). A student never reads another student's class chat; the class's teacher
may watch it, read-only.
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.http import Http404
from django.test import AsyncClient, Client

from chat.apikeys import create_api_key
from classroom import actions
from classroom.models import Enrollment
from tests.live.test_consumer import open_socket

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(make_user, default_agent):
    teacher = make_user("tess", teacher=True)
    other_teacher = make_user("otto", teacher=True)
    room = actions.create_classroom(teacher, title="Algebra", model="demo-fast")
    scene = actions.save_scene(teacher, room.pk, title="Equations", content="x")
    other_room = actions.create_classroom(other_teacher, title="History", model="demo-fast")
    student = make_user("sam")
    other_student = make_user("olga")
    actions.join_classroom(student, room.join_code)
    actions.join_classroom(other_student, other_room.join_code)
    link = actions.open_class_chat(student, room.pk)
    return {
        "teacher": teacher,
        "other_teacher": other_teacher,
        "student": student,
        "other_student": other_student,
        "room": room,
        "scene": scene,
        "persona": room.personas.first(),
        "enrollment": Enrollment.objects.get(student=student),
        "chat": link.chat,
    }


def teacher_urls(w) -> list[tuple[str, str]]:
    c, s, p, e = w["room"].pk, w["scene"].pk, w["persona"].pk, w["enrollment"].pk
    return [
        ("get", f"/classes/{c}/scenes/new/"),
        ("post", f"/classes/{c}/scenes/new/"),
        ("get", f"/classes/{c}/scenes/{s}/"),
        ("post", f"/classes/{c}/scenes/{s}/"),
        ("post", f"/classes/{c}/scenes/preview/"),
        ("post", f"/classes/{c}/scenes/{s}/move/"),
        ("post", f"/classes/{c}/scenes/{s}/current/"),
        ("post", f"/classes/{c}/scenes/{s}/delete/"),
        ("get", f"/classes/{c}/personas/new/"),
        ("post", f"/classes/{c}/personas/new/"),
        ("get", f"/classes/{c}/personas/{p}/"),
        ("post", f"/classes/{c}/personas/{p}/"),
        ("post", f"/classes/{c}/personas/{p}/delete/"),
        ("post", f"/classes/{c}/settings/"),
        ("post", f"/classes/{c}/code/"),
        ("post", f"/classes/{c}/archive/"),
        ("post", f"/classes/{c}/roster/{e}/remove/"),
        ("post", f"/classes/{c}/co-teachers/add/"),
        ("post", f"/classes/{c}/co-teachers/{w['other_teacher'].pk}/remove/"),
    ]


def class_urls(w) -> list[tuple[str, str]]:
    c = w["room"].pk
    return [
        ("get", f"/classes/{c}/"),
        ("get", f"/classes/{c}/chat/"),
        ("get", f"/classes/{c}/cast.css"),
        *teacher_urls(w),
    ]


def as_user(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.mark.parametrize("who", ["other_student", "other_teacher"])
def test_outsiders_get_404_on_every_class_url(world, who):
    client = as_user(world[who])
    for method, url in class_urls(world):
        response = getattr(client, method)(url)
        assert response.status_code == 404, (method, url, response.status_code)
    assert client.get(f"/chat/{world['chat'].pk}/").status_code == 404


def test_anonymous_visitors_get_the_login_page(world):
    client = as_user(None)
    for method, url in class_urls(world):
        response = getattr(client, method)(url)
        assert response.status_code == 302 and "/login/" in response["Location"], (method, url)


def test_a_student_studies_but_does_not_teach(world):
    client = as_user(world["student"])
    assert client.get(f"/classes/{world['room'].pk}/").status_code == 302  # to their chat
    assert client.get(f"/classes/{world['room'].pk}/chat/").status_code == 200
    for method, url in teacher_urls(world):
        assert getattr(client, method)(url).status_code == 404, (method, url)


def test_a_student_cannot_read_another_students_class_chat(world, make_user):
    classmate = make_user("cleo")
    actions.join_classroom(classmate, world["room"].join_code)
    client = as_user(classmate)
    assert client.get(f"/chat/{world['chat'].pk}/").status_code == 404
    assert client.get(f"/chat/{world['chat'].pk}/export.md").status_code == 404
    # Their own class chat is another chat.
    assert client.get(f"/classes/{world['room'].pk}/chat/").status_code == 200
    assert actions.open_class_chat(classmate, world["room"].pk).chat_id != world["chat"].pk


def test_a_removed_student_keeps_reading_their_class_chat_but_no_longer_writes(world):
    from chat import actions as chat_actions
    from chat.access import ChatAction, can_access_chat

    student, chat = world["student"], world["chat"]
    assert can_access_chat(student, chat, ChatAction.WRITE)
    assert not can_access_chat(student, chat, ChatAction.MANAGE)  # the class's, not theirs
    actions.remove_student(world["teacher"], world["room"].pk, world["enrollment"].pk)
    chat.refresh_from_db()
    assert can_access_chat(student, chat, ChatAction.VIEW)
    assert not can_access_chat(student, chat, ChatAction.WRITE)
    with pytest.raises(Http404):
        chat_actions.send_message(student, chat.pk, "still here?", "c-late")
    page = as_user(student).get(f"/chat/{chat.pk}/")
    assert page.status_code == 200 and b"view-only" in page.content


def test_the_teacher_may_watch_a_students_class_chat(world):
    client = as_user(world["teacher"])
    page = client.get(f"/chat/{world['chat'].pk}/")
    assert page.status_code == 200
    assert b"only its owner can write" in page.content
    assert client.get(f"/chat/{world['chat'].pk}/delete/").status_code == 404


async def test_the_class_chat_socket(world):
    chat_id = world["chat"].pk
    for who in ("other_student", "other_teacher"):
        _socket, ok, code = await open_socket(world[who], chat_id, resync=None)
        assert not ok, who
    _socket, ok, _code = await open_socket(None, chat_id, resync=None)
    assert not ok
    mine, ok, _ = await open_socket(world["student"], chat_id, resync=None)
    assert ok
    await mine.close()
    watcher, ok, _ = await open_socket(world["teacher"], chat_id, resync=None)
    assert ok
    await watcher.comm.send_json_to({"action": "send", "message": "hi", "client_id": "t1"})
    frame = await watcher.comm.receive_from(timeout=5)
    assert "You can only watch this chat." in frame
    await watcher.close()


async def test_the_api_routes(world):
    client = AsyncClient()
    base = f"/api/v1/classrooms/{world['room'].pk}"
    routes = [("post", f"{base}/chat"), ("post", f"{base}/chat/stream"), ("get", f"{base}/history")]
    for who in ("other_student", "other_teacher"):
        _key, raw = await database_sync_to_async(create_api_key)(world[who], "t")
        for method, url in routes:
            kwargs = {"data": {"user_message": "hi"}, "content_type": "application/json"}
            response = await getattr(client, method)(
                url,
                headers={"Authorization": f"Bearer {raw}"},
                **(kwargs if method == "post" else {}),
            )
            assert response.status_code == 404, (who, url, response.status_code)
    for method, url in routes:
        response = await getattr(client, method)(url)
        assert response.status_code == 401


def test_the_pages_render_for_those_who_may_see_them(world):
    teacher, student, room = as_user(world["teacher"]), as_user(world["student"]), world["room"]
    listing = teacher.get("/classes/").content.decode()
    assert "New class" in listing and "Algebra" in listing and "History" not in listing
    detail = teacher.get(f"/classes/{room.pk}/").content.decode()
    for text in ("Scenes", "Personas", "Roster", room.join_code, "sam", "Ada", "Equations"):
        assert text in detail
    for url in (f"/classes/{room.pk}/scenes/new/", f"/classes/{room.pk}/personas/new/"):
        assert teacher.get(url).status_code == 200
    assert (
        '.msg.labelled[aria-label="Ada"]'
        in teacher.get(f"/classes/{room.pk}/cast.css").content.decode()
    )
    chat = student.get(f"/classes/{room.pk}/chat/").content.decode()
    for text in (
        'aria-label="Scene"',
        "Your teacher can see the chats of this class",
        "Theo",
        "Scene 1: Equations",
        f'ws-connect="/ws/chat/{world["chat"].pk}/"',
    ):
        assert text in chat
    home = student.get("/").content.decode()
    assert "Your classes" in home and "Join code" in home and "Algebra" in home
    assert 'href="/classes/"' in home  # "Classes" in the top bar


def test_the_forms_report_problems_clearly(world, make_user):
    kid = as_user(make_user("kid"))
    response = kid.post("/classes/join/", {"code": "WRONG234"}, follow=True)
    assert "That join code is wrong or no longer valid" in response.content.decode()
    response = kid.post("/classes/join/", {"code": world["room"].join_code})
    assert response["Location"] == f"/classes/{world['room'].pk}/chat/"
    assert kid.get("/classes/new/").status_code == 404  # students make no classes
    teacher = as_user(world["teacher"])
    response = teacher.post("/classes/new/", {"title": "", "model": "demo-fast"}, follow=True)
    assert "A class needs a title." in response.content.decode()
    response = teacher.post(
        f"/classes/{world['room'].pk}/personas/new/",
        {"name": "ADA", "role": "student"},
        follow=True,
    )
    assert "The class already has a persona named ADA." in response.content.decode()


async def test_every_write_action_of_a_watcher_is_refused_and_changes_nothing(world):
    """The socket checks a write in the action's own database trip: each one refused."""
    from chat.live.consumers import WRITE_ACTIONS
    from chat.models import ChatEvent, QueuedInput, Run

    chat_id = world["chat"].pk

    def snapshot():
        return (
            ChatEvent.objects.filter(chat_id=chat_id).count(),
            QueuedInput.objects.filter(chat_id=chat_id).count(),
            Run.objects.filter(chat_id=chat_id).count(),
        )

    before = await database_sync_to_async(snapshot)()
    watcher, ok, _ = await open_socket(world["teacher"], chat_id, resync=None)
    assert ok
    frames = {
        "send": {"message": "hi", "client_id": "w1"},
        "edit": {"seq": 1, "message": "hi", "client_id": "w2"},
        "edit_last": {"message": "hi", "client_id": "w3"},
        "switch_version": {"base": 1, "index": 0},
        "regenerate": {},
        "approve": {"call_id": "c"},
        "always": {"call_id": "c"},
        "deny": {"call_id": "c"},
        "switch_model": {"model": "demo"},
        "compact": {},
        "cancel": {},
    }
    assert set(frames) == WRITE_ACTIONS  # a new write action gets its line here
    for action, fields in frames.items():
        await watcher.comm.send_json_to({"action": action, **fields})
        frame = await watcher.comm.receive_from(timeout=5)
        assert "You can only watch this chat." in frame, action
    await watcher.close()
    assert await database_sync_to_async(snapshot)() == before
