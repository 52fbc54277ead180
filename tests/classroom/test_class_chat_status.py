"""The class chat page's status line: what the student's run does, and nothing when
none runs (it once showed "None", and a run's own name while one ran)."""

from __future__ import annotations

import pytest

from chat.models import Run
from tests.classroom.test_resume_markers import logged_in, room  # noqa: F401 - a fixture by name
from tests.pages.test_chat_views import run_status_of

pytestmark = pytest.mark.django_db


def status_line(client, classroom) -> str:
    return run_status_of(client.get(f"/classes/{classroom.pk}/chat/").content.decode())


def test_the_class_chat_status_line_follows_the_run(room):  # noqa: F811
    _teacher, student, classroom, chat = room
    client = logged_in(student)
    assert status_line(client, classroom) == ""
    run = Run.objects.create(chat=chat, model="demo-fast")
    assert status_line(client, classroom) == "Working…"
    Run.objects.filter(pk=run.pk).update(status=Run.Status.WAITING)
    assert status_line(client, classroom) == "Waiting for your approval"
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)
    assert status_line(client, classroom) == ""


def test_the_status_line_speaks_the_students_language(room):  # noqa: F811
    _teacher, student, classroom, chat = room
    Run.objects.create(chat=chat, model="demo-fast")
    client = logged_in(student)
    client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/"})
    assert status_line(client, classroom) == "处理中…"
