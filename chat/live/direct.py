"""Consumers that dispatch messages without a trip to the database thread."""

from __future__ import annotations

from typing import Any

from channels.consumer import get_handler_name


class DirectDispatch:
    """Dispatch each message straight to its handler.

    Channels' ``AsyncConsumer.dispatch`` first hops to the database thread (one per
    process) to close stale connections, for every message. For a chat socket that
    hop came with every stream snapshot, queued behind the process's queries; for the
    run worker it held up every dispatch behind a hundred starting runs. Handlers of
    these consumers reach the database only through ``database_sync_to_async``,
    which closes stale connections itself.
    """

    async def dispatch(self, message: dict[str, Any]) -> None:
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)
