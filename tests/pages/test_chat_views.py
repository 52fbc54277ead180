"""The chat pages through Django's test client: history paging, search, new chat,
rename, delete, export, API keys, and "another user's chat is 404" for every URL
that takes a chat id.

Chats are filled through the event store, the way runs write them, so each test
knows exactly which display events (and so which items) a page must show.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid

import pytest
from django.urls import reverse

from chat import store
from chat.core.messages import ChatMessage, ToolCall
from chat.models import Agent, ApiKey, ChatEvent, ChatSession, Run
from chat.views import PAGE_ITEMS

pytestmark = pytest.mark.django_db

ITEM_ID = re.compile(r'\bid="ev-(\d+)"')
SENTINEL = re.compile(r'id="load-older"[^>]*hx-get="[^"?]*\?before=(\d+)"')


@pytest.fixture
def bob_client(client, bob):
    client.force_login(bob)
    return client


def item_seqs(html: str) -> list[int]:
    return [int(seq) for seq in ITEM_ID.findall(html)]


def sentinel_before(html: str) -> int | None:
    match = SENTINEL.search(html)
    return int(match.group(1)) if match else None


def notes(chat, count: int, start: int = 1) -> None:
    store.append_display_messages(
        chat.pk, [ChatMessage(role="system", content=f"note {i}") for i in range(start, count + 1)]
    )


def item_seqs_of(chat, after: int = 0, before: int | None = None) -> list[int]:
    from chat.presentation import display

    return [
        e.seq
        for e in store.display_events_after(chat.pk, after)
        if display.item_from_event(e) is not None and (before is None or e.seq < before)
    ]


def flashes(response) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


# --- the chat page and older pages ------------------------------------------------------------


def test_a_short_chat_shows_every_item_and_no_sentinel(alice_client, alice):
    chat = store.create_chat(alice, title="Short")
    notes(chat, 12)
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    assert item_seqs(html) == list(range(1, 13))
    assert sentinel_before(html) is None
    assert 'id="seq-marker" data-seq="12"' in html


def test_a_reply_written_while_the_page_is_read_is_on_it_once(alice_client, alice, monkeypatch):
    # The chat row is read (access check) before the page's events: a reply written in
    # between is on the page, and the marker must say so, or the socket's resync pushes
    # it again and the page shows the reply twice.
    from chat import views

    chat = store.create_chat(alice, title="Racing")
    notes(chat, 2)
    read_page = views.page_of_items

    def reply_lands_first(*args, **kwargs):
        store.append_display_messages(chat.pk, [ChatMessage(role="assistant", content="Hi!")])
        return read_page(*args, **kwargs)

    monkeypatch.setattr(views, "page_of_items", reply_lands_first)
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    assert item_seqs(html) == [1, 2, 3]
    assert 'id="seq-marker" data-seq="3"' in html


def test_the_chat_page_shows_the_last_50_items_and_a_load_older_sentinel(alice_client, alice):
    chat = store.create_chat(alice, title="Long history")
    notes(chat, 60)
    # Events that are not items (status only) do not count towards the page.
    store.append_display(chat.pk, [{"type": "context_usage", "used": 10}] * 30)
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    assert item_seqs(html) == list(range(11, 61))
    assert len(item_seqs(html)) == PAGE_ITEMS
    assert sentinel_before(html) == 11
    assert "note 60" in html and "note 10<" not in html
    assert 'id="seq-marker" data-seq="90"' in html


def test_older_pages_walk_back_and_fold_call_states_written_later(alice_client, alice):
    chat = store.create_chat(alice, title="Paging")
    call = ToolCall(id="call_old_1", name="write_file", arguments='{"path": "a.md"}')
    store.append_display_messages(
        chat.pk,
        [
            ChatMessage(role="user", content="write file a.md"),
            ChatMessage(role="assistant", content="", tool_calls=[call]),
        ],
    )
    store.append_display(
        chat.pk, [{"type": "approval_required", "call_id": call.id, "name": call.name}]
    )
    (queued,) = store.append_display_messages(
        chat.pk, [ChatMessage(role="user", content="sent while busy", extra={"queued": True})]
    )
    notes(chat, 120)
    # Both states are written long after the items they belong to (pages later).
    store.append_display(
        chat.pk,
        [
            {"type": "input_taken", "input_seq": queued.seq},
            {
                "type": "approval_decided",
                "call_id": call.id,
                "name": call.name,
                "decision": "denied",
                "reason": "not today",
            },
        ],
    )

    newest = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    before = sentinel_before(newest)
    assert item_seqs(newest) == item_seqs_of(chat)[-PAGE_ITEMS:]
    pages = [item_seqs(newest)]
    last_html = ""
    while before is not None:
        response = alice_client.get(f"/chat/{chat.pk}/older/", {"before": before})
        assert response.status_code == 200
        last_html = response.content.decode()
        pages.insert(0, item_seqs(last_html))
        assert pages[0] == item_seqs_of(chat, before=before)[-PAGE_ITEMS:]
        before = sentinel_before(last_html)
    # Every item exactly once, in order, across the pages.
    assert [seq for page in pages for seq in page] == item_seqs_of(chat)
    assert len(pages) == 3
    # The oldest page folds the later states in: the call is denied, the input taken.
    assert 'class="tool-status status-denied"' in last_html
    assert "Denied: “not today”" in last_html
    assert "Approve</button>" not in last_html
    assert 'class="badge queued"' not in last_html


def test_the_page_shows_a_typing_reply_only_while_a_run_is_writing(alice_client, alice):
    chat = store.create_chat(alice, title="Live")
    run = Run.objects.create(chat=chat, model="demo", partial_text="Half a sentence")
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    assert f'data-run="{run.pk}"' in html and "Half a sentence" in html
    # Waiting for the user's approval: nothing is being written.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.WAITING, partial_text="")
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    assert 'class="msg assistant streaming idle" data-run=""' in html
    assert ">Stop</button>" in html  # the run can still be stopped


RUN_STATUS = re.compile(r'<div id="run-status"[^>]*>(.*?)</div>', re.S)


def run_status_of(html: str) -> str:
    """The text of a page's run status line."""
    found = RUN_STATUS.search(html)
    assert found, "the page has a status line"
    return found.group(1)


