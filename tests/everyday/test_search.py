"""§4 Chats that are easy to find (issue 15): full-text search over messages with
highlighted snippets and a jump to the message; pinned chats first."""

from __future__ import annotations

import pytest
from django.urls import reverse

from chat import actions, search, store
from chat.core.messages import assistant, user

pytestmark = [pytest.mark.django_db, pytest.mark.persistence]


def _chat(owner, title: str, *texts: str):
    chat = actions.new_chat(owner, title=title)
    store.append_display_messages(
        chat.pk, [user(t) if i % 2 == 0 else assistant(t) for i, t in enumerate(texts)]
    )
    return chat


def test_search_finds_words_in_messages_with_highlighted_snippets(alice, bob, agent):
    owls = _chat(
        alice, "Birds", "tell me about owls", "Owls hunt at night with silent <b>wings</b>."
    )
    _chat(alice, "Cooking", "a recipe for soup", "Boil water, add leeks.")
    _chat(bob, "Bob's owls", "owls owls owls")

    hits = search.search_messages(alice, "silent wings")
    assert [(h.chat_id, h.chat_title, h.seq) for h in hits] == [(str(owls.pk), "Birds", 2)]
    assert "<mark>silent</mark>" in hits[0].snippet
    # The message's own markup never becomes markup: escaped (SQLite) or left out by
    # ts_headline's parser (PostgreSQL).
    assert "<b>" not in hits[0].snippet

    assert {h.seq for h in search.search_messages(alice, "owl")} == {1, 2}  # prefix, both
    assert all(h.chat_id == str(owls.pk) for h in search.search_messages(alice, "owls"))
    assert search.search_messages(alice, "leeks water")[0].chat_title == "Cooking"
    assert search.search_messages(alice, "  ") == []
    assert search.search_messages(alice, 'owls" OR "soup') == []  # only words, all of them


def test_deleted_chats_leave_the_index(alice, agent):
    chat = _chat(alice, "Gone", "ephemeral zebra")
    assert search.search_messages(alice, "zebra")
    actions.delete_chat(alice, chat.pk)
    assert search.search_messages(alice, "zebra") == []


def test_sidebar_search_lists_hits_that_jump_to_the_message(alice_client, alice, agent):
    chat = _chat(alice, "Old chat", *[f"filler message {i}" for i in range(120)])
    store.append_display_messages(chat.pk, [assistant("the axolotl regrows limbs")])
    store.append_display_messages(chat.pk, [user(f"later {i}") for i in range(80)])
    listing = alice_client.get(reverse("chat_search"), {"q": "axolotl"}).content.decode()
    link = f"/chat/{chat.pk}/?at=121#ev-121"
    assert f'href="{link}"' in listing
    assert "<mark>axolotl</mark>" in listing

    page = alice_client.get(link.split("#")[0]).content.decode()
    assert 'id="ev-121"' in page  # an old message, loaded so the page can show it
    plain = alice_client.get(reverse("chat_detail", args=[chat.pk])).content.decode()
    assert 'id="ev-121"' not in plain


def test_pinned_chats_come_first_and_pinning_is_the_owners(alice_client, alice, bob, agent):
    first = _chat(alice, "First", "a")
    _chat(alice, "Second", "b")
    response = alice_client.post(reverse("chat_pin", args=[first.pk]), {"pinned": "1", "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/"
    home = alice_client.get(reverse("home")).content.decode()
    assert home.index(">First<") < home.index(">Second<")
    assert "Unpin" in home and "Menu of First" in home
    with pytest.raises(Exception):  # noqa: B017 - Http404 for anyone else
        actions.pin_chat(bob, first.pk, pinned=False)
    alice_client.post(reverse("chat_pin", args=[first.pk]), {"pinned": "0"})
    home = alice_client.get(reverse("home")).content.decode()
    assert home.index(">Second<") < home.index(">First<")
