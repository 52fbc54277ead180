"""A class in Chromium: a teacher makes it, a student joins and hears two personas, live.

Driven by accessible names only (the issue's contract): link "Classes", button
"New class", textbox "Join code" with button "Join", one bubble per persona labelled
with its name, region "Scene".
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from tests.browser.test_browser_chat import WAIT_MS, composer, messages, serve, wait_socket_open  # noqa: F401
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TEACHER_LINE_END = "where would you start?"


def bubble_lengths_while_streaming(page: Page, name: str) -> list[int]:
    """Lengths of ``name``'s streaming bubble, sampled until it is written as a message."""
    lengths: list[int] = []
    stream = page.locator("#stream").get_by_role("article", name=name, exact=True)
    written = messages(page).get_by_role("article", name=name, exact=True)
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline and written.count() == 0:
        texts = stream.locator(".bubble").all_inner_texts()
        if texts and texts[0].strip():
            lengths.append(len(texts[0].strip()))
        page.wait_for_timeout(25)
    return lengths


def test_teacher_creates_a_class_and_a_student_hears_two_personas_live(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    make_user,
):
    make_user("tess", teacher=True)
    make_user("sam")
    base = serve(token_delay=0.04)

    teacher = browser.new_context().new_page()
    teacher.set_default_timeout(WAIT_MS)
    login(teacher, base, "tess")
    teacher.get_by_role("link", name="Classes").click()
    teacher.get_by_role("button", name="New class").click()
    teacher.get_by_label("Title").fill("Fractions 101")
    teacher.get_by_label("Subject").fill("Maths")
    teacher.get_by_label("Model").select_option("demo")
    teacher.get_by_role("button", name="Create class").click()
    expect(teacher.get_by_role("heading", name="Fractions 101", level=1)).to_be_visible()
    teacher.get_by_role("button", name="Add scene").click()
    teacher.get_by_label("Title").fill("Adding fractions")
    teacher.get_by_label("Kind").select_option("practice")
    teacher.get_by_label(re.compile(r"^Content")).fill("# Common denominators\n\nFind one first.")
    expect(teacher.get_by_role("region", name="Preview").get_by_role("heading")).to_have_text(
        "Common denominators"
    )
    teacher.get_by_role("button", name="Save scene").click()
    expect(teacher.get_by_role("list", name="Scenes")).to_contain_text("Adding fractions")
    code = teacher.locator("#join-code-value").inner_text().strip()
    assert re.fullmatch(r"[A-Z2-9]{8}", code)

    student = browser.new_context().new_page()
    student.set_default_timeout(WAIT_MS)
    login(student, base, "sam")
    student.get_by_role("textbox", name="Join code").fill("WRONG234")
    student.get_by_role("button", name="Join").click()
    expect(student.get_by_role("status")).to_contain_text("wrong or no longer valid")
    student.get_by_role("textbox", name="Join code").fill(code.lower())
    student.get_by_role("button", name="Join").click()
    scene = student.get_by_role("region", name="Scene")
    expect(scene).to_contain_text("Adding fractions")
    expect(scene.get_by_role("heading", name="Common denominators")).to_be_visible()
    expect(student.get_by_text("Your teacher can see the chats of this class")).to_be_visible()
    expect(messages(student)).to_contain_text("Scene 1: Adding fractions")
    wait_socket_open(student)

    composer(student).fill("How do I add 1/2 and 1/3?")
    composer(student).press("Enter")
    ada_lengths = bubble_lengths_while_streaming(student, "Ada")
    assert len(set(ada_lengths)) >= 3, ada_lengths  # it grew, snapshot by snapshot
    assert ada_lengths == sorted(ada_lengths)

    ada = messages(student).get_by_role("article", name="Ada", exact=True)
    maya = messages(student).get_by_role("article", name="Maya", exact=True)
    expect(ada).to_contain_text(TEACHER_LINE_END)
    expect(ada).to_contain_text("Adding fractions")  # the demo names the scene
    expect(maya).to_contain_text("I was wondering about")
    expect(messages(student).locator(".msg.usage")).to_have_count(1)
    assert "<Ada>" not in messages(student).inner_text()

    student.reload()
    expect(messages(student).get_by_role("article", name="Ada", exact=True)).to_contain_text(
        TEACHER_LINE_END
    )
    expect(messages(student).get_by_role("article", name="Maya", exact=True)).to_have_count(1)

    # The teacher moves the class on: the student's chat gets the marker, live.
    teacher.get_by_role("button", name="Add scene").click()
    teacher.get_by_label("Title").fill("Subtracting fractions")
    teacher.get_by_role("button", name="Save scene").click()
    teacher.get_by_role("button", name="Set Subtracting fractions as current").click()
    wait_socket_open(student)
    expect(messages(student)).to_contain_text("Scene 2: Subtracting fractions")
