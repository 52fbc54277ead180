"""§4 in Chromium (issue 15): search finds a word inside a message and jumps to it; the
chat menu in the list pins a chat to the top."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat import actions, store
from chat.core.messages import assistant, user
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_search_jumps_to_the_message_and_the_menu_pins(page, serve, alice):
    base = serve()
    old = actions.new_chat(alice, title="Amphibians")
    store.append_display_messages(old.pk, [user(f"filler {i}") for i in range(70)])
    store.append_display_messages(old.pk, [assistant("The axolotl regrows its limbs.")])
    store.append_display_messages(old.pk, [user(f"later {i}") for i in range(60)])
    other = actions.new_chat(alice, title="Newest chat")
    store.append_display_messages(other.pk, [user("hello")])

    login(page, base, "alice")
    page.goto(f"{base}/chat/{other.pk}/")
    page.get_by_role("searchbox", name="Search chats").fill("axolo")
    hit = page.locator("#chat-list .search-hit a")
    expect(hit).to_have_count(1)
    expect(hit.locator("mark")).to_have_text("axolotl")
    hit.click()
    target = page.locator("#ev-71")
    expect(target).to_be_in_viewport()
    expect(target).to_have_class("msg assistant target")

    # The chat menu: pin the older chat, and it comes first.
    page.goto(f"{base}/")
    links = page.get_by_role("list", name="Chats").get_by_role("link")
    expect(links.first).to_have_text("Newest chat")
    page.get_by_label("Menu of Amphibians").click()
    page.get_by_role("button", name="Pin", exact=True).click()
    expect(links.first).to_have_text("Amphibians")
    page.get_by_label("Menu of Amphibians").click()
    expect(page.get_by_role("button", name="Unpin")).to_be_visible()
