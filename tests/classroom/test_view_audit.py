"""Every teacher read of a student's class chat is recorded, whichever way it goes: the
generic chat page, its export, its live socket, the chat API and the artifact views.
The student's "Who viewed this chat" list shows each; the student's own reads and a
refused read record nothing."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.db import transaction
from django.test import Client

from chat import artifacts
from chat.apikeys import create_api_key
from chat.models import Run
from chatsite.asgi import application
from classroom import actions
from classroom.models import TeacherView
from tests.live.test_consumer import ORIGIN, session_cookie
from tests.runhost.helpers import adb

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 10


@pytest.fixture(autouse=True)
def _storage(settings, tmp_path):
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.fixture
def world(make_user, default_agent):
    teacher = make_user("tess", teacher=True)
    room = actions.create_classroom(teacher, title="Algebra", model="demo-fast")
    student = make_user("sam")
    actions.join_classroom(student, room.join_code)
    chat = actions.open_class_chat(student, room.pk).chat
    with transaction.atomic():
        saved = artifacts.save_version(chat.pk, "notes.md", b"# Notes\n", source="upload")
    assert saved is not None
    return {
        "teacher": teacher,
        "student": student,
        "room": room,
        "chat": chat,
        "artifact": saved.artifact,
    }


def as_user(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def hows() -> list[str]:
    return sorted(TeacherView.objects.values_list("how", flat=True))


def viewers_list(world) -> str:
    page = as_user(world["student"]).get(f"/classes/{world['room'].pk}/chat/")
    return page.content.decode()


def test_the_chat_page_and_its_older_messages_are_recorded(world):
    chat = world["chat"]
    teacher = as_user(world["teacher"])
    assert teacher.get(f"/chat/{chat.pk}/").status_code == 200
    assert teacher.get(f"/chat/{chat.pk}/older/?before=1").status_code == 200
    assert hows() == ["page", "page"]
    assert "tess · page · 2 times" in viewers_list(world)


@pytest.mark.parametrize("fmt", ["md", "json"])
def test_the_chat_export_is_recorded(world, fmt):
    chat = world["chat"]
    response = as_user(world["teacher"]).get(f"/chat/{chat.pk}/export.{fmt}")
    assert response.status_code == 200
    assert hows() == ["export"]
    assert "tess · export · 1 time" in viewers_list(world)


def test_every_artifact_view_is_recorded(world):
    chat, artifact = world["chat"], world["artifact"]
    teacher = as_user(world["teacher"])
    urls = [
        f"/chat/{chat.pk}/artifacts/",
        f"/chat/{chat.pk}/artifacts.zip",
        f"/artifacts/{artifact.pk}/",
        f"/artifacts/{artifact.pk}/v1/download",
    ]
    for url in urls:
        response = teacher.get(url)
        assert response.status_code == 200, url
        if response.streaming:
            b"".join(response.streaming_content)
    assert hows() == ["artifact"] * 4
    assert "tess · artifact · 4 times" in viewers_list(world)


def test_the_chat_api_reads_are_recorded(world):
    chat, artifact = world["chat"], world["artifact"]
    key = create_api_key(world["teacher"], "tests")[1]
    headers = {"Authorization": f"Bearer {key}"}
    client = Client()
    run = Run.objects.create(chat=chat, status=Run.Status.COMPLETED, model="demo-fast")
    assert client.get(f"/api/v1/chat/{chat.pk}/runs/{run.pk}", headers=headers).status_code == 200
    assert client.get(f"/api/v1/chat/{chat.pk}/artifacts", headers=headers).status_code == 200
    assert client.get(f"/api/v1/artifacts/{artifact.pk}", headers=headers).status_code == 200
    download = f"/api/v1/artifacts/{artifact.pk}/versions/1/download"
    assert client.get(download, headers=headers).status_code == 200
    assert hows() == ["api", "api", "artifact", "artifact"]
    page = viewers_list(world)
    assert "tess · api · 2 times" in page and "tess · artifact · 2 times" in page


def test_the_student_reading_their_own_chat_records_nothing(world):
    chat, artifact = world["chat"], world["artifact"]
    student = as_user(world["student"])
    for url in (
        f"/chat/{chat.pk}/",
        f"/chat/{chat.pk}/export.md",
        f"/chat/{chat.pk}/artifacts/",
        f"/artifacts/{artifact.pk}/",
    ):
        assert student.get(url).status_code == 200, url
    assert hows() == []
    assert "No teacher has viewed this chat yet." in viewers_list(world)


def test_a_refused_read_records_nothing(world, make_user):
    stranger = as_user(make_user("olga", teacher=True))
    chat = world["chat"]
    assert stranger.get(f"/chat/{chat.pk}/").status_code == 404
    assert stranger.get(f"/chat/{chat.pk}/export.md").status_code == 404
    assert hows() == []


async def test_the_chat_socket_is_recorded(world):
    chat = world["chat"]
    sid = await adb(session_cookie)(world["teacher"])
    cookie = f"{django_settings.SESSION_COOKIE_NAME}={sid}".encode()
    comm = WebsocketCommunicator(
        application, f"/ws/chat/{chat.pk}/", [(b"origin", ORIGIN), (b"cookie", cookie)]
    )
    connected, _ = await comm.connect(timeout=WAIT)
    assert connected
    await comm.disconnect()
    assert await adb(hows)() == ["socket"]
    assert "tess · socket · 1 time" in await adb(viewers_list)(world)
    # The student's own socket is not an audit row.
    sid = await adb(session_cookie)(world["student"])
    cookie = f"{django_settings.SESSION_COOKIE_NAME}={sid}".encode()
    comm = WebsocketCommunicator(
        application, f"/ws/chat/{chat.pk}/", [(b"origin", ORIGIN), (b"cookie", cookie)]
    )
    connected, _ = await comm.connect(timeout=WAIT)
    assert connected
    await comm.disconnect()
    assert await adb(hows)() == ["socket"]