def run_status_on(client, chat) -> str:
    return run_status_of(client.get(f"/chat/{chat.pk}/").content.decode())


def test_the_status_line_says_what_the_run_does_and_nothing_when_none_runs(alice_client, alice):
    chat = store.create_chat(alice, title="Status")
    assert run_status_on(alice_client, chat) == ""
    run = Run.objects.create(chat=chat, model="demo")
    assert run_status_on(alice_client, chat) == "Working…"
    Run.objects.filter(pk=run.pk).update(status=Run.Status.WAITING)
    assert run_status_on(alice_client, chat) == "Waiting for your approval"
    Run.objects.filter(pk=run.pk).update(status=Run.Status.COMPLETED)
    assert run_status_on(alice_client, chat) == ""


def test_older_needs_a_numeric_cursor(alice_client, alice):
    chat = store.create_chat(alice)
    assert alice_client.get(f"/chat/{chat.pk}/older/", {"before": "x"}).status_code == 400
    assert alice_client.get(f"/chat/{chat.pk}/older/").status_code == 400


# --- search, new chat, rename, delete ---------------------------------------------------------


def test_title_search_finds_own_chats_only(alice_client, alice, bob):
    store.create_chat(alice, title="Photosynthesis notes")
    store.create_chat(alice, title="Holiday PHOTO album")
    store.create_chat(alice, title="Quantum homework")
    store.create_chat(bob, title="Bob's photo secrets")
    html = alice_client.get(reverse("chat_search"), {"q": "photo"}).content.decode()
    assert "Photosynthesis notes" in html and "Holiday PHOTO album" in html
    assert "Quantum" not in html and "secrets" not in html
    everything = alice_client.get(reverse("chat_search"), {"q": ""}).content.decode()
    assert "Quantum homework" in everything and "secrets" not in everything
    none = alice_client.get(reverse("chat_search"), {"q": "100%"}).content.decode()
    assert "No chat matches “100%”" in none


def test_new_chat_uses_the_chosen_agent_and_model(alice_client, alice, agent):
    tutor = Agent.objects.create(slug="tutor", name="Tutor")
    response = alice_client.post(reverse("chat_new"), {"agent": "tutor", "model": "demo-fast"})
    chat = ChatSession.objects.get(owner=alice)
    assert response.status_code == 302 and response["Location"] == f"/chat/{chat.pk}/"
    assert (chat.agent_id, chat.model) == (tutor.pk, "demo-fast")
    page = alice_client.get(response["Location"]).content.decode()
    assert '<option value="demo-fast" selected>' in page


