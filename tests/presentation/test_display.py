"""Rendered items are cached, and a cached item never shows a state it has left."""

from __future__ import annotations

import re

import pytest

from chat import store
from chat.core.eventlog import msg_event
from chat.core.messages import ChatMessage, ToolCall
from chat.presentation import display

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def cold_caches():
    display.forget_rendered()
    yield
    display.forget_rendered()


def _write(chat, *payloads) -> None:
    store.append_display(chat.pk, list(payloads))


def _message(message: ChatMessage) -> dict:
    return msg_event(message, store.now_ms())


def _page(client, chat) -> str:
    response = client.get(f"/chat/{chat.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def _items(html: str) -> str:
    return html[html.index('id="messages"') : html.index('id="stream"')]


def _call_status(html: str) -> str:
    return re.search(r'id="call-status-c1"[^>]*>([^<]*)<', html).group(1)


def test_a_tool_card_follows_its_call_from_running_to_done(alice_client, alice):
    chat = store.create_chat(alice, title="Tools")
    call = ToolCall("c1", "calculator", '{"expression": "6*7"}')
    _write(
        chat,
        _message(ChatMessage(role="assistant", content="", tool_calls=[call])),
        {"type": "tool_start", "call_id": "c1", "name": "calculator"},
    )
    assert _call_status(_page(alice_client, chat)) == "running"

    _write(chat, {"type": "tool_end", "call_id": "c1", "name": "calculator", "status": "done"})
    assert _call_status(_page(alice_client, chat)) == "done"


def test_a_queued_message_loses_its_badge_once_taken(alice_client, alice):
    chat = store.create_chat(alice, title="Queue")
    _write(chat, _message(ChatMessage(role="user", content="later", extra={"queued": True})))
    assert "badge queued" in _page(alice_client, chat)

    _write(chat, {"type": "input_taken", "input_seq": 1})
    assert "badge queued" not in _page(alice_client, chat)


def test_the_same_seq_in_two_chats_shows_each_chats_own_item(alice_client, alice):
    first = store.create_chat(alice, title="One")
    second = store.create_chat(alice, title="Two")
    _write(first, _message(ChatMessage(role="user", content="apples")))
    _write(second, _message(ChatMessage(role="user", content="pears")))

    assert "apples" in _page(alice_client, first) and "pears" not in _page(alice_client, first)
    assert "pears" in _page(alice_client, second) and "apples" not in _page(alice_client, second)


def test_an_unchanged_item_is_rendered_once(alice_client, alice, monkeypatch):
    chat = store.create_chat(alice, title="Cache")
    _write(
        chat,
        _message(ChatMessage(role="user", content="hello")),
        _message(ChatMessage(role="assistant", content="**Hi** there")),
    )
    rendered: list[str] = []
    original = display.render_to_string

    def counting(template, context=None, *args, **kwargs):
        rendered.append(template)
        return original(template, context, *args, **kwargs)

    monkeypatch.setattr(display, "render_to_string", counting)
    first, second = _page(alice_client, chat), _page(alice_client, chat)

    assert _items(first) == _items(second) and "<strong>Hi</strong>" in _items(first)
    assert sorted(rendered) == ["chat/messages/assistant_text.html", "chat/messages/user.html"]
