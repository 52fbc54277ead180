"""A watcher (view access granted by a policy, say a teacher) sees the page, not its write
controls; what the page hides is refused on the server anyway."""

from __future__ import annotations

import pytest
from django.http import Http404

from chat import access, actions
from chat.access import ChatAction

pytestmark = [pytest.mark.django_db]


@pytest.fixture
def watched(alice, bob, agent):
    chat = actions.new_chat(alice, model="demo-fast")

    def bob_may_view(who, target, action) -> bool:
        return who.pk == bob.pk and target.pk == chat.pk and action == ChatAction.VIEW

    access.register_chat_policy(bob_may_view)
    yield chat
    access._policies.remove(bob_may_view)


def test_the_owner_gets_the_write_controls(alice_client, watched):
    html = alice_client.get(f"/chat/{watched.pk}/").content.decode()
    assert 'class="chat-pane"' in html
    assert "Delete chat" in html and "You are watching this chat" not in html


def test_a_watcher_sees_the_chat_without_write_controls(client, bob, watched):
    client.force_login(bob)
    response = client.get(f"/chat/{watched.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="chat-pane view-only"' in html
    assert "You are watching this chat" in html
    assert "Delete chat" not in html
    # The composer is in the page (fragments are shared by every subscriber) but hidden
    # by the page's class, and the server refuses the write.
    assert 'class="composer-row write-control"' in html
    with pytest.raises(Http404):
        actions.send_message(bob, watched.pk, "hello", "c-1")
    assert client.post(f"/chat/{watched.pk}/rename/", {"title": "mine"}).status_code == 404
    assert client.post(f"/chat/{watched.pk}/delete/").status_code == 404
