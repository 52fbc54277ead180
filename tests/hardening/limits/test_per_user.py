"""§4 of issue 14: each user's limits (chats, messages per minute, replies at once, API keys),
refused with words that say what to do, the same through the page, the socket and the API.

Marked ``persistence``: on PostgreSQL the per-user locks, not SQLite's one writer, hold the
counts under concurrency.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.test import Client

from chat import actions, apikeys, quotas
from chat.models import ApiKey, ChatEvent, ChatSession, QueuedInput, Run
from tests.hardening.sockets import adb, chat_socket, cookie_of, logged_in_client

pytestmark = [pytest.mark.persistence]

TOO_FAST = "You are sending messages too fast (at most 3 a minute)."


@pytest.fixture
def no_runs(monkeypatch, settings, tmp_path):
    """Runs are made but never executed: they stay live, as a reply in progress does."""
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    monkeypatch.setattr("chat.runhost.executor.launch_soon", lambda run_id, *, resume=False: None)


def chats_of(user, count: int) -> list[ChatSession]:
    return [actions.new_chat(user, model="demo-fast") for _ in range(count)]


def api_client(user) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {apikeys.create_api_key(user, 't')[1]}")


# --- messages per minute -----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_fourth_message_in_a_minute_is_refused_and_not_stored(
    alice, bob, agent, counters, no_runs, settings, clock
):
    settings.LYCEUM_MESSAGES_PER_MINUTE = 3
    chat = chats_of(alice, 1)[0]
    for n in range(3):
        actions.send_message(alice, chat.pk, f"message {n}", f"c-{n}")

    with pytest.raises(actions.ActionError) as refused:
        actions.send_message(alice, chat.pk, "one too many", "c-3")

    assert refused.value.code == "rate_limited"
    assert TOO_FAST in refused.value.message
    assert "Try again in 20 seconds." in refused.value.message
    assert refused.value.retry_after == 20
    assert QueuedInput.objects.filter(chat=chat).count() == 3
    # The same message again (a retry with its client id) is not a new one: no refusal.
    assert actions.send_message(alice, chat.pk, "message 0", "c-0").duplicate
    # Bob has his own minute.
    actions.send_message(bob, chats_of(bob, 1)[0].pk, "hello", "b-1")
    clock.advance(20)
    actions.send_message(alice, chat.pk, "later", "c-4")


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_429_with_the_message_and_leaves_no_chat(
    alice, agent, counters, no_runs, settings
):
    settings.LYCEUM_MESSAGES_PER_MINUTE = 3
    for _ in range(3):
        quotas.take_message(alice)
    chats_before = ChatSession.objects.count()

    response = api_client(alice).post(
        "/api/v1/chat", {"message": "hello"}, content_type="application/json"
    )

    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and TOO_FAST in error["message"]
    assert ChatSession.objects.count() == chats_before


@pytest.mark.django_db
def test_the_home_composer_shows_why(alice, alice_client, agent, counters, no_runs, settings):
    settings.LYCEUM_MESSAGES_PER_MINUTE = 3
    for _ in range(3):
        quotas.take_message(alice)

    response = alice_client.post("/chats/start/", {"message": "hello", "client_id": "h-1"})

    assert response.status_code == 429
    assert TOO_FAST in response.content.decode()
    assert not ChatSession.objects.filter(owner=alice).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("socket_env")
async def test_the_socket_shows_a_notice_and_stores_nothing(alice, agent, settings):
    settings.LYCEUM_MESSAGES_PER_MINUTE = 3
    settings.REDIS_URL = ""
    chat = await adb(actions.new_chat)(alice, model="demo-fast")
    for _ in range(3):
        await adb(quotas.take_message)(alice)
    client = await adb(logged_in_client)(alice)
    socket = await chat_socket(cookie_of(client), chat.pk)

    await socket.send(action="send", message="too fast", client_id="s-1")
    notice = await socket.until('id="notice"')

    assert TOO_FAST in notice
    await socket.drain()
    assert not await QueuedInput.objects.filter(chat=chat).aexists()
    await socket.close()


@pytest.mark.django_db(transaction=True)
def test_twenty_sends_at_once_store_exactly_the_five_allowed(
    alice, agent, counters, no_runs, settings
):
    settings.LYCEUM_MESSAGES_PER_MINUTE = 5
    chats = chats_of(alice, 20)

    def send(n: int) -> bool:
        try:
            actions.send_message(alice, chats[n].pk, f"hello {n}", f"c-{n}")
            return True
        except actions.ActionError as exc:
            assert exc.code == "rate_limited"
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(10) as pool:
        sent = list(pool.map(send, range(20)))

    assert sent.count(True) == 5
    assert QueuedInput.objects.filter(chat__owner=alice).count() == 5


# --- chats ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_chats_stop_at_the_limit_on_every_door(alice, bob, agent, no_runs, settings):
    settings.LYCEUM_MAX_CHATS_PER_USER = 2
    chats_of(alice, 2)
    words = "You have 2 chats, the most one person may keep."

    with pytest.raises(actions.ActionError) as refused:
        actions.new_chat(alice)
    assert refused.value.code == "too_many_chats" and words in refused.value.message

    page = logged_in_client(alice).post("/chats/new/", follow=True)
    assert words in page.content.decode()

    composer = logged_in_client(alice).post("/chats/start/", {"message": "hi"})
    assert composer.status_code == 403 and words in composer.content.decode()

    api = api_client(alice).post("/api/v1/chat", {"message": "hi"}, content_type="application/json")
    assert api.status_code == 403 and words in api.json()["error"]["message"]

    assert ChatSession.objects.filter(owner=alice).count() == 2
    assert not QueuedInput.objects.filter(chat__owner=alice).exists()
    chats_of(bob, 1)  # Bob's count is his own


@pytest.mark.django_db(transaction=True)
def test_ten_new_chats_at_once_make_exactly_three(alice, agent, settings):
    settings.LYCEUM_MAX_CHATS_PER_USER = 3

    def make(_: int) -> bool:
        try:
            actions.new_chat(alice, model="demo-fast")
            return True
        except actions.ActionError:
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(10) as pool:
        made = list(pool.map(make, range(10)))

    assert made.count(True) == 3
    assert ChatSession.objects.filter(owner=alice).count() == 3


# --- replies at once ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_second_reply_at_once_is_refused_until_the_first_ends(
    alice, bob, agent, no_runs, settings
):
    settings.LYCEUM_MAX_RUNNING_PER_USER = 1
    first, second = chats_of(alice, 2)
    actions.send_message(alice, first.pk, "hello", "a-1")

    with pytest.raises(actions.ActionError) as refused:
        actions.send_message(alice, second.pk, "and here", "b-1")

    assert refused.value.code == "too_many_runs"
    assert "You already have 1 reply in progress" in refused.value.message
    assert not QueuedInput.objects.filter(chat=second).exists()
    assert not ChatEvent.objects.filter(chat=second, kind="msg").exists()
    # A message into the chat whose reply is running waits for it: no new reply.
    assert actions.send_message(alice, first.pk, "one more", "a-2").queued
    # Regenerating elsewhere is a reply too; Bob's replies are his own.
    with pytest.raises(actions.ActionError):
        actions.request_compaction(alice, first.pk)
    actions.send_message(bob, chats_of(bob, 1)[0].pk, "hi", "bob-1")

    Run.objects.filter(chat=first).update(status=Run.Status.COMPLETED)
    actions.send_message(alice, second.pk, "and here", "b-1")


@pytest.mark.django_db(transaction=True)
def test_ten_sends_into_ten_chats_at_once_start_exactly_two_replies(
    alice, agent, no_runs, settings
):
    settings.LYCEUM_MAX_RUNNING_PER_USER = 2
    chats = chats_of(alice, 10)

    def send(n: int) -> bool:
        try:
            actions.send_message(alice, chats[n].pk, "hello", f"c-{n}")
            return True
        except actions.ActionError:
            return False
        finally:
            connection.close()

    with ThreadPoolExecutor(10) as pool:
        sent = list(pool.map(send, range(10)))

    assert sent.count(True) == 2
    assert Run.objects.filter(chat__owner=alice).count() == 2


# --- API keys -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_key_page_refuses_a_key_past_the_limit(alice, alice_client, settings):
    settings.LYCEUM_MAX_API_KEYS = 2
    for _ in range(2):
        alice_client.post("/settings/api-keys/", {"name": "k"})

    page = alice_client.post("/settings/api-keys/", {"name": "third"}, follow=True)

    assert "You have 2 active API keys, the most one person may hold." in page.content.decode()
    assert ApiKey.objects.filter(user=alice).count() == 2
    # Revoking one makes room.
    apikeys.revoke_api_key(alice, ApiKey.objects.filter(user=alice).first().pk)
    alice_client.post("/settings/api-keys/", {"name": "third"})
    assert ApiKey.objects.filter(user=alice, revoked_at__isnull=True).count() == 2
