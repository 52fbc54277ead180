"""§5 of issue 14: renaming works after the title was updated live over the socket.

The title pushed over the socket is rendered without a request, so its form has no
CSRF token; the page's htmx requests carry the token from ``<body hx-headers>``.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat.models import ChatSession
from tests.browser.test_browser_chat import new_chat, send, wait_replies
from tests.browser.test_browser_chat import serve as serve  # noqa: F401 - the live server fixture
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_rename_after_a_live_title_update(page, serve, alice):
    base = serve(token_delay=0.001)
    login(page, base, "alice")
    chat_id = new_chat(page, base)
    send(page, "A first message that names the chat")
    wait_replies(page, 1)
    # The title came over the socket: this form is the pushed one, with no token of its own.
    expect(page.locator("#chat-title")).to_have_text("A first message that names the chat")
    assert page.locator("#chat-title-box input[name=csrfmiddlewaretoken]").count() == 0

    page.locator("#chat-title-box summary").click()
    page.locator("#rename-input").fill("Renamed after the live update")
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#chat-title")).to_have_text("Renamed after the live update")
    assert ChatSession.objects.get(pk=chat_id).title == "Renamed after the live update"
