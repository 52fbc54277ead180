"""A page with a live run learns that it ended even when the doorbell of its end is lost
(found by bench/soak.py: a worker killed mid-reply, the run recovered by a sweeper while
Redis restarted; the open page showed the run going on until reloaded)."""

from __future__ import annotations

import asyncio

import pytest

from chat import store
from chat.live import subscription
from chat.models import Run
from chat.runhost import transitions
from tests.hardening.sockets import adb, chat_socket, cookie_of, logged_in_client, open_socket

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quick_checks(monkeypatch):
    monkeypatch.setattr(subscription, "QUIET_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(subscription, "LIVE_CHECK_SECONDS", 0.3)


@pytest.fixture
def lost_doorbells(monkeypatch):
    """The run's end is written, but its doorbell never reaches anyone."""
    monkeypatch.setattr(transitions, "ring", lambda chat_id, rows: None)


def _orphan_run(user):
    """A chat whose run is live in the database, with nobody executing it any more."""
    chat = store.create_chat(user, title="orphan", model="demo")
    run = Run.objects.create(chat=chat, model="demo", claimed=True, partial_text="Half a rep")
    return chat, run


async def test_a_page_opened_on_a_dead_run_gets_its_end(
    alice, socket_env, quick_checks, lost_doorbells
):
    chat, run = await adb(_orphan_run)(alice)
    cookie = await adb(lambda: cookie_of(logged_in_client(alice)))()
    page = await chat_socket(cookie, chat.pk)
    assert "Half a rep" in "".join(page.frames)  # the reply so far, as the page opens
    # Elsewhere (a sweeper in another process), the run is recovered; no doorbell comes.
    assert await adb(transitions._recover)(await adb(Run.objects.get)(pk=run.pk))
    frame = await page.until('class="msg error-box"', timeout=5)
    assert "Interrupted" in frame
    await page.close()


async def test_a_page_that_hears_nothing_after_its_send_still_gets_the_reply(
    alice, socket_env, quick_checks, monkeypatch
):
    """The socket's subscription went deaf (lost with a Redis restart): no doorbell and
    no snapshot reach it. Its own send makes it read the log until the run has ended."""
    from chat.live.consumers import ChatConsumer

    chat = await adb(lambda: store.create_chat(alice, title="deaf", model="demo"))()
    cookie = await adb(lambda: cookie_of(logged_in_client(alice)))()
    page = await chat_socket(cookie, chat.pk)

    async def deaf(self, event):
        return None

    monkeypatch.setattr(ChatConsumer, "chat_events", deaf)
    monkeypatch.setattr(ChatConsumer, "chat_stream", deaf)
    await page.send(action="send", message="hello there", client_id="c-1")
    await page.until('class="msg usage"', timeout=10)  # the run's end, read from the log
    run = await adb(Run.objects.get)(chat=chat)
    assert run.status == Run.Status.COMPLETED
    await page.close()


async def test_another_users_page_on_it_is_refused(
    alice, bob, socket_env, quick_checks, lost_doorbells
):
    chat, _run = await adb(_orphan_run)(alice)
    cookie = await adb(lambda: cookie_of(logged_in_client(bob)))()
    _socket, ok, code = await open_socket(cookie, f"/ws/chat/{chat.pk}/")
    assert not ok and code == 4404  # another user's chat: no page, no checks for it


async def test_a_quiet_check_with_nothing_new_does_not_read_the_log(
    alice, socket_env, quick_checks, lost_doorbells, monkeypatch
):
    """While a run is live and quiet (say, still starting behind a hundred others), the
    quiet checks only look at the chat's last seq: the log is read once it moved."""
    from chat.presentation import fragments

    chat, run = await adb(_orphan_run)(alice)
    cookie = await adb(lambda: cookie_of(logged_in_client(alice)))()
    reads = []
    real_next_batch = fragments.next_batch

    def counted(chat_id, after_seq):
        reads.append(after_seq)
        return real_next_batch(chat_id, after_seq)

    monkeypatch.setattr(fragments, "next_batch", counted)
    page = await chat_socket(cookie, chat.pk)  # its resync reads the log, and arms the checks
    opened = len(reads)
    await asyncio.sleep(1.2)  # quiet checks at 0.2 s, then every 0.3 s while the run is live
    assert len(reads) == opened  # nothing new: the log was not read again
    assert await adb(transitions._recover)(await adb(Run.objects.get)(pk=run.pk))
    frame = await page.until('class="msg error-box"', timeout=5)  # no doorbell: a check read it
    assert "Interrupted" in frame
    assert len(reads) > opened
    await page.close()
