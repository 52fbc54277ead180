"""The lean in-memory channel layer keeps Channels' semantics; the pipelined pub/sub layer
keeps every send and its order."""

from __future__ import annotations

import asyncio
import uuid
from copy import deepcopy

import pytest
from channels.consumer import AsyncConsumer
from channels.exceptions import StopConsumer
from channels.layers import channel_layers
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from chat.live import doorbell, layers
from chat.live.direct import DirectDispatch
from chat.live.layers import (
    LeanInMemoryChannelLayer,
    PipelinedPubSubChannelLayer,
    _PipelinedShard,
)


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


async def test_a_message_sent_is_the_senders_no_more():
    layer = LeanInMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    speakers = ["Ada"]
    nested = {"events": [{"seq": 1}]}
    message = {"type": "x", "text": "hi", "round": 2, "speakers": speakers}
    await layer.group_send("g", message)
    await layer.group_send("g", {"type": "y", **nested})
    message["text"] = "changed"
    speakers.append("Maya")
    nested["events"][0]["seq"] = 9

    assert await layer.receive(channel) == {
        "type": "x",
        "text": "hi",
        "round": 2,
        "speakers": ["Ada"],
    }
    assert await layer.receive(channel) == {"type": "y", "events": [{"seq": 1}]}


@pytest.mark.parametrize(
    "message",
    [
        {"type": "chat.stream", "text": "a", "round": 1, "at": 1.5, "none": None, "b": b"x"},
        {"type": "x", "speakers": ["Ada", "Maya"], "tags": []},
        {"type": "x", "events": [{"seq": 1, "kind": "msg"}], "pair": (1, [2])},
        {"type": "x", "nested": [["a"]]},
    ],
)
def test_a_copied_message_equals_its_deep_copy_and_shares_nothing_mutable(message):
    copy = layers.copy_message(message)
    assert copy == deepcopy(message) and copy is not message
    for key, value in message.items():
        if isinstance(value, (list, dict, tuple)):
            assert copy[key] is not value or value == ()


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


class _Recorder(DirectDispatch, AsyncConsumer):
    """A consumer on the in-memory layer that notes what it handles, in order."""

    channel_layer_alias = "default"
    seen: list

    async def chat_stream(self, message):
        self.seen.append(("layer", message["n"]))

    async def client_frame(self, message):
        self.seen.append(("client", message["n"]))
        if message["n"] == "stop":
            raise StopConsumer


async def test_a_consumer_reads_the_layer_and_its_client_in_order_from_one_inbox(monkeypatch):
    monkeypatch.setattr(layers, "CLEAN_EVERY_SECONDS", 0.0)
    channel_layers.backends.pop("default", None)
    consumer = _Recorder()
    consumer.seen = []
    client: asyncio.Queue = asyncio.Queue()
    running = asyncio.ensure_future(consumer({"type": "test"}, client.get, None))
    while not hasattr(consumer, "channel_name"):
        await asyncio.sleep(0)
    layer = consumer.channel_layer
    await layer.group_add("g", consumer.channel_name)

    await layer.group_send("g", {"type": "chat.stream", "n": 1})
    await client.put({"type": "client.frame", "n": 2})
    await asyncio.sleep(0.01)
    layer._clean_expired()  # an emptied inbox stays the channel's
    await layer.group_send("g", {"type": "chat.stream", "n": 3})
    await client.put({"type": "client.frame", "n": "stop"})
    await asyncio.wait_for(running, 1)

    assert consumer.seen == [("layer", 1), ("client", 2), ("layer", 3), ("client", "stop")]
    assert consumer.channel_name not in layer.channels  # gone with its consumer


async def test_a_full_inbox_misses_the_group_message():
    layer = LeanInMemoryChannelLayer(capacity=2)
    channel = await layer.new_channel()
    inbox = layer.open_inbox(channel)
    await layer.group_add("g", channel)
    for n in range(3):
        await layer.group_send("g", {"type": "x", "n": n})
    assert [inbox.get_nowait()[1]["n"] for _ in range(inbox.qsize())] == [0, 1]


# --- Redis pub/sub, pipelined ----------------------------------------------------------------

REDIS_URL = "redis://127.0.0.1:6379"


@pytest.fixture
async def pubsub_pair():
    """Two pipelined pub/sub layers on one prefix: as a worker and a web process see it."""
    prefix = f"lyceum-test-{uuid.uuid4().hex[:12]}"
    made = [
        PipelinedPubSubChannelLayer(hosts=[{"address": REDIS_URL}], prefix=prefix) for _ in range(2)
    ]
    yield made
    for layer in made:
        await layer.flush()


async def _receive_all(layer, channel: str, count: int) -> list[dict]:
    return [await asyncio.wait_for(layer.receive(channel), 5) for _ in range(count)]


