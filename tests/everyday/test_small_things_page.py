"""§6 The small things, in Chromium (issue 15): Compact now on an empty chat, code
languages, copy per message, Esc in a field, Jump to latest, the API key page, the theme."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat.models import ApiKey
from tests.conftest import login
from tests.everyday.conftest import (
    WAIT_MS,
    composer,
    messages,
    open_new_chat,
    send,
    wait_replies,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def clip_page(browser):
    context = browser.new_context(
        permissions=["clipboard-read", "clipboard-write"], viewport={"width": 1100, "height": 700}
    )
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    yield page
    context.close()


def background(page) -> str:
    return page.evaluate("() => getComputedStyle(document.body).backgroundColor")


def test_chat_page_small_things(clip_page, serve, alice):
    page = clip_page
    base = serve(token_delay=0.015)
    login(page, base, "alice")
    open_new_chat(page, base)
    expect(composer(page)).to_be_focused()  # a chat opens with the composer focused

    page.get_by_role("button", name="Compact now").click()
    expect(page.locator("#notice")).to_have_text(
        "There is nothing to compact yet: the chat is empty."
    )

    send(page, "code")
    wait_replies(page, 1)
    reply = messages(page).locator(".msg.assistant").last
    expect(reply.locator(".code-lang")).to_have_text(["python", "bash"])

    # A copy button on each message.
    reply.get_by_role("button", name="Copy message").click()
    expect(reply.get_by_role("button", name="Copy message")).to_have_text("Copied")
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert copied.startswith("Here is a small example for")
    mine = messages(page).locator(".msg.user").last
    mine.get_by_role("button", name="Copy message").click()
    expect(mine.get_by_role("button", name="Copy message")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == "code"

    # Esc inside a text field cancels that field, not the run.
    send(page, "long")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    page.get_by_text("Rename", exact=True).click()
    field = page.get_by_role("textbox", name="New title")
    field.fill("half-typed title")
    field.press("Escape")
    expect(field).to_be_hidden()
    expect(page.locator("#chat-title")).to_have_text("code")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()  # still running

    # Scrolled up while it writes: "Jump to latest" brings the newest back.
    jump = page.get_by_role("button", name="Jump to latest")
    page.locator("#scroller").evaluate("s => { s.scrollTop = 0; }")
    expect(jump).to_be_visible()
    jump.click()
    expect(jump).to_be_hidden()
    wait_replies(page, 2, timeout=40_000)
    at_bottom = "s => s.scrollHeight - s.scrollTop - s.clientHeight < 130"
    assert page.locator("#scroller").evaluate(at_bottom)

    # Sending scrolls down, even from far up.
    page.locator("#scroller").evaluate("s => { s.scrollTop = 0; }")
    expect(jump).to_be_visible()
    composer(page).fill("hello again")
    composer(page).press("Enter")
    wait_replies(page, 3)
    assert page.locator("#scroller").evaluate(at_bottom)


def test_api_key_copy_button_and_a_refresh_makes_no_second_key(clip_page, serve, alice):
    page = clip_page
    base = serve()
    login(page, base, "alice")
    page.goto(f"{base}/settings/api-keys/")
    page.get_by_label("Name").fill("notebook")
    page.get_by_role("button", name="Create key").click()
    value = page.get_by_label("New API key").input_value()
    assert value.startswith("lyk_") or len(value) > 20
    page.get_by_role("button", name="Copy the new key").click()
    expect(page.get_by_role("button", name="Copy the new key")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == value
    page.reload()
    expect(page.get_by_label("New API key")).to_have_count(0)
    assert ApiKey.objects.filter(user=alice).count() == 1


def test_dark_theme_follows_the_system_and_the_toggle_sticks(browser, serve, alice):
    base = serve()
    context = browser.new_context(color_scheme="dark")
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    try:
        login(page, base, "alice")
        dark = background(page)
        toggle = page.get_by_role("button", name="Dark theme")
        expect(toggle).to_have_attribute("aria-pressed", "true")
        toggle.click()
        expect(toggle).to_have_attribute("aria-pressed", "false")
        light = background(page)
        assert light != dark
        page.reload()
        expect(toggle).to_have_attribute("aria-pressed", "false")
        assert background(page) == light
        toggle.click()
        assert background(page) == dark
    finally:
        context.close()

    context = browser.new_context(color_scheme="light")
    page = context.new_page()
    try:
        login(page, base, "alice")
        expect(page.get_by_role("button", name="Dark theme")).to_have_attribute(
            "aria-pressed", "false"
        )
        assert background(page) == light
    finally:
        context.close()
