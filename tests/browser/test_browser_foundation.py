"""In Chromium: log in through the real form, see the chat list, open a sample chat."""

from __future__ import annotations

import pytest

from chat.management.commands.load_sample_chat import load_sample_chat
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_login_list_and_sample_chat(page, live_server_url, alice, bob):
    chat = load_sample_chat(alice)
    load_sample_chat(bob)

    page.goto(f"{live_server_url}/")
    assert "/login/" in page.url  # every page but login needs a login

    login(page, live_server_url, "alice")
    chats = page.get_by_role("list", name="Chats")
    assert chats.get_by_role("link").count() == 1  # Bob's sample is not listed
    chats.get_by_role("link", name="Sample: a tour of the message types").click()
    page.wait_for_url(f"**/chat/{chat.pk}/")

    messages = page.get_by_role("region", name="Messages")
    assert messages.locator(".msg.system").inner_text().startswith("This is a sample chat")
    assert "12 × 7" in messages.locator(".msg.user").inner_text()
    assert messages.locator(".tool-card .tool-name").all_inner_texts() == ["calculator", "delegate"]
    assert messages.locator(".msg.tool-result").count() == 2
    sub_agent = messages.locator(".msg.labelled")
    assert sub_agent.locator(".msg-label").inner_text() == "SubAgent@checker"
    assert "<SubAgent" not in sub_agent.inner_text()

    # Reasoning is folded until opened.
    thinking = messages.locator(".msg.assistant details.reasoning").last
    assert not thinking.locator(".reasoning-text").is_visible()
    thinking.locator("summary").click()
    assert thinking.locator(".reasoning-text").is_visible()

    final = messages.locator(".msg.assistant").last
    assert final.locator("strong").first.inner_text() == "12 × 7 = 84."
    assert final.locator("pre.highlight").count() == 1
    assert final.locator("table td").all_inner_texts() == ["12", "7", "84"]
    page.screenshot(path="/tmp/lyceum-sample-chat.png", full_page=True)


def test_other_users_chat_is_not_found_in_the_browser(page, live_server_url, alice, bob):
    bobs = load_sample_chat(bob)
    login(page, live_server_url, "alice")
    response = page.goto(f"{live_server_url}/chat/{bobs.pk}/")
    assert response.status == 404