def test_new_chat_with_an_unknown_model_says_so_and_creates_nothing(alice_client, alice, agent):
    response = alice_client.post(
        reverse("chat_new"), {"agent": "assistant", "model": "gpt-imaginary"}, follow=True
    )
    assert response.redirect_chain[-1][0] == reverse("home")
    assert any("gpt-imaginary" in m and "not available" in m for m in flashes(response))
    assert not ChatSession.objects.filter(owner=alice).exists()


def test_rename_tidies_the_title_and_refuses_an_empty_one(alice_client, alice):
    chat = store.create_chat(alice, title="Old title")
    url = reverse("chat_rename", args=[chat.pk])
    response = alice_client.post(url, {"title": "  A   new\ttitle "})
    assert response.status_code == 302
    chat.refresh_from_db()
    assert chat.title == "A new title"
    # The htmx form gets the title box back.
    partial = alice_client.post(url, {"title": "Via htmx"}, HTTP_HX_REQUEST="true")
    assert 'id="chat-title">Via htmx<' in partial.content.decode()
    refused = alice_client.post(url, {"title": "   "}, follow=True)
    assert any("needs a title" in m for m in flashes(refused))
    chat.refresh_from_db()
    assert chat.title == "Via htmx"
    assert alice_client.get(url).status_code == 405


def test_delete_asks_first_and_then_deletes_the_chat_and_its_events(alice_client, alice):
    chat = store.create_chat(alice, title="Doomed")
    notes(chat, 5)
    url = reverse("chat_delete", args=[chat.pk])
    confirm = alice_client.get(url)
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Delete “Doomed”?" in html and '<form method="post"' in html
    assert ChatEvent.objects.filter(chat_id=chat.pk).count() == 5  # GET deletes nothing
    response = alice_client.post(url, follow=True)
    assert response.redirect_chain[-1][0] == reverse("home")
    assert any("Deleted “Doomed”" in m for m in flashes(response))
    assert not ChatSession.objects.filter(pk=chat.pk).exists()
    assert not ChatEvent.objects.filter(chat_id=chat.pk).exists()
    assert alice_client.get(f"/chat/{chat.pk}/").status_code == 404


# --- export -----------------------------------------------------------------------------------


@pytest.fixture
def exported_chat(alice):
    chat = store.create_chat(alice, title="Export me", model="demo-fast")
    call = ToolCall(id="call_x1", name="calculator", arguments='{"expression": "12*7"}')
    store.append_display_messages(
        chat.pk,
        [
            ChatMessage(role="user", content="calculate 12*7"),
            ChatMessage(
                role="assistant",
                content="",
                tool_calls=[call],
                reasoning_content="SECRET-THOUGHT-1 I should use the calculator.",
            ),
            ChatMessage(role="tool", content="84", tool_call_id=call.id),
            ChatMessage(
                role="assistant",
                content="The result is 84.",
                reasoning_content="SECRET-THOUGHT-2 done.",
            ),
        ],
    )
    store.append_display(chat.pk, [{"type": "complete", "input_tokens": 10, "output_tokens": 5}])
    return chat


def test_markdown_export_is_an_attachment_with_messages_calls_and_results(
    alice_client, exported_chat
):
    response = alice_client.get(reverse("chat_export", args=[exported_chat.pk, "md"]))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="export-me.md"'
    assert response["X-Content-Type-Options"] == "nosniff"
    body = response.content.decode()
    assert body.startswith("# Export me\n")
    for text in [
        "calculate 12*7",
        "`calculator`",
        '{"expression": "12*7"}',
        "84",
        "The result is 84.",
    ]:
        assert text in body, text
    assert body.index("calculate 12*7") < body.index("`calculator`") < body.index("The result")
    assert "SECRET-THOUGHT" not in body
    with_thinking = alice_client.get(
        reverse("chat_export", args=[exported_chat.pk, "md"]), {"reasoning": "1"}
    ).content.decode()
    assert "SECRET-THOUGHT-1" in with_thinking and "SECRET-THOUGHT-2" in with_thinking


