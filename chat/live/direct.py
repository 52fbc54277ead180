"""Consumers that dispatch messages without a trip to the database thread, and (on the
in-memory layer and the live pub/sub one) without a task per message."""

from __future__ import annotations

import asyncio
import contextlib
import math
from typing import Any

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.layers import get_channel_layer
from channels.sessions import InstanceSessionWrapper

from chat.live.layers import LeanInMemoryChannelLayer, PipelinedPubSubChannelLayer


class DirectDispatch:
    """Dispatch each message straight to its handler.

    Channels' ``AsyncConsumer.dispatch`` first hops to the database thread (one per
    process) to close stale connections, for every message. For a chat socket that
    hop came with every stream snapshot, queued behind the process's queries; for the
    run worker it held up every dispatch behind a hundred starting runs. Handlers of
    these consumers reach the database only through ``database_sync_to_async``,
    which closes stale connections itself.

    On the in-memory layer (runs in process) the consumer reads one inbox: the
    layer puts its channel's messages there, and one task puts the client's there
    too. Channels' loop (``await_many_dispatch``) made a task for every message and
    waited on both sources with ``asyncio.wait``: for a page following a stream, that
    was the larger part of a snapshot's way from the layer to its handler.
    """

    channel_layer: Any
    channel_name: str
    scope: Any
    base_send: Any

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Read the layer's queue for this consumer's channel: the in-memory layer's inbox,
        or the queue the live pub/sub layer's subscription puts the channel's messages in
        (as Redis gave them: bytes), with the client's messages pumped in beside them."""
        layer = get_channel_layer(self.channel_layer_alias)  # type: ignore[attr-defined]
        if getattr(self, "_sync", False) or not isinstance(
            layer, (LeanInMemoryChannelLayer, PipelinedPubSubChannelLayer)
        ):
            await super().__call__(scope, receive, send)  # type: ignore[misc]
            return
        self.scope = scope
        self.channel_layer = layer
        self.channel_name = await layer.new_channel()
        self.base_send = send
        if isinstance(layer, PipelinedPubSubChannelLayer):
            inbox = layer.inbox(self.channel_name)
        else:
            inbox = layer.open_inbox(self.channel_name)
        pump = asyncio.ensure_future(_pump(receive, inbox))
        try:
            while True:
                item = await inbox.get()
                if type(item) is bytes:  # from Redis
                    await self.dispatch(layer.deserialize(item))
                    continue
                _expires, message = item
                if isinstance(message, _Failed):
                    raise message.error
                await self.dispatch(message)
        except StopConsumer:
            pass
        finally:
            if isinstance(layer, LeanInMemoryChannelLayer):
                layer.close_inbox(self.channel_name)
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            if isinstance(layer, PipelinedPubSubChannelLayer):  # unsubscribes: a round trip
                await layer.close_inbox(self.channel_name)

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)


def frame_send(send: Any) -> Any:
    """The server's own ``send`` under Channels' session wrappers, for WebSocket frames.

    A wrapper acts only on an HTTP response's start (it saves the session and sets its
    cookie); for a frame it is a coroutine and two lazy-object reads passed through, once
    per stream snapshot per socket.
    """
    wrapper = getattr(send, "__self__", None)
    while isinstance(wrapper, InstanceSessionWrapper) and send == wrapper.send:
        send = wrapper.real_send
        wrapper = getattr(send, "__self__", None)
    return send


class _Failed:
    """The client's side failed: the consumer raises what it raised."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


async def _pump(receive: Any, inbox: asyncio.Queue) -> None:
    """The client's messages into the inbox, in order (they never expire)."""
    try:
        while True:
            inbox.put_nowait((math.inf, await receive()))
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        inbox.put_nowait((math.inf, _Failed(exc)))
