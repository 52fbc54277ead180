"""Edits and regenerations as branches, with real runs of the demo model: what the page
shows, what the model is given, what the log keeps (nothing is rewritten)."""

from __future__ import annotations

import uuid

import pytest
from django.http import Http404

from chat import actions, store
from chat.core import branches, eventlog
from chat.models import ChatEvent, QueuedInput
from chat.presentation import fragments
from chat.presentation.pages import page_of_items
from chat.runhost import transitions
from tests.runhost.helpers import adb, new_chat, send, settle

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state", "runtime", "agent"),
]


def shown(chat) -> list[tuple[str, str]]:
    """(role, text) of the messages on the active path, as the page lists them."""
    return [
        (item.message.role, item.message.content)
        for item in page_of_items(chat.pk).items
        if item.message and item.message.role in ("user", "assistant") and item.message.content
    ]


def switchers(chat) -> list[tuple[str, str]]:
    """(item kind, "2/3") of every item with a switcher on the page."""
    return [
        (item.kind, f"{item.versions.index + 1}/{item.versions.count}")
        for item in page_of_items(chat.pk).items
        if item.versions
    ]


def context(chat) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in store.load_context(chat.pk) if m.role != "tool"]


def whole_log(chat) -> list[tuple[int, str]]:
    rows = ChatEvent.objects.filter(chat_id=chat.pk).order_by("channel", "seq")
    return list(rows.values_list("seq", "kind"))


def sound(chat) -> None:
    """The context a run would load keeps the core's invariants."""
    messages = store.load_context(chat.pk)
    assert eventlog.safe_cut(messages) == len(messages)
    assert not eventlog.load([eventlog.msg_event(m) for m in messages]).repaired


def last_reply_seq(chat) -> int:
    return [i.seq for i in page_of_items(chat.pk).items if i.kind == "assistant_text"][-1]


def user_seqs(chat) -> list[int]:
    return [i.seq for i in page_of_items(chat.pk).items if i.kind == "user"]


async def test_regenerate_makes_a_second_version_in_place(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "hello one")
    await settle()
    first_reply = await adb(last_reply_seq)(chat)
    before = await adb(whole_log)(chat)

    await adb(actions.regenerate)(alice, chat.pk, first_reply)
    await settle()

    messages = await adb(shown)(chat)
    assert [role for role, _ in messages] == ["user", "assistant"]  # in place, not underneath
    assert await adb(last_reply_seq)(chat) != first_reply
    assert await adb(switchers)(chat) == [("assistant_text", "2/2")]
    # The model was given the active path only: the question, not the first answer.
    assert await adb(context)(chat) == messages
    # Nothing was rewritten: the log only grew.
    after = await adb(whole_log)(chat)
    assert set(before) <= set(after)
    await adb(sound)(chat)

    shape = await adb(store.branch_shape)(chat.pk)
    [group] = shape.versions()
    await adb(actions.switch_version)(alice, chat.pk, group.base, 0)
    assert await adb(last_reply_seq)(chat) == first_reply
    assert await adb(switchers)(chat) == [("assistant_text", "1/2")]
    assert await adb(context)(chat) == await adb(shown)(chat)


async def test_editing_an_earlier_message_branches_and_switching_back_restores_it(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "calculate 12*7")  # a tool call and its result in context
    await settle()
    await send(alice, chat, "hello two")
    await settle()
    original = await adb(shown)(chat)
    original_context = await adb(lambda: store.load_context(chat.pk))()
    first = (await adb(user_seqs)(chat))[0]

    sent = await adb(actions.edit_message)(alice, chat.pk, first, "hello edited", "e-1")
    await settle()

    messages = await adb(shown)(chat)
    assert messages[0] == ("user", "hello edited")
    assert [role for role, _ in messages] == ["user", "assistant"]  # later turns not on it
    assert "hello two" not in str(messages)
    assert await adb(switchers)(chat) == [("user", "2/2")]
    assert await adb(context)(chat) == messages
    assert sent.run_id
    await adb(sound)(chat)

    await adb(actions.switch_version)(alice, chat.pk, 0, 0)
    assert await adb(shown)(chat) == original
    assert await adb(switchers)(chat) == [("user", "1/2")]
    assert await adb(lambda: store.load_context(chat.pk))() == original_context
    await adb(sound)(chat)

    # A message sent now continues the version shown.
    await send(alice, chat, "hello three")
    await settle()
    assert [text for _, text in await adb(shown)(chat)][-2] == "hello three"
    assert ("user", "hello two") in await adb(context)(chat)


