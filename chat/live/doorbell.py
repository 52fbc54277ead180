"""The doorbell: telling a chat's subscribers that something was written.

The rule of the house: **only user actions (``chat.actions``) and the run host
(``chat.runhost``) write events, and they ring only after the commit.** A doorbell
is a hint, never the truth: it may be lost or overtaken, so every subscriber reads
the log from its own ``seq`` when a doorbell does not follow on from what it has.
A doorbell for events just written carries their fragments, rendered once by the
writer, so a subscriber that is up to date pushes them without reading the log.

Groups: ``chat.<id>`` on the live layer (pages, API followers, the teacher's wall)
and ``runctl.<run id>`` on the default layer (cancel requests to a running run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from chat.live.layers import live_layer
from chat.models import ChatEvent
from chat.presentation import fragments
from chat.store import StoredEvent

logger = logging.getLogger(__name__)


def chat_group(chat_id: Any) -> str:
    return f"chat.{chat_id}"


def run_control_group(run_id: Any) -> str:
    return f"runctl.{run_id}"


def ring(chat_id: Any, rows: list[ChatEvent]) -> None:
    """After the commit, tell the chat's subscribers about display events just written."""
    layer = live_layer()
    if layer is None or not rows:
        return
    transaction.on_commit(
        lambda: group_send_soon(layer, chat_group(chat_id), events_doorbell(chat_id, rows))
    )


async def aring(
    chat_id: Any, message: dict[str, Any], keep: tuple[str, bytes, int] | None = None
) -> None:
    """Ring from the event loop (the run host, after its own commit).

    ``keep``: a Redis key, value and time to live to set before the message goes out,
    in the same round trip (on a layer that can; see ``chat.runhost.pushed``).
    """
    layer = live_layer()
    if layer is None:
        return
    try:
        if keep is not None and hasattr(layer, "group_send_keeping"):
            await layer.group_send_keeping(chat_group(chat_id), message, *keep)
        else:
            await layer.group_send(chat_group(chat_id), message)
    except Exception:  # noqa: BLE001 - the log is the truth; subscribers catch up
        logger.warning("doorbell for chat %s failed", chat_id, exc_info=True)


def ring_now(chat_id: Any, make_message: Callable[[], dict[str, Any]]) -> bool:
    """Ring at once, from a callback, when the live layer sends without waiting (the
    in-memory one); False, with nothing made or sent, when only ``aring`` can (Redis)."""
    layer = live_layer()
    send_now = getattr(layer, "group_send_now", None)
    if send_now is None:
        return False
    message = make_message()
    try:
        send_now(chat_group(chat_id), message)
    except Exception:  # noqa: BLE001 - the log is the truth; subscribers catch up
        logger.warning("doorbell for chat %s failed", chat_id, exc_info=True)
    return True


def ring_cancel(run_id: Any) -> None:
    """After the commit, tell the process running ``run_id`` to stop it."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "run.cancel", "run_id": str(run_id)}
    transaction.on_commit(lambda: group_send_soon(layer, run_control_group(run_id), message))


def events_doorbell(chat_id: Any, rows: list[ChatEvent]) -> dict[str, Any]:
    """The doorbell for display events just written, carrying their fragments.

    Rendered here once for every subscriber, where the events are at hand. A
    subscriber that has seen everything before them pushes the fragments as they
    are; any other reads the log from its own ``seq``.
    """
    events = [StoredEvent(row.seq, row.kind, row.payload) for row in rows]
    message: dict[str, Any] = {
        "type": "chat.events",
        "chat_id": str(chat_id),
        "seq": events[-1].seq,
    }
    if events[-1].seq - events[0].seq != len(events) - 1:
        return message  # not one run of seqs: let each subscriber read the log
    try:
        html = fragments.fragments_for_events(events, str(chat_id))
    except Exception:  # noqa: BLE001 - the subscribers render them from the log instead
        logger.warning("fragments for chat %s failed", chat_id, exc_info=True)
        return message
    message.update(
        after=events[0].seq - 1,
        html=html,
        rounds=fragments.written_rounds(events),
        events=[_compact(e) for e in events],
    )
    return message


COMPACT_TEXT = 400  # what a doorbell carries of a message's text (a tile shows less)


def _compact(event: StoredEvent) -> list[Any]:
    """The event's seq, kind and a short payload: enough for a compact view (the
    teacher's wall tiles) to render it without reading the log."""
    p = event.payload
    short: dict[str, Any] = {k: p[k] for k in ("role", "sender_name", "number", "title") if k in p}
    if "content" in p:
        short["content"] = str(p.get("content") or "")[:COMPACT_TEXT]
    extra = p.get("extra") or {}
    if isinstance(extra, dict) and extra.get("teacher"):
        short["extra"] = {"teacher": True}
    return [event.seq, event.kind, short]


# --- sending from a sync thread ---------------------------------------------------------

_sending: set[asyncio.Task] = set()


def group_send_soon(layer, group: str, message: dict[str, Any]) -> None:
    """Send from a sync thread without waiting for the send.

    Run from the database thread (as under ``database_sync_to_async``), the send is
    handed to the event loop that thread works for: waiting for it held the process's
    one database thread until a busy loop came round to it, 30 ms a reply's end with a
    hundred streams. Elsewhere it is sent there and then.
    """
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is None or loop.is_closed() or not loop.is_running():
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:  # noqa: BLE001 - a doorbell may fail; the log is the truth
            logger.warning("sending to %s failed", group, exc_info=True)
        return
    loop.call_soon_threadsafe(_start_sending, layer, group, message)


def _start_sending(layer, group: str, message: dict[str, Any]) -> None:
    task = asyncio.get_running_loop().create_task(layer.group_send(group, message))
    _sending.add(task)
    task.add_done_callback(_sent)


def _sent(task: asyncio.Task) -> None:
    _sending.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.warning("sending failed", exc_info=task.exception())