async def test_publishes_of_one_moment_go_in_one_round_trip_in_order(pubsub_pair, monkeypatch):
    sender, receiver = pubsub_pair
    channels = [await receiver.new_channel() for _ in range(3)]
    for index, channel in enumerate(channels):
        await receiver.group_add(f"chat.{index}", channel)
    executed: list[int] = []
    original = _PipelinedShard._round_trip

    async def counting(self, commands):
        executed.append(len(commands))
        return await original(self, commands)

    monkeypatch.setattr(_PipelinedShard, "_round_trip", counting)

    await asyncio.gather(
        *(sender.group_send(f"chat.{n % 3}", {"type": "x", "n": n}) for n in range(60))
    )

    assert executed == [60]  # every send awaited its own publish, and they went together
    for index, channel in enumerate(channels):
        got = await _receive_all(receiver, channel, 20)
        assert [m["n"] for m in got] == list(range(index, 60, 3))  # in the order sent


async def test_what_is_published_during_a_round_trip_goes_in_the_next(pubsub_pair, monkeypatch):
    """With every connection out (here the limit is one), publishes wait for the next."""
    monkeypatch.setattr(layers, "PIPELINES_IN_FLIGHT", 1)
    sender, receiver = pubsub_pair
    channel = await receiver.new_channel()
    await receiver.group_add("chat.1", channel)
    await sender.group_send("chat.1", {"type": "x", "n": -1})  # connected
    executed: list[int] = []
    original = _PipelinedShard._round_trip

    async def slow(self, commands):
        executed.append(len(commands))
        await asyncio.sleep(0.05)  # a slow round trip
        return await original(self, commands)

    monkeypatch.setattr(_PipelinedShard, "_round_trip", slow)

    async def later(n: int) -> None:
        await asyncio.sleep(0.01 * (n // 10))  # while the first round trip is out
        await sender.group_send("chat.1", {"type": "x", "n": n})

    await asyncio.gather(*(later(n) for n in range(40)))

    assert executed[0] == 10 and sum(executed) == 40 and len(executed) == 2
    got = await _receive_all(receiver, channel, 41)
    assert [m["n"] for m in got] == list(range(-1, 40))


async def test_round_trips_go_out_side_by_side_up_to_the_limit(pubsub_pair, monkeypatch):
    """A publish does not wait for a round trip already out while a connection is free;
    one that awaits each send before the next (a run's snapshots) keeps its order."""
    sender, receiver = pubsub_pair
    channels = [await receiver.new_channel() for _ in range(6)]
    for index, channel in enumerate(channels):
        await receiver.group_add(f"chat.{index}", channel)
    await sender.group_send("chat.0", {"type": "x", "n": -1})  # connected
    out, most = 0, 0
    original = _PipelinedShard._round_trip

    async def slow(self, commands):
        nonlocal out, most
        out += 1
        most = max(most, out)
        try:
            await asyncio.sleep(0.1)  # a slow round trip
            return await original(self, commands)
        finally:
            out -= 1

    monkeypatch.setattr(_PipelinedShard, "_round_trip", slow)

    async def one_run(index: int) -> None:  # a run: each snapshot awaited before the next
        await asyncio.sleep(0.01 * index)
        for n in range(3):
            await sender.group_send(f"chat.{index}", {"type": "x", "n": n})

    await asyncio.gather(*(one_run(index) for index in range(6)))

    assert most == layers.PIPELINES_IN_FLIGHT  # side by side, never more
    assert [m["n"] for m in await _receive_all(receiver, channels[0], 4)] == [-1, 0, 1, 2]
    for channel in channels[1:]:
        assert [m["n"] for m in await _receive_all(receiver, channel, 3)] == [0, 1, 2]


async def test_a_key_forgotten_while_its_set_is_out_is_deleted_after_the_set(
    pubsub_pair, monkeypatch
):
    """A run's last snapshot (setting its pushed copy) can still be out on one connection
    when the run ends: the copy's delete, on another, must not reach Redis first."""
    sender, receiver = pubsub_pair
    channel = await receiver.new_channel()
    await receiver.group_add("chat.1", channel)
    await sender.group_send("chat.1", {"type": "x", "n": -1})  # connected
    key = f"lyceum-test-pushed-{uuid.uuid4().hex[:12]}"
    original = _PipelinedShard._round_trip

    async def slow_sets(self, commands):
        if any(command[0] == "SET" for command in commands):
            await asyncio.sleep(0.2)  # the snapshot's round trip is slow
        return await original(self, commands)

    monkeypatch.setattr(_PipelinedShard, "_round_trip", slow_sets)
    snapshot = asyncio.ensure_future(
        sender.group_send_keeping("chat.1", {"type": "x", "n": 0}, key, b"copy", 30)
    )
    await asyncio.sleep(0.05)  # its round trip is out
    sender.forget_soon(key)
    await snapshot

    redis = Redis.from_url(REDIS_URL)
    try:
        for _ in range(100):  # the delete follows the set's answer
            if not await redis.exists(key):
                break
            await asyncio.sleep(0.02)
        assert not await redis.exists(key)
    finally:
        await redis.delete(key)
        await redis.aclose()


async def test_a_failed_round_trip_fails_each_of_its_sends_and_the_next_one_works(
    pubsub_pair, monkeypatch
):
    sender, receiver = pubsub_pair
    channel = await receiver.new_channel()
    await receiver.group_add("chat.1", channel)
    original = _PipelinedShard._round_trip
    failures = [RedisConnectionError("gone")]

    async def failing_once(self, commands):
        if failures:
            raise failures.pop()
        return await original(self, commands)

    monkeypatch.setattr(_PipelinedShard, "_round_trip", failing_once)
    results = await asyncio.gather(
        *(sender.group_send("chat.1", {"type": "x", "n": n}) for n in range(3)),
        return_exceptions=True,
    )
    assert [type(r) for r in results] == [RedisConnectionError] * 3

    await sender.group_send("chat.1", {"type": "x", "n": 99})
    assert (await asyncio.wait_for(receiver.receive(channel), 5))["n"] == 99


async def test_a_consumer_reads_its_subscription_and_its_client_from_one_queue(
    pubsub_pair, monkeypatch
):
    """On the live pub/sub layer too, without a task per message: what Redis gave and
    what the client sent are handled in the order they came, and the consumer's channel
    is unsubscribed when it leaves."""
    sender, receiver = pubsub_pair
    monkeypatch.setattr(channel_layers, "backends", {"default": receiver})
    consumer = _Recorder()
    consumer.seen = []
    client: asyncio.Queue = asyncio.Queue()
    running = asyncio.ensure_future(consumer({"type": "test"}, client.get, None))
    while not hasattr(consumer, "channel_name"):
        await asyncio.sleep(0)
    await receiver.group_add("chat.1", consumer.channel_name)
    shard = receiver._get_layer()._get_shard(consumer.channel_name)
    assert consumer.channel_name in shard._subscribed_to

    async def arrived(count: int) -> None:
        while len(consumer.seen) < count:
            await asyncio.sleep(0.01)

    await sender.group_send("chat.1", {"type": "chat.stream", "n": 1})
    await asyncio.wait_for(arrived(1), 5)
    await client.put({"type": "client.frame", "n": 2})
    await sender.group_send("chat.1", {"type": "chat.stream", "n": 3})
    await asyncio.wait_for(arrived(3), 5)
    await client.put({"type": "client.frame", "n": "stop"})
    await asyncio.wait_for(running, 5)

    assert consumer.seen == [("layer", 1), ("client", 2), ("layer", 3), ("client", "stop")]
    assert consumer.channel_name not in receiver._get_layer().channels  # gone with it
    assert consumer.channel_name not in shard._subscribed_to


def test_the_round_trip_writes_what_redis_py_would():
    from redis.asyncio.connection import Connection

    connection = Connection()
    commands = [
        ("SET", "lyceum:pushed:1", "é".encode() + b"\x00" * 7000, "EX", 3600),
        ("PUBLISH", "lyceum__group__chat.1", b"\x81\xa4type"),
        ("DEL", "lyceum:pushed:ü"),
        ("SET", "k", 1.5),
    ]
    ours = b"".join(layers._pack(commands, connection.encoder))
    assert ours == b"".join(connection.pack_commands(commands))


# --- sending from the database thread ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_send_from_the_database_thread_does_not_hold_that_thread():
    from channels.db import database_sync_to_async

    layer = LeanInMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("chat.1", channel)
    original = layer.group_send
    release = asyncio.Event()

    async def slow_group_send(group: str, message: dict) -> None:
        await release.wait()  # a busy layer
        await original(group, message)

    layer.group_send = slow_group_send

    def job() -> str:  # as a run's database job rings after its commit
        doorbell.group_send_soon(layer, "chat.1", {"type": "chat.events", "seq": 7})
        return "done"

    assert await asyncio.wait_for(database_sync_to_async(job)(), 2) == "done"
    release.set()
    assert await asyncio.wait_for(layer.receive(channel), 2) == {"type": "chat.events", "seq": 7}


def test_a_send_from_plain_sync_code_is_made_there_and_then():
    layer = LeanInMemoryChannelLayer()
    sent: list[dict] = []

    async def group_send(group: str, message: dict) -> None:
        sent.append(message)

    layer.group_send = group_send
    doorbell.group_send_soon(layer, "chat.1", {"type": "x"})
    assert sent == [{"type": "x"}]