async def test_retry_retries_the_failed_reply_it_sits_under(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "please fail")
    await settle()
    await send(alice, chat, "hello after")
    await settle()
    error = await adb(
        lambda: [i.seq for i in page_of_items(chat.pk).items if i.kind == "error"][0]
    )()

    await adb(actions.regenerate)(alice, chat.pk, error)
    await settle()

    items = await adb(lambda: [(i.kind, i.seq) for i in page_of_items(chat.pk).items])()
    kinds = [kind for kind, _ in items]
    assert kinds.count("user") == 1 and kinds[-1] == "error"  # retried in its own place
    assert "hello after" not in str(await adb(shown)(chat))
    assert await adb(switchers)(chat) == [("error", "2/2")]


async def test_the_global_regenerate_acts_on_the_newest_reply(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "hello a")
    await settle()
    await send(alice, chat, "hello b")
    await settle()
    await adb(actions.regenerate)(alice, chat.pk)
    await settle()
    assert [text for role, text in await adb(shown)(chat) if role == "user"] == [
        "hello a",
        "hello b",
    ]
    assert await adb(switchers)(chat) == [("assistant_text", "2/2")]


async def test_nothing_branches_while_a_run_is_live(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "hello live")
    await settle()
    reply = await adb(last_reply_seq)(chat)
    await adb(actions.regenerate)(alice, chat.pk, reply)
    await settle()
    live = await adb(transitions.new_run)(chat)  # as if a reply were being written
    with pytest.raises(actions.ActionError) as refused:
        await adb(actions.switch_version)(alice, chat.pk, reply - 1, 0)
    assert refused.value.code == "busy" and "stop it" in refused.value.message
    first = (await adb(user_seqs)(chat))[0]
    with pytest.raises(actions.ActionError):
        await adb(actions.edit_message)(alice, chat.pk, first, "changed", "e-2")
    with pytest.raises(actions.ActionError):
        await adb(actions.regenerate)(alice, chat.pk, None)
    await adb(lambda: type(live).objects.filter(pk=live.pk).update(status="cancelled"))()


async def test_another_user_cannot_edit_regenerate_or_switch(alice, bob):
    chat = await new_chat(alice)
    await send(alice, chat, "hello private")
    await settle()
    reply = await adb(last_reply_seq)(chat)
    first = (await adb(user_seqs)(chat))[0]
    for attempt in (
        lambda: actions.regenerate(bob, chat.pk, reply),
        lambda: actions.edit_message(bob, chat.pk, first, "mine now", "b-1"),
        lambda: actions.switch_version(bob, chat.pk, 0, 0),
    ):
        with pytest.raises(Http404):
            await adb(attempt)()
    shape = await adb(store.branch_shape)(chat.pk)
    assert not shape.branched


async def test_a_message_waiting_on_the_old_branch_is_not_taken_on_the_new_one(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "hello wait")
    await settle()
    first = (await adb(user_seqs)(chat))[0]
    # A message the run never took (a failed start): off the new path, it stays untaken.
    stray = await adb(
        lambda: QueuedInput.objects.create(chat=chat, client_id="stray", content="x", display_seq=0)
    )()
    await adb(actions.edit_message)(alice, chat.pk, first, "hello again", "e-3")
    await settle()
    await adb(stray.refresh_from_db)()
    assert stray.consumed
    assert "x" not in [text for _, text in await adb(context)(chat)]


async def test_a_page_behind_a_change_of_path_gets_the_whole_list(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "hello page")
    await settle()
    seen = await adb(store.last_display_seq)(chat.pk)
    reply = await adb(last_reply_seq)(chat)
    await adb(actions.regenerate)(alice, chat.pk, reply)
    await settle()

    events, html = await adb(fragments.next_batch)(str(chat.pk), seen)
    last = await adb(store.last_display_seq)(chat.pk)
    assert events[-1].seq == last  # the cursor moves past the change
    assert 'id="messages"' in html and 'hx-swap-oob="true"' in html
    assert f'data-seq="{reply}"' not in html  # the first version is not on the path shown
    assert "1/2" not in html and "2/2" in html
    assert f'id="seq-marker" data-seq="{last}"' in html
    # Caught up: the next read is empty, not the whole list again.
    assert await adb(fragments.next_batch)(str(chat.pk), last) == ([], "")


async def test_exports_and_history_follow_the_active_branch(alice, client):
    chat = await new_chat(alice)
    await send(alice, chat, "hello export")
    await settle()
    first = (await adb(user_seqs)(chat))[0]
    await adb(actions.edit_message)(alice, chat.pk, first, "hello branch", uuid.uuid4().hex)
    await settle()
    await adb(client.force_login)(alice)
    body = (await adb(client.get)(f"/chat/{chat.pk}/export.md")).content.decode()
    said = body.split("## You", 1)[1]  # the title is the first message's
    assert "hello branch" in said and "hello export" not in said
    events = await adb(store.display_events_after)(chat.pk, 0)
    assert all(e.kind not in branches.KINDS for e in events)
    assert "hello export" not in str([e.payload for e in events])
