"""Channel layers: the in-memory one without its per-message overheads, Redis pub/sub
pipelined, and which of them chat pages listen on.

Channels' ``InMemoryChannelLayer`` scans every channel and group for expired entries on
each ``send``/``receive``/``group_send`` and starts a task per member on ``group_send``.
A chat streams several snapshots a second, each one such a ``group_send`` and a
``receive`` per open socket; with a hundred streams those scans and tasks were a large
share of the process's time. Same semantics: messages expire, full channels drop
messages of a group send, memberships expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from copy import deepcopy
from typing import Any

from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.pubsub import (
    RedisPubSubChannelLayer,
    RedisPubSubLoopLayer,
    RedisSingleShardConnection,
)
from channels_redis.utils import _wrap_close
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

CLEAN_EVERY_SECONDS = 1.0


class LeanInMemoryChannelLayer(InMemoryChannelLayer):
    _last_clean = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Channels read by a consumer's own loop (chat.live.direct): kept while it lives,
        # unbounded (the consumer's client puts there too), the layer's capacity kept
        # by group_send.
        self._inboxes: dict[str, asyncio.Queue] = {}

    def open_inbox(self, channel: str) -> asyncio.Queue:
        inbox = self.channels.get(channel)
        if inbox is None or inbox.maxsize:
            pending = [] if inbox is None else list(inbox._queue)  # type: ignore[attr-defined]
            inbox = asyncio.Queue()
            for item in pending:
                inbox.put_nowait(item)
        self.channels[channel] = self._inboxes[channel] = inbox
        return inbox

    def close_inbox(self, channel: str) -> None:
        self._inboxes.pop(channel, None)
        self.channels.pop(channel, None)

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._last_clean >= CLEAN_EVERY_SECONDS:
            self._last_clean = now
            super()._clean_expired()
            self.channels.update(self._inboxes)  # an emptied inbox is still read

    async def group_send(self, group: str, message: dict) -> None:
        self.group_send_now(group, message)

    def group_send_now(self, group: str, message: dict) -> None:
        """``group_send`` without a coroutine: it never waits (a stream's push calls it
        from a callback, with no task made for it; see ``chat.live.doorbell.ring_now``)."""
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        expires = time.time() + self.expiry
        for channel in list(self.groups.get(group, ())):
            queue = self.channels.get(channel)
            if queue is None:  # (not made for every member: setdefault would)
                queue = self.channels[channel] = asyncio.Queue(maxsize=self.get_capacity(channel))
            elif not queue.maxsize and queue.qsize() >= self.get_capacity(channel):
                continue  # a full inbox, as a full channel, misses the group's message
            # As in Channels, a full channel misses the group's message.
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait((expires, copy_message(message)))


# Values a message may share with its copy: immutable, so no receiver can change them.
_SHARED = frozenset({str, int, float, bool, bytes, type(None)})


def copy_message(message: dict) -> dict:
    """What ``deepcopy(message)`` gives (Channels copies each message per member), made
    cheaply for the common message: strings and numbers, lists of them (a stream snapshot
    is one per push, per socket; deep copies were half the layer's time there). Anything
    else is deep-copied."""
    copy = {}
    for key, value in message.items():
        kind = type(value)
        if kind in _SHARED and type(key) is str:
            copy[key] = value
        elif kind is list and all(type(item) in _SHARED for item in value):
            copy[key] = list(value)
        else:
            return deepcopy(message)
    return copy


# --- Redis pub/sub, pipelined ----------------------------------------------------------------


class PipelinedPubSubChannelLayer(RedisPubSubChannelLayer):
    """channels_redis's pub/sub layer, sending the publishes of one moment in one round trip.

    It relies on private parts of ``channels_redis.pubsub`` (``_layers``, ``_shards``,
    ``_lock``, ``_ensure_redis``, ``_redis``), so pyproject.toml pins channels-redis
    exactly; check this class before moving the pin.

    Its publishes go one at a time, each waiting for Redis's answer, and each answer
    waits for the event loop to come round. A worker streaming a hundred replies
    publishes a thousand snapshots a second: while a burst of replies started, a
    publish waited 70 to 180 ms in that queue (bench_streams) with the loop itself
    never more than 20 ms behind. Here the publishes of one moment go as one pipeline,
    in order, with up to ``PIPELINES_IN_FLIGHT`` round trips out at once; what is
    published while all are out goes in the next.
    """

    async def group_send_keeping(
        self, group: str, message: dict, key: str, value: bytes, ttl: int
    ) -> None:
        """``group_send``, with ``key`` set to ``value`` in the same round trip, before the
        publish: whoever received the message can count on the value being in Redis."""
        layer = self._get_layer()
        group_channel = layer._get_group_channel_name(group)
        shard = layer._get_shard(group_channel)
        shard.enqueue("SET", key, value, "EX", ttl)
        await shard.publish(group_channel, self.serialize(message))

    def inbox(self, channel: str) -> asyncio.Queue:
        """The queue the subscription puts ``channel``'s messages in (serialized), for a
        consumer that reads it itself (``chat.live.direct``); made by ``new_channel``."""
        return self._get_layer().channels[channel]

    async def close_inbox(self, channel: str) -> None:
        """The consumer of ``channel`` is gone: forget it and unsubscribe, as a
        cancelled ``receive`` does."""
        layer = self._get_layer()
        if layer.channels.pop(channel, None) is not None:
            try:
                await layer._get_shard(channel).unsubscribe(channel)
            except Exception:  # noqa: BLE001 - as channels_redis: the consumer ends anyway
                logger.exception("Unexpected exception while cleaning-up channel:")

    def forget_soon(self, key: str) -> None:
        """Delete ``key`` once every round trip already enqueued or out is answered (a
        failure is only logged by Redis's absence: the key expires)."""
        self._get_layer()._get_shard(key).enqueue_after_out("DEL", key)

    def _get_layer(self) -> RedisPubSubLoopLayer:
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = _PipelinedLoopLayer(
                *self._args, **self._kwargs, channel_layer=self
            )
            _wrap_close(self, loop)
        return layer


class _PipelinedLoopLayer(RedisPubSubLoopLayer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shards = [_PipelinedShard(shard.host, self) for shard in self._shards]


# Round trips of publishes out at once, each on a connection of its own. One at a time,
# a publish waited for the round trip before its own, and a round trip takes a few turns
# of a busy event loop (a worker streaming 200 replies: 350-480 ms from the render to
# Redis's answer). Each run awaits its publish before its next, so its snapshots stay
# in order; doorbells are hints, whose order subscribers do not rely on.
PIPELINES_IN_FLIGHT = 4


class _PipelinedShard(RedisSingleShardConnection):
    def __init__(self, host: dict, channel_layer: RedisPubSubLoopLayer) -> None:
        super().__init__(host, channel_layer)
        # Commands of the next round trip, each as Redis's arguments ("SET", key, ...).
        self._batch: list[tuple[Any, ...]] = []
        self._batch_sent: asyncio.Future[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._in_flight = asyncio.Semaphore(PIPELINES_IN_FLIGHT)
        # Round trips enqueued or out, not yet answered; and the tasks that wait for them.
        self._unanswered: set[asyncio.Future[None]] = set()
        self._waiting: set[asyncio.Task[None]] = set()
        # Connections of this shard's round trips, between them (see _round_trip).
        self._idle: list[Any] = []

    async def flush(self) -> None:
        self._idle.clear()  # closed with the pool
        await super().flush()

    async def publish(self, channel: str, message: bytes) -> None:
        self.enqueue("PUBLISH", channel, message)
        await self.flushed()

    def enqueue(self, *command: Any) -> None:
        """Put a command (Redis's name, its arguments) in the next round trip, in order
        with the publishes."""
        if self._batch_sent is None:
            loop = asyncio.get_running_loop()
            self._batch_sent = loop.create_future()
            self._batch_sent.add_done_callback(_retrieve)
            self._unanswered.add(self._batch_sent)
            self._batch_sent.add_done_callback(self._unanswered.discard)
            self._sender = loop.create_task(self._send_batch())
        self._batch.append(command)

    def enqueue_after_out(self, *command: Any) -> None:
        """Put a command in a round trip that leaves after every one enqueued or out now.

        Round trips on different connections may reach Redis in any order: a run's last
        snapshot (which sets its pushed copy) can still be out when the run ends, and the
        copy's delete must not overtake it.
        """
        earlier = list(self._unanswered)
        if not earlier:
            self.enqueue(*command)
            return

        async def after_them() -> None:
            await asyncio.wait(earlier)
            self.enqueue(*command)

        task = asyncio.get_running_loop().create_task(after_them())
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def flushed(self) -> None:
        """Wait for the round trip carrying what is enqueued so far."""
        if self._batch_sent is not None:
            # Shielded: one caller given up on must not cancel the others' batch.
            await asyncio.shield(self._batch_sent)

    async def _send_batch(self) -> None:
        async with self._in_flight:  # a connection is free for this round trip
            batch, sent = self._batch, self._batch_sent
            self._batch, self._batch_sent = [], None
            try:
                self._ensure_redis()
                await self._round_trip(batch)
            except BaseException as exc:
                if isinstance(exc, asyncio.CancelledError):
                    sent.cancel()
                    raise
                sent.set_exception(exc)
            else:
                sent.set_result(None)

    async def _round_trip(self, commands: list[tuple[Any, ...]]) -> None:
        """Send ``commands`` in one write on a connection of the shard's own and read
        their replies (each a line: ``+OK``, an integer, or an error).

        redis-py's pipeline took a connection from the pool and gave it back each time
        (a lock, and a read to see the connection had nothing left over), and ran each
        reply through its callbacks, its retry wrapper, its metrics and a timeout of its
        own: with the write, a sixth of a worker's event loop streaming 100 replies
        (cProfile, bench/README). Here the connections stay the shard's between round
        trips (one per round trip out at once), and one timeout covers the round trip.
        As redis-py's did (the hosts' ``retry_on_error``), a round trip that finds its
        connection gone is made again once, on a new one.
        """
        pool = self._redis.connection_pool
        for attempt in (1, 2):
            connection = self._idle.pop() if self._idle else await pool.get_connection()
            error: ResponseError | None = None
            try:
                async with asyncio.timeout(connection.socket_timeout):
                    packed = _pack(commands, connection.encoder)
                    await connection.send_packed_command(packed, check_health=False)
                    for _ in commands:
                        try:
                            await connection.read_response(timeout=math.inf)
                        except ResponseError as exc:  # the others' replies are still read
                            error = error or exc
            except (RedisConnectionError, RedisTimeoutError, OSError):
                await _discard(pool, connection)
                if attempt == 2:
                    raise
                continue
            except BaseException:
                await _discard(pool, connection)  # replies may be left unread on it
                raise
            self._idle.append(connection)
            if error is not None:
                raise error
            return


def _pack(commands: list[tuple[Any, ...]], encoder: Any) -> list[bytes]:
    """Commands in Redis's protocol, as pieces of one write (what redis-py's
    ``pack_commands`` writes). Its packer was a fifth of the round trip's time; here a
    snapshot's arguments (str keys and channels, bytes values, an int TTL) take the
    short ways, anything else redis-py's encoder."""
    out: list[bytes] = []
    for command in commands:
        out.append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = type(arg)
            if kind is bytes:
                data = arg
            elif kind is str:
                data = arg.encode(encoder.encoding, encoder.encoding_errors)
            elif kind is int:
                data = b"%d" % arg
            else:
                data = encoder.encode(arg)
            out += (b"$%d\r\n" % len(data), data, b"\r\n")
    return out


async def _discard(pool: Any, connection: Any) -> None:
    with contextlib.suppress(Exception):
        await connection.disconnect(nowait=True)
    await pool.release(connection)


def _retrieve(future: asyncio.Future) -> None:
    # The callers see the failure; none may be left waiting, and that is not an error.
    if not future.cancelled():
        future.exception()


# --- the layer chat pages listen on --------------------------------------------------------

LIVE_LAYER = "live"


def live_layer_alias() -> str:
    """The alias of the layer carrying chat doorbells and stream snapshots.

    With Redis that is a pub/sub layer of its own (see settings): a socket's process
    gets every message of its chats pushed down one subscription, where the default
    layer costs a blocking pop per message. Without it, the default layer.
    """
    return LIVE_LAYER if LIVE_LAYER in settings.CHANNEL_LAYERS else DEFAULT_CHANNEL_LAYER


def live_layer():
    return get_channel_layer(live_layer_alias())
