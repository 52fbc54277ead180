"""§1 of issue 14: a socket lives only as long as the login it was opened with.

Each case has a watch-only socket (it sends nothing after its resync, so only the
per-user bell or the periodic re-check can close it) and, where it matters, an
acting socket whose next action must be refused without writing anything.
"""

from __future__ import annotations

import pytest
from django.contrib.sessions.models import Session

from chat import actions
from chat.live import subscription
from chat.models import ChatEvent, QueuedInput
from tests.conftest import PASSWORD
from tests.hardening.sockets import adb, chat_socket, cookie_of, logged_in_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("socket_env")]


def rows(chat_id) -> tuple[int, int]:
    return (
        ChatEvent.objects.filter(chat_id=chat_id).count(),
        QueuedInput.objects.filter(chat_id=chat_id).count(),
    )


async def _chat(user):
    return await adb(actions.new_chat)(user, model="demo-fast")


@pytest.mark.parametrize("layer_kind", ["memory", "redis"], indirect=True)
async def test_logout_closes_that_sessions_sockets_at_once(alice, agent, layer_kind):
    chat = await _chat(alice)
    tab = await adb(logged_in_client)(alice)
    other_login = await adb(logged_in_client)(alice)  # another browser, still logged in
    watcher = await chat_socket(cookie_of(tab), chat.pk)
    actor = await chat_socket(cookie_of(tab), chat.pk)
    elsewhere = await chat_socket(cookie_of(other_login), chat.pk)
    before = await adb(rows)(chat.pk)

    await adb(tab.logout)()
    # The default re-check comes every 10 s: closing within the wait is the bell's doing.
    assert await watcher.closed_with(timeout=3) == 4401
    assert await actor.closed_with(timeout=3) == 4401
    # The other login is untouched and still works.
    await elsewhere.send(action="send", message="still here", client_id="c-1")
    await elsewhere.until("still here")
    assert (await adb(rows)(chat.pk))[1] == before[1] + 1
    await elsewhere.close()


async def test_a_password_change_elsewhere_closes_the_other_sessions_sockets(alice, agent):
    chat = await _chat(alice)
    old = await adb(logged_in_client)(alice)
    watcher = await chat_socket(cookie_of(old), chat.pk)

    changer = await adb(logged_in_client)(alice)
    response = await adb(changer.post)(
        "/password/change/",
        {
            "old_password": PASSWORD,
            "new_password1": "a-new-and-long-passphrase",
            "new_password2": "a-new-and-long-passphrase",
        },
    )
    assert response.status_code == 302
    assert await watcher.closed_with(timeout=3) == 4401


async def test_deactivation_closes_every_socket_of_the_user_with_4403(alice, agent):
    chat = await _chat(alice)
    client = await adb(logged_in_client)(alice)
    watcher = await chat_socket(cookie_of(client), chat.pk)
    alice.is_active = False
    await adb(alice.save)()
    assert await watcher.closed_with(timeout=3) == 4403


async def test_an_action_on_a_session_deleted_without_any_bell_is_refused(alice, agent):
    """The bell is a hint: the per-action check alone must refuse a dead session."""
    chat = await _chat(alice)
    client = await adb(logged_in_client)(alice)
    socket = await chat_socket(cookie_of(client), chat.pk)
    before = await adb(rows)(chat.pk)
    await Session.objects.filter(session_key=cookie_of(client)).adelete()  # no signal
    await socket.send(action="send", message="who am I?", client_id="c-1")
    assert await socket.closed_with() == 4401
    assert await adb(rows)(chat.pk) == before


async def test_an_action_after_a_silent_password_change_is_refused(alice, agent):
    """A password changed by a queryset update (no signal, no bell): the auth hash
    stored in the session no longer matches, so the next action is refused."""
    chat = await _chat(alice)
    client = await adb(logged_in_client)(alice)
    socket = await chat_socket(cookie_of(client), chat.pk)
    before = await adb(rows)(chat.pk)
    await type(alice).objects.filter(pk=alice.pk).aupdate(password="md5$x$changed")
    await socket.send(action="cancel")
    assert await socket.closed_with() == 4401
    assert await adb(rows)(chat.pk) == before


async def test_a_watch_only_socket_is_closed_by_the_periodic_recheck(
    alice, agent, settings, monkeypatch
):
    """Without the bell (a silent session delete), a socket that only watches is closed
    by the access re-check that runs before pushes."""
    monkeypatch.setattr(subscription, "ACCESS_RECHECK_SECONDS", 0.05)
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.02
    chat = await _chat(alice)
    owner_client = await adb(logged_in_client)(alice)
    owner = await chat_socket(cookie_of(owner_client), chat.pk)
    watch_client = await adb(logged_in_client)(alice)
    watcher = await chat_socket(cookie_of(watch_client), chat.pk)
    await Session.objects.filter(session_key=cookie_of(watch_client)).adelete()
    await owner.send(action="send", message="long", client_id="c-1")
    assert await watcher.closed_with() == 4401
    await owner.send(action="cancel")
    await owner.close()


async def test_a_last_login_update_rings_nobody(alice, agent):
    """Saving a user for another reason (a login's last_login) closes nothing."""
    chat = await _chat(alice)
    client = await adb(logged_in_client)(alice)
    socket = await chat_socket(cookie_of(client), chat.pk)
    await adb(logged_in_client)(alice)  # a new login elsewhere: last_login saved
    alice.first_name = "Alice"
    await adb(alice.save)()
    assert await socket.comm.receive_nothing(timeout=0.5)
    await socket.close()