def test_json_export_is_an_attachment_with_messages_calls_and_results(alice_client, exported_chat):
    url = reverse("chat_export", args=[exported_chat.pk, "json"])
    response = alice_client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="export-me.json"'
    assert response["X-Content-Type-Options"] == "nosniff"
    data = json.loads(response.content)
    assert (data["id"], data["title"], data["model"]) == (
        str(exported_chat.pk),
        "Export me",
        "demo-fast",
    )
    kinds = [m["type"] for m in data["messages"]]
    assert kinds == ["user", "tool_call_request", "tool_result", "assistant_text", "complete"]
    request, result = data["messages"][1], data["messages"][2]
    assert request["tool_calls"] == [
        {"id": "call_x1", "name": "calculator", "arguments": '{"expression": "12*7"}'}
    ]
    assert (result["tool_call_id"], result["content"]) == ("call_x1", "84")
    assert "SECRET-THOUGHT" not in response.content.decode()
    thinking = json.loads(alice_client.get(url, {"reasoning": "1"}).content)
    assert thinking["messages"][1]["reasoning"].startswith("SECRET-THOUGHT-1")
    assert thinking["messages"][3]["reasoning"].startswith("SECRET-THOUGHT-2")


def test_an_unknown_export_format_is_404(alice_client, exported_chat):
    for fmt in ["txt", "html", "MD", "json.exe"]:
        response = alice_client.get(f"/chat/{exported_chat.pk}/export.{fmt}")
        assert response.status_code == 404, fmt


# --- API keys ----------------------------------------------------------------------------------


def test_api_keys_are_shown_once_stored_hashed_listed_and_revoked(alice_client, alice, bob):
    url = reverse("api_keys")
    assert "No keys yet." in alice_client.get(url).content.decode()
    created = alice_client.post(url, {"name": "notebook"}, follow=True).content.decode()
    (raw,) = re.findall(r'id="new-key-value" type="text" readonly value="([^"]+)"', created)
    key = ApiKey.objects.get(user=alice)
    assert key.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    stored = [str(v) for v in ApiKey.objects.filter(pk=key.pk).values().get().values()]
    assert raw not in stored
    assert raw.startswith(key.prefix)

    listing = alice_client.get(url).content.decode()
    assert raw not in listing and "new-key-value" not in listing  # shown once
    assert f"{key.prefix}…" in listing and "notebook" in listing and "active" in listing

    bobs_key = ApiKey.objects.create(user=bob, prefix="lyk_bobbob", key_hash="b" * 64)
    for other in [bobs_key.pk, "not-a-number", "", "9" * 40]:
        assert alice_client.post(url, {"revoke": other}).status_code in (200, 302)
    bobs_key.refresh_from_db()
    assert bobs_key.revoked_at is None  # another user's key cannot be revoked
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None

    response = alice_client.post(url, {"revoke": key.pk}, follow=True)
    assert any("revoked" in m for m in flashes(response))
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert "revoked" in alice_client.get(url).content.decode()


# --- another user's chat ---------------------------------------------------------------------


def chat_urls(chat_id) -> list[tuple[str, str]]:
    return [
        ("get", f"/chat/{chat_id}/"),
        ("get", f"/chat/{chat_id}/older/?before=5"),
        ("post", f"/chat/{chat_id}/rename/"),
        ("get", f"/chat/{chat_id}/delete/"),
        ("post", f"/chat/{chat_id}/delete/"),
        ("get", f"/chat/{chat_id}/export.md"),
        ("get", f"/chat/{chat_id}/export.json"),
    ]


def test_another_users_chat_is_404_at_every_url(bob_client, alice):
    chat = store.create_chat(alice, title="Alice's diary")
    notes(chat, 10)
    for method, url in chat_urls(chat.pk) + chat_urls(uuid.uuid4()):
        response = getattr(bob_client, method)(url, {"title": "pwned"} if method == "post" else {})
        assert response.status_code == 404, (method, url)
        assert "diary" not in response.content.decode()
    chat.refresh_from_db()
    assert chat.title == "Alice's diary"
    assert ChatEvent.objects.filter(chat_id=chat.pk).count() == 10


def test_every_chat_url_needs_login(client, alice):
    chat = store.create_chat(alice, title="Private")
    for method, url in chat_urls(chat.pk) + [("get", reverse("api_keys"))]:
        response = getattr(client, method)(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url
