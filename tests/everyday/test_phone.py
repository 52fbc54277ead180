"""§1 Phones: at 390 × 844 nothing is wider than the screen and the controls that matter
are on it and clickable (issue 15)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

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

PHONE = {"width": 390, "height": 844}

# Every element that reaches past the screen's edges, unless a box that scrolls (or
# clips) sideways holds it and that box itself fits: wide code scrolls in its own box.
OVERFLOWING = """() => {
  const width = document.documentElement.clientWidth;
  const scrolls = (el) => ['auto', 'scroll', 'hidden', 'clip'].includes(getComputedStyle(el).overflowX);
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.right <= 0) continue;  // parked off-screen on purpose (skip link, closed drawer)
    if (r.right <= width + 1 && r.left >= -1) continue;
    let held = false;
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (scrolls(a)) { const ar = a.getBoundingClientRect(); if (ar.right <= width + 1 && ar.left >= -1) { held = true; break; } }
    }
    if (!held) out.push(`${el.tagName.toLowerCase()}#${el.id}.${[...el.classList].join('.')} ${Math.round(r.left)}..${Math.round(r.right)}`);
  }
  return {scrollWidth: document.documentElement.scrollWidth, width, out: out.slice(0, 10)};
}"""


def assert_fits(page: Page, where: str) -> None:
    found = page.evaluate(OVERFLOWING)
    assert found["scrollWidth"] <= found["width"], f"{where}: page is {found}"
    assert not found["out"], f"{where}: wider than the screen: {found['out']}"


def assert_usable(page: Page, button) -> None:
    """Visible, inside the screen, and the topmost thing where a finger lands."""
    expect(button).to_be_visible(timeout=WAIT_MS)
    button.scroll_into_view_if_needed()
    box = button.bounding_box()
    assert box is not None
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 1, box
    button.click(trial=True)


def test_phone_home_and_a_busy_chat_fit_the_screen(browser, serve, alice):
    base = serve(token_delay=0.02)
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    try:
        login(page, base, "alice")
        page.goto(f"{base}/")
        assert_fits(page, "home")
        open_new_chat(page, base)
        assert_fits(page, "empty chat")
        # The message box keeps its width next to Regenerate and Compact now.
        assert composer(page).bounding_box()["width"] >= 200
        assert_usable(page, page.get_by_role("button", name="Send"))

        # The chat list slides out from a chat and back.
        page.get_by_role("button", name="Chats").click()
        expect(page.get_by_role("navigation", name="Your chats")).to_be_in_viewport(ratio=1)
        assert_fits(page, "chat list open")
        page.get_by_role("button", name="Close the chat list").click()
        expect(page.get_by_role("navigation", name="Your chats")).not_to_be_in_viewport()

        send(page, "code")
        wait_replies(page, 1)
        send(page, "markdown")
        wait_replies(page, 2)
        expect(messages(page).locator("table")).to_have_count(1)
        assert_fits(page, "code and table")

        send(page, "write file notes.md")
        card = messages(page).locator(".tool-card").last
        assert_usable(page, card.get_by_role("button", name="Approve"))
        assert_usable(page, card.get_by_role("button", name="Deny"))
        assert_fits(page, "approval card")
        card.get_by_role("button", name="Approve").click()
        wait_replies(page, 3)

        composer(page).fill("long")
        composer(page).press("Enter")
        stop = page.get_by_role("button", name="Stop")
        assert_usable(page, stop)
        assert_fits(page, "long reply streaming")
        wait_replies(page, 4)
        assert_fits(page, "long reply")
        assert_usable(page, page.get_by_role("button", name="Send"))
        assert composer(page).bounding_box()["width"] >= 200
        page.screenshot(path="/tmp/lyceum-phone-chat.png")
    finally:
        context.close()
