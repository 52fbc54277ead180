"""Join codes that expire, and the teacher's forms reporting each problem clearly
(empty titles, a scene content over the limit, a model outside the whitelist)."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.utils import timezone

from chat.actions import ActionError
from classroom import actions
from classroom.models import SCENE_CONTENT_MAX, Classroom, Enrollment
from tests.classroom.test_access import as_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def teacher(make_user):
    return make_user("tess", teacher=True)


@pytest.fixture
def room(teacher, default_agent):
    return actions.create_classroom(teacher, title="Algebra", model="demo-fast")


def text_of(response) -> str:
    return html.unescape(response.content.decode())


# --- join codes ----------------------------------------------------------------------------------


def test_a_code_made_to_expire_works_until_then(make_user, teacher, room):
    assert room.join_code_expires_at is None  # a new class's code works until regenerated
    code = actions.regenerate_join_code(teacher, room.pk, 7)
    room.refresh_from_db()
    assert room.join_code == code
    left = room.join_code_expires_at - timezone.now()
    assert timedelta(days=6, hours=23) < left <= timedelta(days=7)
    assert actions.join_classroom(make_user("early"), code).pk == room.pk

    Classroom.objects.filter(pk=room.pk).update(
        join_code_expires_at=timezone.now() - timedelta(minutes=1)
    )
    late = make_user("late")
    with pytest.raises(ActionError, match="That join code has expired. Ask your teacher"):
        actions.join_classroom(late, code)
    assert not Enrollment.objects.filter(student=late).exists()
    # The student at the join form sees why.
    response = as_user(late).post("/classes/join/", {"code": code}, follow=True)
    assert "That join code has expired. Ask your teacher for a new one." in text_of(response)
    # The teacher sees it on the roster, and a new code without a limit lets them in.
    page = text_of(as_user(teacher).get(f"/classes/{room.pk}/"))
    assert "This code expired on" in page
    new = actions.regenerate_join_code(teacher, room.pk)
    room.refresh_from_db()
    assert room.join_code_expires_at is None
    assert actions.join_classroom(late, new).pk == room.pk
    with pytest.raises(ActionError, match="wrong or no longer valid"):
        actions.join_classroom(make_user("old"), code)  # the old code is gone


def test_regenerating_from_the_roster(teacher, room):
    client = as_user(teacher)
    response = client.post(f"/classes/{room.pk}/code/", {"valid_for": "1"}, follow=True)
    room.refresh_from_db()
    page = text_of(response)
    assert f"New join code: {room.join_code}." in page
    assert "This code works until" in page
    assert room.join_code_expires_at is not None
    response = client.post(f"/classes/{room.pk}/code/", {"valid_for": "5"}, follow=True)
    assert "Choose how long the code stays valid." in text_of(response)
    response = client.post(f"/classes/{room.pk}/code/", {"valid_for": "x"}, follow=True)
    assert "Choose how long the code stays valid." in text_of(response)


# --- the forms' messages --------------------------------------------------------------------------


def test_the_new_class_form(teacher, default_agent):
    client = as_user(teacher)
    response = client.post("/classes/new/", {"title": " ", "model": "demo-fast"})
    assert "A class needs a title." in text_of(response)
    response = client.post("/classes/new/", {"title": "Chemistry", "model": "gpt-nope"})
    page = text_of(response)
    assert "The model 'gpt-nope' is not available. Pick one of the listed models." in page
    assert 'value="Chemistry"' in page  # what was typed is kept
    assert not Classroom.objects.filter(title="Chemistry").exists()


def test_the_settings_form(teacher, room):
    client = as_user(teacher)
    url = f"/classes/{room.pk}/settings/"
    response = client.post(url, {"title": "", "model": "demo-fast"}, follow=True)
    assert "A class needs a title." in text_of(response)
    response = client.post(url, {"title": "Algebra 2", "model": "gpt-nope"}, follow=True)
    assert "The model 'gpt-nope' is not available." in text_of(response)
    room.refresh_from_db()
    assert (room.title, room.model) == ("Algebra", "demo-fast")


def test_the_scene_form(teacher, room):
    client = as_user(teacher)
    url = f"/classes/{room.pk}/scenes/new/"
    response = client.post(url, {"title": "", "kind": "lecture", "content": "# Hi"})
    page = text_of(response)
    assert "A scene needs a title." in page and "# Hi" in page
    too_long = "x" * (SCENE_CONTENT_MAX + 1)
    response = client.post(url, {"title": "Big", "kind": "lecture", "content": too_long})
    assert (
        f"The scene content is too long ({SCENE_CONTENT_MAX + 1} characters; the limit is "
        f"{SCENE_CONTENT_MAX})." in text_of(response)
    )
    assert not room.scenes.exists()


def test_the_persona_form(teacher, room):
    client = as_user(teacher)
    url = f"/classes/{room.pk}/personas/new/"
    response = client.post(url, {"name": "maya", "role": "student"})
    assert "The class already has a persona named maya." in text_of(response)
    response = client.post(url, {"name": "Zoe", "role": "student", "model": "gpt-nope"})
    assert "The model 'gpt-nope' is not available." in text_of(response)
    response = client.post(url, {"name": "", "role": "student"})
    assert "A persona needs a name." in text_of(response)
    assert room.personas.count() == 4
