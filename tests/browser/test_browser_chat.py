"""The live chat in Chromium against a forked Daphne: what a user sees while chatting.

Everything is driven as a user would: typing in the "Message" box, Enter or Send,
buttons by their accessible names. The offline demo model answers unless a test says
otherwise. Settings reach the server only when set before it forks, so every test
starts it through ``serve(...)`` after choosing them.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, WebSocketRoute, expect

from chat import store
from chat.core.messages import assistant, user
from chat.models import Artifact, ChatSession, Provider, ProviderModel, Run
from chat.presentation import display
from tests.conftest import login
from tests.fakeopenai import Script

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT_MS = 20_000  # a generous ceiling for anything to show up; nothing waits this long
CHAT_URL = re.compile(r".*/chat/(?P<id>[0-9a-f-]{36})/$")
USAGE = re.compile(r"^\d+ in · \d+ out tokens$")
FAKE_REPLY = "Greetings from the fake model: zebra-42 checking in."


# --- fixtures -------------------------------------------------------------------------------


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


@pytest.fixture
def fake_model(fake_openai):
    """A whitelisted model served by the fake OpenAI server, always answering FAKE_REPLY."""
    fake_openai.respond_with(lambda _request: Script(text=FAKE_REPLY, reasoning="Fake thoughts."))
    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=fake_openai.base_url, api_key="sk-test-secret"
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
    )
    return fake_openai


# --- helpers: what a user does and sees --------------------------------------------------------


def messages(page: Page):
    return page.get_by_role("region", name="Messages")


def composer(page: Page):
    return page.get_by_role("textbox", name="Message")


def wait_socket_open(page: Page) -> None:
    page.locator("body[data-ws=open]").wait_for(timeout=WAIT_MS)


def new_chat(page: Page, base: str, model: str = "demo") -> str:
    """From the chat list, start a chat with ``model``; returns its id."""
    page.goto(f"{base}/")
    token = page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
    made = page.request.post(
        f"{base}/chats/new/",
        form={"csrfmiddlewaretoken": token, "model": model},
        headers={"Referer": f"{base}/"},
    )
    page.goto(made.url)
    page.wait_for_url(CHAT_URL)
    wait_socket_open(page)
    return CHAT_URL.match(page.url)["id"]


def send(page: Page, text: str, *, click: bool = False) -> None:
    """Type a message and send it; returns once the page shows it."""
    users = messages(page).locator(".msg.user")
    before = users.count()
    box = composer(page)
    box.fill(text)
    if click:
        page.get_by_role("button", name="Send").click()
    else:
        box.press("Enter")
    expect(users).to_have_count(before + 1, timeout=WAIT_MS)
    expect(users.last.locator(".bubble")).to_have_text(text)


def wait_replies(page: Page, count: int) -> None:
    """Wait until ``count`` runs have completed (each shows a usage line)."""
    expect(messages(page).locator(".msg.usage")).to_have_count(count, timeout=WAIT_MS)


def replies(page: Page):
    return messages(page).locator(".msg.assistant")


def stream_text(page: Page) -> str:
    """The text of the reply being written ("" when none); never waits."""
    texts = page.locator("#stream .bubble").all_inner_texts()
    return texts[0].strip() if texts else ""


def wait_stream_longer_than(page: Page, chars: int) -> str:
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        text = stream_text(page)
        if len(text) > chars:
            return text
        page.wait_for_timeout(50)
    raise AssertionError(f"the streaming reply never passed {chars} characters")


def page_items(page: Page) -> list[tuple[int, str]]:
    """(data-seq, text) of every item in the message list, in page order."""
    return [
        (int(seq), text)
        for seq, text in messages(page)
        .locator(":scope > [data-seq]")
        .evaluate_all("els => els.map(e => [e.dataset.seq, e.innerText.trim()])")
    ]


def db_item_seqs(chat_id: str) -> list[int]:
    """Seqs of the display events that are items on the page, from the database."""
    return [e.seq for e in store.display_events_after(chat_id, 0) if display.item_from_event(e)]


def gauge_tokens(page: Page) -> int:
    text = page.locator("#context-gauge .gauge-text").inner_text()
    match = re.fullmatch(r"(\d+) / 32000 tokens", text.strip())
    assert match, f"unexpected gauge text {text!r}"
    return int(match[1])


# --- 1, 2: streaming and thinking -----------------------------------------------------------


def test_reply_streams_visibly_then_shows_usage(page, serve, alice):
    base = serve(token_delay=0.04)
    login(page, base, "alice")
    new_chat(page, base)
    send(page, "hello there")
    expect(composer(page)).to_have_value("")

    seen: list[str] = []
    usage = messages(page).locator(".msg.usage")
    while usage.count() == 0:
        if text := stream_text(page):
            seen.append(text)
            if len(seen) == 3:
                page.screenshot(path="/tmp/lyceum-chat-streaming.png", full_page=True)
        page.wait_for_timeout(40)
    wait_replies(page, 1)

    final = replies(page).last.locator(".bubble").inner_text().strip()
    assert "you wrote “hello there”" in final
    partials = [s for s in seen if len(s) < len(final) and final.startswith(s)]
    assert partials, f"no partial text was seen before the reply was complete: {seen[:5]}"
    assert len(set(partials)) >= 2, "the streaming bubble did not grow"
    assert USAGE.match(usage.inner_text().strip())
    expect(page.locator("#stream")).to_have_class(re.compile(r"\bidle\b"))


def test_thinking_is_shown_and_collapsible(page, serve, alice):
    base = serve(token_delay=0.03)
    login(page, base, "alice")
    new_chat(page, base)
    send(page, "tell me something")
    live_thinking = page.locator("#stream details.reasoning .reasoning-text")
    expect(live_thinking).to_contain_text("No demo keyword matched", timeout=WAIT_MS)
    wait_replies(page, 1)

    thinking = replies(page).last.locator("details.reasoning")
    expect(thinking.locator(".reasoning-text")).to_be_hidden()
    thinking.get_by_text("Thinking").click()
    expect(thinking.locator(".reasoning-text")).to_be_visible()
    expect(thinking.locator(".reasoning-text")).to_contain_text("No demo keyword matched")
    thinking.get_by_text("Thinking").click()
    expect(thinking.locator(".reasoning-text")).to_be_hidden()


# --- 3: tool approval -----------------------------------------------------------------------


def test_tool_call_approved(page, serve, alice, tmp_path):
    base = serve()
    login(page, base, "alice")
    chat_id = new_chat(page, base)
    send(page, "write file notes.md")

    card = messages(page).locator(".tool-card").last
    expect(card.locator(".tool-name")).to_have_text("write_file", timeout=WAIT_MS)
    expect(card.locator(".tool-status")).to_have_text("waiting for approval")
    expect(page.locator("#run-status")).to_have_text("Waiting for your approval")
    # What is asked is shown in the prompt itself, not behind a fold.
    expect(card.locator(".approval-file")).to_be_visible()
    expect(card.locator(".approval-file-name")).to_have_text("File notes.md")
    page.screenshot(path="/tmp/lyceum-chat-approval-pending.png", full_page=True)

    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".tool-status")).to_have_text("done", timeout=WAIT_MS)
    expect(card.locator(".approval-decision")).to_have_text("Approved")
    wait_replies(page, 1)
    expect(replies(page).last).to_contain_text("I wrote notes.md")
    assert Artifact.objects.filter(chat_id=chat_id, path="notes.md").exists()  # the chat's files
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    page.screenshot(path="/tmp/lyceum-chat-approved.png", full_page=True)


def test_tool_call_denied_with_reason(page, serve, alice, tmp_path):
    base = serve()
    login(page, base, "alice")
    chat_id = new_chat(page, base)
    send(page, "write file notes.md")

    card = messages(page).locator(".tool-card").last
    expect(card.get_by_role("button", name="Deny")).to_be_visible(timeout=WAIT_MS)
    card.get_by_role("textbox", name="Reason (optional)").fill("not in my notes folder")
    card.get_by_role("button", name="Deny").click()

    expect(card.locator(".tool-status")).to_have_text("denied", timeout=WAIT_MS)
    expect(card.locator(".approval-decision")).to_have_text("Denied: “not in my notes folder”")
    wait_replies(page, 1)
    expect(replies(page).last).to_contain_text(
        "I did not write the file because you denied it: not in my notes folder."
    )
    assert not Artifact.objects.filter(chat_id=chat_id, path="notes.md").exists()


# --- 4, 5: stop and reload ------------------------------------------------------------------


def _assert_stopped_keeps(page: Page, seen: str, stopped_count: int) -> None:
    notes = messages(page).locator(".msg.system.stopped")
    expect(notes).to_have_count(stopped_count, timeout=WAIT_MS)
    expect(notes.last).to_contain_text("Stopped")
    kept = messages(page).locator(".msg.assistant.ended-cancelled")
    expect(kept).to_have_count(stopped_count)
    expect(kept.last.locator(".badge")).to_have_text("stopped")
    text = kept.last.locator(".bubble").inner_text().strip()
    assert text.startswith(seen[:60]) and len(text) >= 60
    expect(page.locator("#stream")).to_have_class(re.compile(r"\bidle\b"))
    page.wait_for_timeout(700)  # had the run gone on, the text would grow meanwhile
    assert kept.last.locator(".bubble").inner_text().strip() == text
    assert stream_text(page) == ""


def test_stop_keeps_the_partial_reply_and_escape_stops_too(page, serve, alice):
    base = serve(token_delay=0.03)
    login(page, base, "alice")
    new_chat(page, base)

    send(page, "long")
    seen = wait_stream_longer_than(page, 80)
    page.get_by_role("button", name="Stop").click()
    _assert_stopped_keeps(page, seen, 1)
    expect(page.locator("#run-controls").get_by_role("button", name="Regenerate")).to_be_visible()

    send(page, "long please")
    seen = wait_stream_longer_than(page, 80)
    page.keyboard.press("Escape")
    _assert_stopped_keeps(page, seen, 2)
    assert messages(page).locator(".msg.usage").count() == 0


def test_reload_mid_stream_reattaches_and_completes(page, serve, alice):
    base = serve(token_delay=0.006)
    login(page, base, "alice")
    new_chat(page, base)
    send(page, "long")
    wait_stream_longer_than(page, 150)

    page.reload()
    wait_socket_open(page)
    # What was written so far is there at once; then the reply goes on to the end.
    first = stream_text(page)
    assert first.startswith("You asked for something long"), first[:80]
    wait_replies(page, 1)
    expect(replies(page)).to_have_count(1)
    final = replies(page).first.locator(".bubble").inner_text()
    assert final.startswith("You asked for something long")
    assert "That is the end of the long answer." in final
    expect(messages(page).locator(".msg.user")).to_have_count(1)
    assert stream_text(page) == ""


# --- 6, 7: two tabs, dropped socket ---------------------------------------------------------


def test_two_tabs_show_the_same_messages_in_the_same_order(page, serve, alice):
    base = serve(token_delay=0.005)
    login(page, base, "alice")
    chat_id = new_chat(page, base)
    other = page.context.new_page()
    other.goto(page.url)
    wait_socket_open(other)

    send(page, "hello from the first tab")
    wait_replies(page, 1)
    wait_replies(other, 1)
    send(other, "calculate 12*7", click=True)
    wait_replies(page, 2)
    wait_replies(other, 2)
    send(page, "and hello again")
    wait_replies(page, 3)
    wait_replies(other, 3)

    first, second = page_items(page), page_items(other)
    assert first == second
    assert [seq for seq, _ in first] == db_item_seqs(chat_id)
    assert any("The result is 84." in text for _, text in first)
    other.close()


def test_dropped_socket_resyncs_without_gap_or_duplicate(page, serve, alice):
    base = serve(token_delay=0.06)
    routes: list[WebSocketRoute] = []
    held: list[WebSocketRoute] = []
    state = {"hold": False}

    def route_socket(ws: WebSocketRoute) -> None:
        # While "hold" is set the page's reconnect goes nowhere, like a dead network.
        if state["hold"]:
            held.append(ws)
            return
        routes.append(ws)
        ws.connect_to_server()

    page.route_web_socket(re.compile(r".*/ws/chat/.*"), route_socket)
    login(page, base, "alice")
    chat_id = new_chat(page, base)
    send(page, "calculate 12*7")
    expect(page.locator("#stream .reasoning-text")).not_to_be_empty(timeout=WAIT_MS)

    state["hold"] = True
    routes[-1].close(code=1012, reason="test drops the connection")
    # Meanwhile the run goes on: the tool call and its result are written...
    deadline = time.monotonic() + WAIT_MS / 1000
    while not any(e.payload.get("role") == "tool" for e in store.display_events_after(chat_id, 0)):
        assert time.monotonic() < deadline, "the run did not reach its tool result"
        time.sleep(0.05)
    assert Run.objects.get(chat_id=chat_id).status == Run.Status.RUNNING
    before = {seq for seq, _ in page_items(page)}
    missed = [seq for seq in db_item_seqs(chat_id) if seq not in before]
    assert missed, "nothing happened while the socket was down"

    # ...and the socket comes back while the final answer is still being written.
    state["hold"] = False
    assert held, "the page did not try to reconnect"
    held[-1].close(code=1012, reason="network back")
    wait_replies(page, 1)

    seqs = [seq for seq, _ in page_items(page)]
    assert seqs == sorted(set(seqs))
    assert seqs == db_item_seqs(chat_id)
    assert set(missed) <= set(seqs)
    finals = [text for _, text in page_items(page) if "The result is 84." in text]
    assert len(finals) == 1
    assert len(routes) == 2


# --- 8, 9: queue and model switch -----------------------------------------------------------


def test_message_sent_while_busy_is_queued_then_answered(page, serve, alice):
    base = serve(token_delay=0.03)
    login(page, base, "alice")
    new_chat(page, base)
    send(page, "first question")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    send(page, "second question")

    second = messages(page).locator(".msg.user").last
    expect(second.locator(".badge.queued")).to_have_text("queued")
    expect(second.locator(".badge.queued")).to_have_count(0, timeout=WAIT_MS)
    # The run answers the queued message too, before it ends (one usage line).
    expect(replies(page)).to_have_count(2, timeout=WAIT_MS)
    wait_replies(page, 1)
    texts = replies(page).all_inner_texts()
    assert len(texts) == 2
    assert "you wrote “first question”" in texts[0]
    assert "you wrote “second question”" in texts[1]


def test_model_switch_note_and_next_reply_from_new_model(page, serve, alice, fake_model):
    base = serve()
    login(page, base, "alice")
    new_chat(page, base, model="demo")
    send(page, "hello demo")
    wait_replies(page, 1)
    expect(replies(page).last).to_contain_text("offline demo model")

    page.get_by_label("Model", exact=True).select_option("fake-model")
    note = messages(page).get_by_role("note").filter(has_text="Model switched to")
    expect(note).to_have_text(re.compile(r"Model switched to fake-model\."))
    expect(page.get_by_label("Model", exact=True)).to_have_value("fake-model")

    send(page, "hello fake")
    wait_replies(page, 2)
    expect(replies(page).last.locator(".bubble")).to_have_text(FAKE_REPLY)
    assert len(fake_model.chat_requests()) == 1
    assert fake_model.chat_requests()[0].json["model"] == "gpt-fake"


# --- 10: rename, export, delete ---------------------------------------------------------------


def test_rename_survives_reload(page, serve, alice):
    base = serve()
    login(page, base, "alice")
    chat_id = new_chat(page, base)
    page.get_by_text("Rename", exact=True).click()
    page.get_by_role("textbox", name="New title").fill("Plans for the trip")
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("heading", name="Plans for the trip")).to_be_visible()
    page.reload()
    expect(page.get_by_role("heading", level=1)).to_have_text("Plans for the trip")
    assert ChatSession.objects.get(pk=chat_id).title == "Plans for the trip"


def test_export_markdown_and_json(page, serve, alice):
    base = serve()
    login(page, base, "alice")
    new_chat(page, base)
    send(page, "hello export")
    wait_replies(page, 1)
    reply = replies(page).last.locator(".bubble").inner_text().strip()

    page.get_by_text("More", exact=True).click()
    with page.expect_download() as markdown:
        page.get_by_role("link", name="Export as Markdown").click()
    assert markdown.value.suggested_filename == "hello-export.md"
    text = Path(markdown.value.path()).read_text(encoding="utf-8")
    assert text.startswith("# hello export\n")
    assert "## You\n\nhello export" in text
    assert reply[:40] in text

    with page.expect_download() as as_json:
        page.get_by_role("link", name="Export as JSON", exact=True).click()
    assert as_json.value.suggested_filename == "hello-export.json"
    data = json.loads(Path(as_json.value.path()).read_text(encoding="utf-8"))
    kinds = [(m["type"], m.get("content", "")[:40]) for m in data["messages"]]
    assert ("user", "hello export") in kinds
    assert ("assistant_text", reply[:40]) in kinds
    assert kinds[-1][0] == "complete"


def test_delete_after_confirmation(page, serve, alice):
    base = serve()
    login(page, base, "alice")
    chat_id = new_chat(page, base)
    send(page, "short lived")
    wait_replies(page, 1)
    page.get_by_text("More", exact=True).click()
    page.get_by_role("link", name="Delete chat…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Delete “short lived”?")
    page.get_by_role("button", name="Delete chat").click()

    page.wait_for_url(f"{base}/")
    expect(page.get_by_role("status")).to_contain_text("Deleted “short lived”.")
    expect(page.get_by_role("link", name="short lived")).to_have_count(0)
    response = page.goto(f"{base}/chat/{chat_id}/")
    assert response.status == 404


# --- 11: regenerate and edit: versions and branches, tests/everyday/test_branches_page.py ------


# --- 12, 13: code blocks, context gauge and compaction -----------------------------------------


def test_code_blocks_get_a_copy_button(browser, serve, alice):
    base = serve()
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        login(page, base, "alice")
        new_chat(page, base)
        send(page, "code")
        wait_replies(page, 1)
        reply = replies(page).last
        expect(reply.locator("pre.highlight")).to_have_count(2)
        copy = reply.get_by_role("button", name="Copy code")
        expect(copy).to_have_count(2)
        copy.last.click()
        expect(copy.last).to_have_text("Copied")
        clipboard = page.evaluate("() => navigator.clipboard.readText()")
        assert clipboard.startswith("python3 top_words.py")

        page.reload()  # the buttons are added to a loaded page too
        expect(replies(page).last.get_by_role("button", name="Copy code")).to_have_count(2)
    finally:
        context.close()


def test_context_gauge_and_compact_now(page, serve, alice):
    base = serve(token_delay=0)
    login(page, base, "alice")
    new_chat(page, base)
    expect(page.locator("#context-gauge")).to_have_text("0 tokens")
    send(page, "long")
    wait_replies(page, 1)
    first = gauge_tokens(page)
    assert first > 0
    send(page, "long again")
    wait_replies(page, 2)
    before = gauge_tokens(page)
    assert before > first + 500  # the first long answer is in context now

    page.get_by_role("button", name="Compact now").click()
    marker = messages(page).locator(".msg.compacted")
    expect(marker).to_contain_text("Context compacted", timeout=WAIT_MS)
    marker.get_by_text("Summary", exact=True).click()
    expect(marker.locator(".summary-text")).to_be_visible()
    expect(marker.locator(".summary-text")).to_contain_text("long")
    expect(page.get_by_role("button", name="Compact now")).to_be_visible(timeout=WAIT_MS)

    wait_replies(page, 3)  # the compaction run ends with its usage line too
    assert gauge_tokens(page) == before  # the gauge moves on the next request

    send(page, "hello after compaction")
    wait_replies(page, 4)
    after = gauge_tokens(page)
    assert 0 < after < before


# --- 14: a long chat ---------------------------------------------------------------------------


def test_long_chat_opens_at_the_newest_and_loads_older(page, serve, alice):
    chat = store.create_chat(alice, title="A long chat", model="demo")
    history = []
    for number in range(1, 101):
        history += [user(f"question {number}"), assistant(f"answer {number}")]
    store.append_display_messages(chat.pk, history)
    base = serve()
    login(page, base, "alice")
    page.goto(f"{base}/chat/{chat.pk}/")
    wait_socket_open(page)

    items = messages(page).locator(":scope > [data-seq]")
    expect(items).to_have_count(50)
    expect(items.last).to_contain_text("answer 100")
    assert [seq for seq, _ in page_items(page)] == list(range(151, 201))

    scroller = page.locator("#scroller")
    scroller.hover()
    deadline = time.monotonic() + WAIT_MS / 1000
    while items.count() < 200:
        assert time.monotonic() < deadline, f"only {items.count()} items were loaded"
        page.mouse.wheel(0, -20_000)
        page.wait_for_timeout(100)
    assert [seq for seq, _ in page_items(page)] == list(range(1, 201))
    expect(items.first).to_contain_text("question 1")
    expect(page.get_by_text("Load older messages")).to_have_count(0)
