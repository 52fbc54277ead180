"""An open class chat follows the class to its new scene: the side panel and the cast
are pushed with the scene marker (and come again with it on a resync from the log)."""

from __future__ import annotations

import pytest

from chat.presentation import fragments
from classroom import actions
from tests.live.test_consumer import close_all, connected
from tests.runhost.helpers import adb

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(make_user, default_agent):
    teacher = make_user("tess", teacher=True)
    room = actions.create_classroom(teacher, title="Fractions", model="demo-fast")
    first = actions.save_scene(teacher, room.pk, title="Adding", content="# Add them")
    second = actions.save_scene(
        teacher, room.pk, title="Subtracting", kind="quiz", content="# Take away\n\nTry 3/4 - 1/4."
    )
    students = [make_user("sam"), make_user("sue")]
    chats = []
    for student in students:
        actions.join_classroom(student, room.join_code)
        chat = actions.open_class_chat(student, room.pk).chat
        chat.refresh_from_db()
        chats.append(chat)
    return {
        "teacher": teacher,
        "room": room,
        "scenes": (first, second),
        "students": students,
        "chats": chats,
    }


def _panel_of(html: str) -> str:
    start = html.index('<aside id="scene-panel"')
    return html[start : html.index("</aside>", start)]


def test_the_marker_fragments_carry_the_new_scene_and_the_cast(world):
    chat = world["chats"][0]
    before = chat.last_display_seq
    actions.set_current_scene(world["teacher"], world["room"].pk, world["scenes"][1].pk)
    _events, html = fragments.next_batch(str(chat.pk), before)
    assert "Scene 2: Subtracting" in html
    panel = _panel_of(html)
    assert 'hx-swap-oob="true"' in panel and 'aria-label="Scene"' in panel
    assert "Subtracting" in panel and "quiz" in panel.lower()
    assert "<h1>Take away</h1>" in panel and "Try 3/4 - 1/4." in panel
    assert "Adding" not in panel
    assert '<ul id="cast"' in html and "Maya" in html
    assert 'id="cast-css"' in html


def test_the_cast_pushed_is_the_cast_as_it_is_now(world):
    teacher, room = world["teacher"], world["room"]
    maya = room.personas.get(name="Maya")
    actions.save_persona(teacher, room.pk, maya.pk, name="Mira", role="student", colour="#ff0000")
    chat = world["chats"][0]
    before = chat.last_display_seq
    actions.set_current_scene(teacher, room.pk, world["scenes"][1].pk)
    _events, html = fragments.next_batch(str(chat.pk), before)
    cast = html[html.index('<ul id="cast"') :]
    assert "Mira" in cast and "Maya" not in cast[: cast.index("</ul>")]


async def test_every_open_student_page_gets_the_new_scene_live(world):
    sockets = [
        await connected(student, chat.pk, resync=chat.last_display_seq)
        for student, chat in zip(world["students"], world["chats"], strict=True)
    ]
    await adb(actions.set_current_scene)(world["teacher"], world["room"].pk, world["scenes"][1].pk)
    for socket in sockets:
        frame = await socket.until_frame(lambda f: 'id="scene-panel"' in f)
        assert "Scene 2: Subtracting" in frame
        assert "<h1>Take away</h1>" in _panel_of(frame)
    await close_all(*sockets)


async def test_a_page_resyncing_after_the_move_gets_the_new_scene(world):
    chat = world["chats"][0]
    before = chat.last_display_seq
    await adb(actions.set_current_scene)(world["teacher"], world["room"].pk, world["scenes"][1].pk)
    socket = await connected(world["students"][0], chat.pk, resync=before)
    frame = await socket.until_frame(lambda f: 'id="scene-panel"' in f)
    assert "Take away" in _panel_of(frame)
    await close_all(socket)
