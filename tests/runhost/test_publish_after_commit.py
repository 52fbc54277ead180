"""Events are published after the commit: no doorbell rings for a row a reader cannot see."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer
from django.db import connections

from chat import actions
from chat.models import ChatSession
from tests.runhost.helpers import (
    adb,
    check_chat,
    display,
    new_chat,
    send,
    settle,
    wait_for_approval,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]


@pytest.mark.persistence
async def test_every_doorbell_rings_after_its_events_are_committed(
    alice, agent, runtime, monkeypatch
):
    layer = get_channel_layer()
    original = layer.group_send
    rung: list[int] = []
    missing: list[int] = []

    def committed_seq(chat_id) -> int:
        # A new thread has its own database connection: it sees committed rows only.
        try:
            return ChatSession.objects.get(pk=chat_id).last_display_seq
        finally:
            connections.close_all()

    async def checking_group_send(group: str, message: dict) -> None:
        if message.get("type") == "chat.events":
            chat_id = group.removeprefix("chat.")
            seq = message["seq"]
            rung.append(seq)
            if await asyncio.to_thread(committed_seq, chat_id) < seq:
                missing.append(seq)
        await original(group, message)

    monkeypatch.setattr(layer, "group_send", checking_group_send)
    chat = await new_chat(alice)
    await send(alice, chat, "calculate 12*7")
    await settle()
    _run_id, approval = await wait_for_approval(alice, chat, "write file notes.md")
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    await settle()

    assert rung and not missing
    assert max(rung) == len(await adb(display)(chat))
    await adb(check_chat)(chat)
