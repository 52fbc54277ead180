"""The teacher's wall in Chromium: live tiles, stepping in, pause and resume, flags.

Driven by accessible names only (the issue's contract): region "Class wall", an
article per student named after their username, buttons "Pause AI", "Resume AI",
"Move class" with a select "Scene", textbox "Message as teacher" with button
"Send as teacher", button "Broadcast".
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from classroom import actions
from tests.browser.test_browser_chat import WAIT_MS, composer, messages, serve, wait_socket_open  # noqa: F401
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_teacher_watches_steps_in_pauses_resumes_and_sees_a_flag(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    make_user,
):
    tess = make_user("tess", teacher=True)
    sam = make_user("sam")
    room = actions.create_classroom(tess, title="Fractions", model="demo-fast")
    actions.save_scene(tess, room.pk, title="Adding fractions", content="# Add")
    actions.save_scene(tess, room.pk, title="Subtracting", content="# Sub")
    actions.join_classroom(sam, room.join_code)
    actions.save_guardrails(
        tess, room.pk, categories=["teacher_words"], words="calculator", on_flag="notify"
    )
    base = serve(token_delay=0.01)

    student = browser.new_context().new_page()
    student.set_default_timeout(WAIT_MS)
    login(student, base, "sam")
    student.goto(f"{base}/classes/{room.pk}/chat/")
    wait_socket_open(student)

    teacher = browser.new_context().new_page()
    teacher.set_default_timeout(WAIT_MS)
    login(teacher, base, "tess")
    teacher.goto(f"{base}/classes/{room.pk}/live/")
    wall = teacher.get_by_role("region", name="Class wall")
    tile = wall.get_by_role("article", name="sam", exact=True)
    expect(tile).to_contain_text("Scene 1: Adding fractions")
    wait_socket_open(teacher)

    # A student sends: the tile shows it and the personas' replies, live.
    composer(student).fill("How do I add 1/2 and 1/3?")
    composer(student).press("Enter")
    expect(tile).to_contain_text("How do I add 1/2 and 1/3?")
    expect(tile.locator(".tile-item.persona").first).to_be_visible()
    expect(messages(student).get_by_role("article", name="Ada", exact=True)).to_have_count(1)

    # The teacher steps in: the student sees the labelled message, live.
    tile.get_by_role("textbox", name="Message as teacher").fill("Try a common denominator.")
    tile.get_by_role("button", name="Send as teacher").click()
    note = messages(student).get_by_role("article", name="tess", exact=True)
    expect(note).to_contain_text("Try a common denominator.")
    assert "teacher-note" in (note.get_attribute("class") or "")
    expect(tile).to_contain_text("Try a common denominator.")

    # Pause: the student's next message is kept, with the paused notice and no reply.
    teacher.get_by_role("button", name="Pause AI").click()
    expect(teacher.get_by_role("button", name="Resume AI")).to_be_visible()
    expect(messages(student)).to_contain_text("Your teacher has paused the AI for the class.")
    composer(student).fill("Is 5/6 right?")
    composer(student).press("Enter")
    expect(messages(student)).to_contain_text("Your message is kept and will be answered")
    student.wait_for_timeout(500)
    ada = messages(student).get_by_role("article", name="Ada", exact=True)
    expect(ada).to_have_count(1)

    # Resume: the kept message is answered.
    teacher.get_by_role("button", name="Resume AI").click()
    expect(teacher.get_by_role("button", name="Pause AI")).to_be_visible()
    expect(ada).to_have_count(2)

    # A flagged word shows a flag on the tile, at once.
    composer(student).fill("Can I use a calculator?")
    composer(student).press("Enter")
    expect(tile.get_by_role("list", name="Flags")).to_contain_text("your word “calculator”")
    expect(tile.get_by_role("status")).to_contain_text("flag")

    # Move class: the scene marker reaches the student and the tile.
    teacher.get_by_role("combobox", name="Scene").select_option(label="2. Subtracting")
    teacher.get_by_role("button", name="Move class").click()
    expect(messages(student)).to_contain_text("Scene 2: Subtracting")
    expect(tile).to_contain_text("Scene 2: Subtracting")

    # The student sees who viewed the chat.
    student.reload()
    student.get_by_text("Who viewed this chat").click()
    expect(student.get_by_role("list", name="Who viewed this chat")).to_contain_text("tess · wall")
