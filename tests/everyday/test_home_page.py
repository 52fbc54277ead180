"""§4 in Chromium (issue 15): the home page starts a chat with its first message; the
chat opens with the composer focused; the model titles it after the first reply."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat.models import ChatSession
from tests.conftest import login
from tests.everyday.conftest import CHAT_URL, composer, messages, wait_replies, wait_socket_open

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_home_starts_a_chat_and_the_model_titles_it(page, serve, alice):
    base = serve()
    login(page, base, "alice")
    page.goto(f"{base}/")
    start = page.get_by_role("textbox", name="Start a chat")
    expect(start).to_be_focused()
    assert not ChatSession.objects.filter(owner=alice).exists()
    page.get_by_label("Model", exact=True).select_option("demo-fast")
    start.fill("hello there, owls")
    start.press("Enter")
    page.wait_for_url(CHAT_URL)
    wait_socket_open(page)
    expect(composer(page)).to_be_focused()
    expect(messages(page).locator(".msg.user .bubble")).to_have_text("hello there, owls")
    wait_replies(page, 1)
    expect(page.locator("#chat-title")).to_have_text("Hello there owls")
    expect(page.locator("#sidebar").get_by_role("link", name="Hello there owls")).to_be_visible()
    chat = ChatSession.objects.get(owner=alice)
    assert chat.model == "demo-fast" and chat.title == "Hello there owls"
