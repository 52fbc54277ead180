"""Fixtures for the everyday-chat tests (issue 15): a live server started after its
settings, and the helpers a user's actions are written with."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import Page, expect

WAIT_MS = 20_000
CHAT_URL = re.compile(r".*/chat/(?P<id>[0-9a-f-]{36})/(\?.*)?(#.*)?$")


@pytest.fixture
def serve(request, settings, tmp_path, agent) -> Callable[..., str]:
    """Start the live server after the settings it must see are set (it forks)."""

    def start(*, token_delay: float = 0.01, **overrides) -> str:
        settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.LYCEUM_DEMO_TOKEN_DELAY = token_delay
        settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.1
        settings.LYCEUM_CHECKPOINT_INTERVAL = 0.2
        for name, value in overrides.items():
            setattr(settings, name, value)
        return request.getfixturevalue("live_server_url")

    return start


def messages(page: Page):
    return page.get_by_role("region", name="Messages")


def composer(page: Page):
    return page.get_by_role("textbox", name="Message")


def wait_socket_open(page: Page) -> None:
    page.locator("body[data-ws=open]").wait_for(timeout=WAIT_MS)


def open_new_chat(page: Page, base: str) -> str:
    """A chat made in the database for the logged-in page's user, opened; returns its id."""
    page.goto(f"{base}/")
    token = page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
    made = page.request.post(
        f"{base}/chats/new/",
        form={"csrfmiddlewaretoken": token, "model": "demo"},
        headers={"Referer": f"{base}/"},
    )
    page.goto(made.url)
    page.wait_for_url(CHAT_URL)
    wait_socket_open(page)
    match = CHAT_URL.match(page.url)
    assert match, page.url
    return match["id"]


def send(page: Page, text: str) -> None:
    users = messages(page).locator(".msg.user")
    before = users.count()
    composer(page).fill(text)
    composer(page).press("Enter")
    expect(users).to_have_count(before + 1, timeout=WAIT_MS)


def wait_replies(page: Page, count: int, timeout: int = WAIT_MS) -> None:
    expect(messages(page).locator(".msg.usage")).to_have_count(count, timeout=timeout)
