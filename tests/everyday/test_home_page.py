"""§4 in Chromium (issue 15): the home page starts a chat with its first message; the
chat opens with the composer focused; the model titles it after the first reply."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat.models import ChatSession
from tests.conftest import login
from tests.everyday.conftest import CHAT_URL, composer, messages, wait_replies, wait_socket_open

# Long enough that the provisional title (its first 50 characters) is cut mid-word;
# the demo model titles a chat with the first six words of its first message.
ASKED = "please tell me everything about the owls of the northern forests"
TITLE = "please tell me everything about the"

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_home_starts_a_chat_and_the_model_titles_it(page, serve, alice):
    base = serve(LYCEUM_GENERATE_TITLES=True)
    login(page, base, "alice")
    page.goto(f"{base}/")
    start = page.get_by_role("textbox", name="Start a chat")
    expect(start).to_be_focused()
    assert not ChatSession.objects.filter(owner=alice).exists()
    page.get_by_label("Model", exact=True).select_option("demo-fast")
    start.fill(ASKED)
    start.press("Enter")
    page.wait_for_url(CHAT_URL)
    wait_socket_open(page)
    expect(composer(page)).to_be_focused()
    expect(messages(page).locator(".msg.user .bubble")).to_have_text(ASKED)
    wait_replies(page, 1)
    expect(page.locator("#chat-title")).to_have_text(TITLE)
    expect(page.locator("#sidebar").get_by_role("link", name=TITLE)).to_be_visible()
    chat = ChatSession.objects.get(owner=alice)
    assert chat.model == "demo-fast" and chat.title == TITLE
