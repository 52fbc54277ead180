"""Pages over HTTP: login required everywhere, chats only for their owner."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse

from chat import store
from chat.management.commands.load_sample_chat import load_sample_chat

pytestmark = pytest.mark.django_db


def test_every_page_but_login_requires_login(client, alice):
    chat = store.create_chat(alice)
    for url in ["/", f"/chat/{chat.pk}/", "/password/change/", "/admin/"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/") or "/admin/login/" in response["Location"]
    assert client.get("/login/").status_code == 200


def test_login_through_the_form_lands_on_the_chat_list(client, alice):
    response = client.post("/login/", {"username": "alice", "password": "correct-horse-battery"})
    assert response.status_code == 302
    page = client.get(response["Location"])
    assert b"Your chats" in page.content
    assert b"alice" in page.content


def test_wrong_password_is_refused_with_a_readable_message(client, alice):
    response = client.post("/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert b"didn&#x27;t match" in response.content or b"didn't match" in response.content


def test_chat_list_shows_only_own_chats_newest_first(alice_client, alice, bob):
    older = store.create_chat(alice, title="Older chat")
    newer = store.create_chat(alice, title="Newer chat")
    store.create_chat(bob, title="Bob's secret")
    store.append_display(newer.pk, [{"type": "msg", "role": "user", "content": "hi"}])
    body = alice_client.get("/").content.decode()
    assert "Bob&#x27;s secret" not in body and "Bob's secret" not in body
    assert body.index("Newer chat") < body.index("Older chat")
    assert older.pk


def test_new_chat_creates_and_redirects(alice_client, alice):
    response = alice_client.post(reverse("chat_new"))
    chat = alice.chats.get()
    assert response["Location"] == f"/chat/{chat.pk}/"


def test_new_chat_needs_post(alice_client):
    assert alice_client.get(reverse("chat_new")).status_code == 405


def test_another_users_chat_is_404(alice_client, bob):
    bobs = store.create_chat(bob, title="Bob's chat")
    assert alice_client.get(f"/chat/{bobs.pk}/").status_code == 404
    assert alice_client.get(f"/chat/{uuid.uuid4()}/").status_code == 404


def test_sample_chat_renders_every_display_type(alice_client, alice):
    chat = load_sample_chat(alice)
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    for css in [
        'class="msg system"',
        'class="msg user"',
        "msg assistant",
        "msg tool-call",
        "msg tool-result",
    ]:
        assert css in html, css
    assert "SubAgent@checker" in html
    assert "&lt;SubAgent@checker&gt;" not in html  # display is clean, never wrapped
    assert '<details class="reasoning">' in html
    assert '<span class="nb">print</span>' in html  # Pygments highlighting
    assert "<table>" in html


def test_model_output_is_sanitised_after_rendering(alice_client, alice):
    chat = store.create_chat(alice)
    hostile = (
        "<script>alert(1)</script> <img src=x onerror=alert(1)> [x](javascript:alert(1)) "
        "![p](http://example.invalid/p.png)"
    )
    store.append_display(chat.pk, [{"type": "msg", "role": "assistant", "content": hostile}])
    html = alice_client.get(f"/chat/{chat.pk}/").content.decode()
    messages = html[html.index('id="messages"') :]
    assert "<script>" not in messages
    assert "<img" not in messages
    assert 'href="javascript:' not in messages
    assert "[image: p]" in messages


def test_pages_send_a_csp_without_inline_script(alice_client):
    response = alice_client.get("/")
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert response["X-Content-Type-Options"] == "nosniff"


def test_role_badge_reflects_groups(client, make_user):
    for username, kwargs, role in [
        ("s", {}, "student"),
        ("t", {"teacher": True}, "teacher"),
        ("a", {"staff": True}, "admin"),
    ]:
        client.force_login(make_user(username, **kwargs))
        assert f'role-badge role-{role}"'.encode() in client.get("/").content


def test_password_change(client, alice):
    client.force_login(alice)
    response = client.post(
        "/password/change/",
        {
            "old_password": "correct-horse-battery",
            "new_password1": "a-much-better-passphrase",
            "new_password2": "a-much-better-passphrase",
        },
    )
    assert response["Location"] == "/password/change/done/"
    alice.refresh_from_db()
    assert alice.check_password("a-much-better-passphrase")


def test_the_admin_cannot_edit_or_delete_events(client, make_user, alice):
    chat = store.create_chat(alice)
    (event,) = store.append_display(chat.pk, [{"type": "msg", "role": "user", "content": "hi"}])
    root = make_user("root", staff=True)
    root.is_superuser = True
    root.save()
    client.force_login(root)
    assert client.get(f"/admin/chat/chatevent/{event.pk}/change/").status_code == 200  # view only
    assert client.get(f"/admin/chat/chatevent/{event.pk}/delete/").status_code == 403
    assert client.get("/admin/chat/chatevent/add/").status_code == 403
    assert client.get("/admin/chat/chatsession/").status_code == 200
