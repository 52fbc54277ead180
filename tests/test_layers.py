"""The lean in-memory channel layer keeps Channels' semantics."""

from __future__ import annotations

import asyncio

import pytest

from chatsite import layers
from chatsite.layers import LeanInMemoryChannelLayer


async def test_a_group_message_reaches_every_member_once():
    layer = LeanInMemoryChannelLayer()
    channels = [await layer.new_channel() for _ in range(3)]
    for channel in channels:
        await layer.group_add("chat.1", channel)
    await layer.group_add("chat.2", channels[0])

    await layer.group_send("chat.1", {"type": "chat.stream", "text": "hi"})

    for channel in channels:
        assert await asyncio.wait_for(layer.receive(channel), 1) == {
            "type": "chat.stream",
            "text": "hi",
        }
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(channels[0]), 0.05)


async def test_each_member_gets_its_own_copy():
    layer = LeanInMemoryChannelLayer()
    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("g", first)
    await layer.group_add("g", second)
    await layer.group_send("g", {"type": "x", "items": [1]})
    (await layer.receive(first))["items"].append(2)
    assert (await layer.receive(second))["items"] == [1]


async def test_a_full_channel_misses_the_message_and_the_others_still_get_it():
    layer = LeanInMemoryChannelLayer(capacity=1)
    full, free = await layer.new_channel(), await layer.new_channel()
    await layer.send(full, {"type": "x", "n": 0})
    await layer.group_add("g", full)
    await layer.group_add("g", free)

    await layer.group_send("g", {"type": "x", "n": 1})

    assert (await layer.receive(free))["n"] == 1
    assert (await layer.receive(full))["n"] == 0


async def test_expired_messages_are_dropped_and_their_channel_leaves_its_groups(monkeypatch):
    monkeypatch.setattr(layers, "CLEAN_EVERY_SECONDS", 0.0)
    layer = LeanInMemoryChannelLayer(expiry=0.05)
    stale, live = await layer.new_channel(), await layer.new_channel()
    await layer.group_add("g", stale)
    await layer.group_send("g", {"type": "x", "n": 1})
    await asyncio.sleep(0.1)
    await layer.group_add("g", live)

    await layer.group_send("g", {"type": "x", "n": 2})

    assert stale not in layer.groups["g"]
    assert (await layer.receive(live))["n"] == 2
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(stale), 0.05)


async def test_discarded_members_get_nothing():
    layer = LeanInMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    await layer.group_discard("g", channel)
    await layer.group_send("g", {"type": "x"})
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(layer.receive(channel), 0.05)
