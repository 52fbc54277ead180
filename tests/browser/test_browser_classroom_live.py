"""A class in Chromium, beyond the first lesson: the scene panel follows the class live,
and a co-teacher added by the owner runs the class.

Driven by accessible names: region "Scene", region "Messages", the class page's
"Co-teachers" section (textbox "Username or email", button "Add co-teacher").
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from classroom import actions
from tests.browser.test_browser_chat import WAIT_MS, messages, serve, wait_socket_open  # noqa: F401
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_students_scene_panel_follows_the_teacher_live(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    make_user,
):
    tess = make_user("tess", teacher=True)
    make_user("sam")
    room = actions.create_classroom(tess, title="Fractions", model="demo-fast")
    actions.save_scene(tess, room.pk, title="Adding fractions", content="# Common denominators")
    actions.save_scene(
        tess,
        room.pk,
        title="Subtracting fractions",
        kind="quiz",
        content="# Take one away\n\nWhat is 3/4 - 1/4?",
    )
    base = serve()

    student = browser.new_context().new_page()
    student.set_default_timeout(WAIT_MS)
    login(student, base, "sam")
    student.goto(f"{base}/classes/join/{room.join_code}/")
    student.get_by_role("button", name="Join").click()
    scene = student.get_by_role("region", name="Scene")
    expect(scene.get_by_role("heading", name="Common denominators")).to_be_visible()
    wait_socket_open(student)

    teacher = browser.new_context().new_page()
    teacher.set_default_timeout(WAIT_MS)
    login(teacher, base, "tess")
    # A persona joins the cast meanwhile: the open page shows it with the scene change.
    actions.save_persona(tess, room.pk, name="Zed", role="student", colour="#ff0000")
    cast = student.get_by_role("list", name="Cast")
    expect(cast).not_to_contain_text("Zed")
    teacher.goto(f"{base}/classes/{room.pk}/")
    teacher.get_by_role("button", name="Set Subtracting fractions as current").click()
    expect(teacher.get_by_role("status")).to_contain_text("Subtracting fractions")

    # The student's page, not reloaded: the marker, then the panel with the new scene.
    expect(messages(student)).to_contain_text("Scene 2: Subtracting fractions")
    expect(scene.get_by_role("heading", level=2)).to_contain_text("Subtracting fractions")
    expect(scene).to_contain_text("Quiz")
    expect(scene.get_by_role("heading", name="Take one away")).to_be_visible()
    expect(scene).to_contain_text("What is 3/4 - 1/4?")
    expect(scene).not_to_contain_text("Common denominators")
    expect(cast).to_contain_text("Zed")
    expect(cast.locator('[data-persona="Zed"]')).to_have_css("color", "rgb(255, 0, 0)")
    assert student.evaluate("performance.getEntriesByType('navigation').length") == 1
