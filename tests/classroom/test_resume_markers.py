"""Where a class page's socket resumes: the newest event the page shows.

The chat row (with its count of events) is read before the page's events; a reply
written in between is on the page, and a marker taken from the row alone had the
socket's resync push that reply again: the student's page, or the teacher's tile,
showed it twice.
"""

from __future__ import annotations

import pytest
from django.test import Client

from chat import store
from chat.core.messages import ChatMessage
from classroom import actions, wall
from classroom import views as class_views

pytestmark = pytest.mark.django_db


@pytest.fixture
def room(make_user, default_agent):
    teacher = make_user("tess", teacher=True)
    room = actions.create_classroom(teacher, title="Algebra", model="demo-fast")
    student = make_user("sam")
    actions.join_classroom(student, room.join_code)
    chat = actions.open_class_chat(student, room.pk).chat
    return teacher, student, room, chat


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def reply_lands_before(monkeypatch, module, name: str, chat) -> None:
    """A reply is written just before ``module.name`` reads the chat's events."""
    read = getattr(module, name)

    def reply_first(*args, **kwargs):
        store.append_display_messages(chat.pk, [ChatMessage(role="assistant", content="Hi!")])
        return read(*args, **kwargs)

    monkeypatch.setattr(module, name, reply_first)


def test_the_class_chat_page_resumes_after_a_reply_it_shows(room, monkeypatch):
    _teacher, student, classroom, chat = room
    before = chat.last_display_seq
    reply_lands_before(monkeypatch, class_views, "page_of_items", chat)
    html = logged_in(student).get(f"/classes/{classroom.pk}/chat/").content.decode()
    assert html.count("Hi!") == 1
    assert f'id="seq-marker" data-seq="{before + 1}"' in html


def test_a_wall_tile_resumes_after_a_reply_it_shows(room, monkeypatch):
    teacher, _student, classroom, chat = room
    store.append_display_messages(chat.pk, [ChatMessage(role="user", content="What is x?")])
    before = store.last_display_seq(chat.pk)
    reply_lands_before(monkeypatch, wall.store, "display_events_before", chat)
    html = logged_in(teacher).get(f"/classes/{classroom.pk}/live/").content.decode()
    assert "Hi!" in html
    assert f'id="tile-seq-{chat.pk}" class="tile-seq" data-seq="{before + 1}"' in html
