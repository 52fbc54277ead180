"""§2 Edits and regenerations as branches, in Chromium (issue 15): a new version in place,
the switcher "‹ 2/2 ›", an edit of an earlier message on a new branch, a reload and a
second tab showing the same path."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.conftest import login
from tests.everyday.conftest import WAIT_MS, messages, open_new_chat, send, wait_socket_open

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def users(page):
    return messages(page).locator(".msg.user")


def replies(page):
    return messages(page).locator(".msg.assistant")


def finished(page, count: int) -> None:
    expect(messages(page).locator(".msg.usage")).to_have_count(count, timeout=WAIT_MS)


def test_versions_and_branches_on_the_page(browser, serve, alice):
    base = serve()
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    login(page, base, "alice")
    chat_id = open_new_chat(page, base)
    send(page, "hello first")
    finished(page, 1)
    first_reply = replies(page).last.get_attribute("data-seq")

    other = context.new_page()  # a second tab of the same chat follows every change
    other.goto(f"{base}/chat/{chat_id}/")
    wait_socket_open(other)

    # Regenerate that reply: a second version in its place, not a copy underneath.
    replies(page).last.get_by_role("button", name="Regenerate").click()
    expect(replies(page).last.locator(".version-count")).to_have_text("2/2")
    finished(page, 1)
    expect(replies(page)).to_have_count(1)
    assert replies(page).last.get_attribute("data-seq") != first_reply
    expect(replies(other).last.locator(".version-count")).to_have_text("2/2")

    # Back to the first version.
    replies(page).last.get_by_role("button", name="Previous version").click()
    expect(replies(page).last.locator(".version-count")).to_have_text("1/2")
    expect(replies(page).last).to_have_attribute("data-seq", first_reply)
    expect(replies(page).last.get_by_role("button", name="Previous version")).to_be_disabled()
    expect(replies(other).last).to_have_attribute("data-seq", first_reply)

    # Go on, then edit the first message: the chat continues from there on a new branch.
    send(page, "hello second")
    finished(page, 2)
    mine = users(page).first
    mine.get_by_text("Edit", exact=True).click()
    mine.get_by_role("textbox", name="Edited message").fill("hello edited")
    mine.get_by_role("button", name="Save and send").click()
    expect(users(page)).to_have_count(1)
    expect(users(page).first.locator(".bubble")).to_have_text("hello edited")
    expect(users(page).first.locator(".version-count")).to_have_text("2/2")
    finished(page, 1)
    expect(replies(page).last).to_contain_text("hello edited")
    expect(messages(page)).not_to_contain_text("hello second")

    # Reload: the same path. The other tab shows it too.
    page.reload()
    wait_socket_open(page)
    expect(users(page)).to_have_count(1)
    expect(users(page).first.locator(".bubble")).to_have_text("hello edited")
    expect(users(page).first.locator(".version-count")).to_have_text("2/2")
    expect(users(other)).to_have_count(1)
    expect(users(other).first.locator(".bubble")).to_have_text("hello edited")

    # The first version is one click away, with what followed it.
    users(page).first.get_by_role("button", name="Previous version").click()
    expect(users(page)).to_have_count(2)
    expect(users(page).first.locator(".bubble")).to_have_text("hello first")
    expect(users(page).last.locator(".bubble")).to_have_text("hello second")
    expect(replies(page).first.locator(".version-count")).to_have_text("1/2")
    expect(users(other)).to_have_count(2)
    context.close()
