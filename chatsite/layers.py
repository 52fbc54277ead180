"""The in-memory channel layer, without its per-message overheads.

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
import time
from copy import deepcopy

from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

CLEAN_EVERY_SECONDS = 1.0


class LeanInMemoryChannelLayer(InMemoryChannelLayer):
    _last_clean = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._last_clean >= CLEAN_EVERY_SECONDS:
            self._last_clean = now
            super()._clean_expired()

    async def group_send(self, group: str, message: dict) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        expires = time.time() + self.expiry
        for channel in list(self.groups.get(group, ())):
            queue = self.channels.setdefault(
                channel, asyncio.Queue(maxsize=self.get_capacity(channel))
            )
            # As in Channels, a full channel misses the group's message.
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait((expires, deepcopy(message)))


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
