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


def test_the_owner_adds_a_co_teacher_who_opens_the_class_and_its_wall(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    make_user,
):
    tess = make_user("tess", teacher=True)
    cora = make_user("cora", teacher=True)
    cora.email = "cora@school.example"
    cora.save()
    sam = make_user("sam")
    room = actions.create_classroom(tess, title="Fractions", model="demo-fast")
    actions.save_scene(tess, room.pk, title="Adding fractions", content="# Add")
    actions.join_classroom(sam, room.join_code)
    actions.open_class_chat(sam, room.pk)
    base = serve()

    owner = browser.new_context().new_page()
    owner.set_default_timeout(WAIT_MS)
    login(owner, base, "tess")
    owner.get_by_role("link", name="Classes").click()
    owner.get_by_role("link", name="Fractions").click()
    section = owner.get_by_role("region", name="Co-teachers")
    expect(section).to_contain_text("No co-teachers.")
    section.get_by_role("textbox", name="Username or email").fill("nobody")
    section.get_by_role("button", name="Add co-teacher").click()
    expect(owner.get_by_role("status")).to_contain_text(
        "No teacher has the username or email “nobody”."
    )
    section.get_by_role("textbox", name="Username or email").fill("cora@school.example")
    section.get_by_role("button", name="Add co-teacher").click()
    expect(owner.get_by_role("status")).to_contain_text("cora now co-teaches this class.")
    expect(section.get_by_role("list", name="Co-teachers")).to_contain_text("cora")

    co = browser.new_context().new_page()
    co.set_default_timeout(WAIT_MS)
    login(co, base, "cora")
    co.get_by_role("link", name="Classes").click()
    classes = co.get_by_role("list", name="Classes you teach")
    expect(classes).to_contain_text("co-teacher with tess")
    classes.get_by_role("link", name="Fractions").click()
    expect(co.get_by_role("heading", name="Fractions", level=1)).to_be_visible()
    expect(co.get_by_role("list", name="Scenes")).to_contain_text("Adding fractions")
    co_section = co.get_by_role("region", name="Co-teachers")
    expect(co_section).to_contain_text("cora")
    expect(co_section.get_by_role("button", name="Add co-teacher")).to_have_count(0)
    expect(co.get_by_role("button", name="Archive class")).to_have_count(0)
    co.get_by_role("link", name="Live wall").click()
    wall = co.get_by_role("region", name="Class wall")
    expect(wall.get_by_role("article", name="sam", exact=True)).to_contain_text(
        "Scene 1: Adding fractions"
    )
    wait_socket_open(co)

    # The owner takes the co-teacher off the class: the wall is theirs no longer.
    section = owner.get_by_role("region", name="Co-teachers")
    section.get_by_role("button", name="Remove co-teacher cora").click()
    expect(owner.get_by_role("status")).to_contain_text("cora no longer co-teaches this class.")
    co.reload()
    expect(co.get_by_role("region", name="Class wall")).to_have_count(0)
