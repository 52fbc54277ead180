"""Where the parts of the chat page and the class chat page sit, in Chromium.

On a desktop the chat page is three columns (the chat list, the messages, the
artifacts beside them) and the class chat two (the messages, the lesson's scene
beside them): a phone rule once dropped the artifacts' column, which put the panel
under the chat list, and the class chat had its messages in the chat list's narrow
column. On a phone the class chat shows the scene above the messages. An artifact's
page keeps its versions beside a source with long lines, which scrolls in its own box.
The usage chart spans its box: today's bar ends at its right edge.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat import artifacts, store
from chat.models import Artifact, UsageRecord
from classroom import actions
from tests.browser.test_browser_chat import WAIT_MS, messages, serve  # noqa: F401
from tests.conftest import login
from tests.everyday.test_phone import PHONE, assert_fits

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DESKTOP = {"width": 1280, "height": 800}


def box(locator) -> dict:
    expect(locator).to_be_visible(timeout=WAIT_MS)
    found = locator.bounding_box()
    assert found is not None
    return found


def page_at(browser, viewport: dict):
    context = browser.new_context(viewport=viewport)
    context.set_default_timeout(WAIT_MS)
    return context.new_page()


def test_the_chat_page_has_the_list_the_messages_and_the_artifacts_side_by_side(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    alice,
):
    chat = store.create_chat(alice, title="Layout")
    base = serve()
    page = page_at(browser, DESKTOP)
    login(page, base, "alice")
    page.goto(f"{base}/chat/{chat.pk}/")
    chats = box(page.get_by_role("navigation", name="Your chats"))
    talk = box(messages(page))
    artifacts = box(page.get_by_role("region", name="Artifacts"))
    assert chats["x"] + chats["width"] <= talk["x"] + 1
    assert talk["x"] + talk["width"] <= artifacts["x"] + 1
    assert artifacts["x"] + artifacts["width"] <= DESKTOP["width"] + 1
    assert artifacts["y"] < talk["y"] + talk["height"]  # beside the messages, not under them
    assert talk["width"] >= DESKTOP["width"] / 2
    expect(page.locator("#run-status")).to_have_text("")


def test_the_class_chat_has_the_messages_and_the_scene_side_by_side(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    make_user,
):
    tess = make_user("tess", teacher=True)
    sam = make_user("sam")
    room = actions.create_classroom(tess, title="Fractions", model="demo-fast")
    actions.save_scene(tess, room.pk, title="Adding fractions", content="# Common denominators")
    actions.join_classroom(sam, room.join_code)
    base = serve()

    page = page_at(browser, DESKTOP)
    login(page, base, "sam")
    page.goto(f"{base}/classes/{room.pk}/chat/")
    talk = box(messages(page))
    scene = box(page.get_by_role("region", name="Scene"))
    assert talk["x"] + talk["width"] <= scene["x"] + 1
    assert scene["y"] < talk["y"] + talk["height"]
    assert talk["width"] > 2 * scene["width"]
    assert box(page.get_by_role("textbox", name="Message"))["width"] >= 300
    expect(page.locator("#run-status")).to_have_text("")

    phone = page_at(browser, PHONE)
    login(phone, base, "sam")
    phone.goto(f"{base}/classes/{room.pk}/chat/")
    scene = phone.get_by_role("region", name="Scene")
    expect(scene.get_by_role("heading", name="Common denominators")).to_be_visible()
    assert box(scene)["y"] < box(messages(phone))["y"]
    assert_fits(phone, "class chat")


def test_an_artifact_with_long_lines_keeps_the_page_to_the_screens_width(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    alice,
):
    chat = store.create_chat(alice, title="Files")
    line = "x = [" + ", ".join(str(n) for n in range(400)) + "]\n"
    artifacts.save_version(chat.pk, "wide.py", line.encode() * 3, source="file", card=False)
    artifact = Artifact.objects.get(chat=chat)
    base = serve()
    page = page_at(browser, DESKTOP)
    login(page, base, "alice")
    page.goto(f"{base}/artifacts/{artifact.pk}/")
    versions = box(page.get_by_role("navigation", name="Versions"))
    assert versions["x"] + versions["width"] <= DESKTOP["width"] + 1
    assert page.evaluate("document.documentElement.scrollWidth") <= DESKTOP["width"]
    content = box(page.get_by_role("region", name="Content"))
    assert content["x"] + content["width"] <= versions["x"] + 1


def test_the_usage_charts_bar_of_today_ends_at_the_charts_right_edge(
    serve,  # noqa: F811 - the fixture of test_browser_chat
    browser,
    alice,
):
    UsageRecord.objects.create(
        user=alice, model="demo", status="ok", prompt_tokens=100, completion_tokens=50
    )
    base = serve()
    page = page_at(browser, DESKTOP)
    login(page, base, "alice")
    page.goto(f"{base}/usage/")
    chart = box(page.get_by_role("img", name="Tokens per day, highest 150"))
    today = box(page.locator(".usage-chart rect").last)
    assert today["height"] > 50  # the day's tokens are the highest: a full bar
    assert chart["x"] + chart["width"] - (today["x"] + today["width"]) < chart["width"] / 30
