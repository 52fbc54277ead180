"""§4 A home that starts a chat (issue 15): no empty chats, titles from the model after
the first reply, a person's rename always wins."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.urls import reverse

from chat import actions, store
from chat.catalog import resolve_model
from chat.core.messages import assistant
from chat.models import ChatSession
from chat.runhost import titles

pytestmark = pytest.mark.django_db


def test_home_has_a_focused_start_a_chat_composer_with_pickers(alice_client, agent):
    page = alice_client.get(reverse("home")).content.decode()
    assert '<label for="start-message" class="visually-hidden">Start a chat</label>' in page
    assert "autofocus" in page
    assert 'id="home-agent"' in page and 'id="home-model"' in page


def test_first_message_makes_the_chat_and_an_empty_one_makes_nothing(
    alice_client, alice, agent, monkeypatch
):
    monkeypatch.setattr(actions, "launch_on_commit", lambda *a, **k: None)
    refused = alice_client.post(reverse("chat_start"), {"message": "  ", "model": "demo"})
    assert refused.status_code == 400
    assert "The message is empty." in refused.content.decode()
    assert not ChatSession.objects.filter(owner=alice).exists()

    response = alice_client.post(
        reverse("chat_start"), {"message": "hello there", "model": "demo-fast"}
    )
    chat = ChatSession.objects.get(owner=alice)
    assert response["Location"] == reverse("chat_detail", args=[chat.pk])
    assert chat.model == "demo-fast" and chat.title == "hello there"
    assert chat.inputs.count() == 1 and chat.runs.count() == 1


def _answered(alice, text: str, reply: str) -> ChatSession:
    chat = actions.new_chat(alice)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(actions, "launch_on_commit", lambda *a, **k: None)
        actions.send_message(alice, chat.pk, text, "c1")
    store.append_display_messages(chat.pk, [assistant(reply)])
    store.append_display(chat.pk, [{"type": "complete", "input_tokens": 1, "output_tokens": 1}])
    chat.refresh_from_db()
    return chat


def _generate(chat: ChatSession) -> str | None:
    resolved = resolve_model("demo")
    return async_to_sync(titles.generate_title)(chat.pk, resolved.provider, "demo")


@pytest.mark.django_db(transaction=True)
def test_title_is_written_by_the_model_after_the_first_reply(alice, agent):
    chat = _answered(alice, "what is the boiling point of water at altitude?", "Lower.")
    assert chat.title == "what is the boiling point of water at altitude?"
    assert _generate(chat) == "what is the boiling point of"
    chat.refresh_from_db()
    assert chat.title == "what is the boiling point of"
    events = [e for e in store.display_events_after(chat.pk, 0) if e.kind == "title"]
    assert events[-1].payload.get("generated") is True
    assert _generate(chat) is None  # once only


@pytest.mark.django_db(transaction=True)
def test_a_rename_wins_over_the_generated_title(alice, agent):
    chat = _answered(alice, "tell me about owls", "Owls hoot.")
    actions.rename_chat(alice, chat.pk, "My owls")
    assert _generate(chat) is None
    chat.refresh_from_db()
    assert chat.title == "My owls"


def test_clean_title():
    assert titles.clean_title('Title: "Owls at night."\nmore') == "Owls at night"
    assert titles.clean_title("  ") == ""
