"""Several speakers in one run, in Chromium: each speaker's bubble grows live, labelled,
and survives a reload mid-stream (the demo model's "panel" trigger, README)."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from chat.catalog import PANEL_PERSONAS, ensure_panel_agent
from chat.models import ChatEvent
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT_MS = 20_000
CHAT_URL = re.compile(r".*/chat/(?P<id>[0-9a-f-]{36})/$")


@pytest.fixture
def serve(request, settings, tmp_path, agent):
    def start(*, token_delay: float) -> str:
        settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.LYCEUM_DEMO_TOKEN_DELAY = token_delay
        settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.1
        settings.LYCEUM_CHECKPOINT_INTERVAL = 0.1
        return request.getfixturevalue("live_server_url")

    return start


def start_panel_chat(page: Page, base: str) -> str:
    page.goto(f"{base}/")
    token = page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
    made = page.request.post(
        f"{base}/chats/new/",
        form={"csrfmiddlewaretoken": token, "agent": "panel", "model": "demo"},
        headers={"Referer": f"{base}/"},
    )
    page.goto(made.url)
    page.wait_for_url(CHAT_URL)
    page.locator("body[data-ws=open]").wait_for(timeout=WAIT_MS)
    match = CHAT_URL.match(page.url)
    assert match, page.url
    return match["id"]


def streaming_bubble(page: Page, name: str):
    return page.locator("#stream").get_by_role("article", name=name)


def bubble_text(page: Page, name: str) -> str:
    texts = streaming_bubble(page, name).locator(".bubble").all_inner_texts()
    return texts[0].strip() if texts else ""


def wait_for_both_speaking(page: Page) -> tuple[str, str]:
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        first, second = (bubble_text(page, name) for name in PANEL_PERSONAS)
        if first and len(second) > 10:
            return first, second
        page.wait_for_timeout(30)
    raise AssertionError("the two speakers never streamed")


def test_two_labelled_speakers_stream_live_and_survive_a_reload(page, serve, alice):
    ensure_panel_agent()
    base = serve(token_delay=0.15)  # Basil speaks for 3 s: long enough for a reload mid-reply
    login(page, base, "alice")
    chat_id = start_panel_chat(page, base)
    page.get_by_role("textbox", name="Message").fill("panel: why is the sky blue?")
    page.get_by_role("textbox", name="Message").press("Enter")

    # Both bubbles grow live, each labelled with its speaker; no tags reach the page.
    ada, basil = wait_for_both_speaking(page)
    assert ada.startswith("Ada here.") and "<" not in ada
    assert "Basil" in basil or basil.startswith("As Basil")
    grown = bubble_text(page, "Basil")
    page.wait_for_timeout(300)
    assert len(bubble_text(page, "Basil")) > len(grown), "Basil's bubble stopped growing"

    # A reload mid-stream shows each speaker's text so far at once, then goes on.
    page.reload()
    page.locator("body[data-ws=open]").wait_for(timeout=WAIT_MS)
    assert bubble_text(page, "Ada").startswith("Ada here.")
    assert bubble_text(page, "Basil")

    # Written as two labelled messages; the stream slot is empty again.
    region = page.get_by_role("region", name="Messages")
    expect(region.locator(".msg.usage")).to_have_count(1, timeout=WAIT_MS)
    for name in PANEL_PERSONAS:
        written = region.get_by_role("article", name=name)
        expect(written).to_have_count(1)
        expect(written.locator(".bubble")).to_contain_text(name)
    expect(page.locator("#stream .bubble")).to_have_count(0)

    # The log holds clean text in display and the labelled write in context.
    display = [
        e.payload
        for e in ChatEvent.objects.filter(chat_id=chat_id, channel="display", kind="msg")
        if e.payload.get("role") == "assistant"
    ]
    assert [m["sender_name"] for m in display] == PANEL_PERSONAS
    assert all("<" not in m["content"] for m in display)
    context = [
        e.payload
        for e in ChatEvent.objects.filter(chat_id=chat_id, channel="session", kind="msg")
        if e.payload.get("role") == "assistant"
    ]
    assert [m["content"][:5] for m in context] == ["<Ada>", "<Basi"]
