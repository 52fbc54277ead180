"""One socket's view of one chat: what it has seen, and what to push next.

A :class:`ChatSubscription` holds the push state of a chat followed live: the
resync cursor (the last display ``seq`` sent), the stream rounds already written
(late snapshots of them are dropped), the quiet check (a read of the log when the
chat goes quiet, and again now and then while a run is live, in case the doorbell of
its end was lost) and the periodic
access re-check. A socket may hold many (the teacher's wall follows every chat of
a class); each keeps the same guarantees: no gap, no duplicate, access re-checked.

The subscription decides; the socket sends. It reads the log through
``chat.presentation.fragments.next_batch`` and sends through the ``send`` callable
it was given.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async

from chat import store
from chat.models import Run
from chat.presentation import fragments
from chat.runhost import executor, transitions

logger = logging.getLogger(__name__)

# When stream snapshots stop for this long, read the log once (see _arm_quiet_check).
QUIET_CHECK_SECONDS = 2.0
# While the chat's run is live and quiet, read the log again this often: the run may end
# where no snapshot or doorbell comes from (its worker killed, then recovered by a sweeper
# whose doorbell a Redis restart lost), and the page must still learn that it ended.
LIVE_CHECK_SECONDS = 5.0
# A page that only watches makes no actions to check: its view access is checked again
# before a push once this long has passed since the last check (one query, not one a push).
ACCESS_RECHECK_SECONDS = 10.0

Send = Callable[[str], Awaitable[None]]
CheckAccess = Callable[[], Awaitable[bool]]
OnAccessLost = Callable[[], Awaitable[None]]
# How a subscription renders (the chat page's fragments unless told otherwise): the next
# batch of the log after a seq, a stream snapshot, and the reply written so far.
NextBatch = Callable[[str, int], tuple[list[Any], str]]
StreamHtml = Callable[[dict[str, Any]], str]
PartialHtml = Callable[[str, Run], str]
# Renders the compact events a doorbell carries (``[seq, kind, short payload]``).
EventsHtml = Callable[[str, list[Any]], str]


class ChatSubscription:
    def __init__(
        self,
        chat_id: str,
        *,
        send: Send,
        may_view: CheckAccess,
        on_access_lost: OnAccessLost,
        clock: Callable[[], float] | None = None,
        next_batch: NextBatch | None = None,
        stream_html: StreamHtml | None = None,
        partial_html: PartialHtml | None = None,
        events_html: EventsHtml | None = None,
    ) -> None:
        """``next_batch``, ``stream_html`` and ``partial_html`` render for another kind
        of page (the teacher's wall renders compact tiles); given ``next_batch``, the
        doorbell's own fragments (the chat page's) are never pushed: the log is read."""
        self.chat_id = chat_id
        self._next_batch = next_batch  # None: fragments.next_batch, looked up at each read
        self._doorbell_html = next_batch is None
        self._stream_html = stream_html or (lambda event: event["html"])
        self._partial_html = partial_html
        self._events_html = events_html
        self.last_seq: int | None = None  # None until the page says where it is (resync)
        self.flushed_round: dict[str, int] = {}
        self._send = send
        self._may_view = may_view
        self._on_access_lost = on_access_lost
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._reading = False
        self._read_again = False
        self._quiet_check: asyncio.TimerHandle | None = None
        self._quiet_task: asyncio.Task | None = None
        self._last_snapshot_at = 0.0
        self._access_checked_at = self._clock()
        self.access_lost = False

    def close(self) -> None:
        if self._quiet_check is not None:
            self._quiet_check.cancel()
        if self._quiet_task is not None:
            self._quiet_task.cancel()

    # --- what the page says --------------------------------------------------------------

    async def resync(self, last_seq: int) -> None:
        """The page has everything up to ``last_seq``: send the rest and the live reply."""
        self.last_seq = max(0, last_seq)
        await self.push_new_events()
        await self.push_current_partial()

    def expect_activity(self) -> None:
        """The page just did something that writes (a send, an approval): read the log
        once the chat goes quiet, and on while a run is live, whatever the doorbells do
        (a subscription lost with a Redis restart hears none)."""
        self._arm_quiet_check()

    # --- what the doorbell says ----------------------------------------------------------

    async def on_events(self, event: dict[str, Any]) -> None:
        """Doorbell: display events up to ``seq`` were written (see live.doorbell)."""
        seq = int(event.get("seq", 0))
        if self.last_seq is None or seq <= self.last_seq:
            return
        if not await self.may_still_watch():
            return
        self._arm_quiet_check()  # the doorbell of what follows may be lost
        if (
            self._doorbell_html
            and event.get("after") == self.last_seq
            and "html" in event
            and not self._reading
        ):
            # The very next events, rendered by the writer: no trip to the database.
            self._note_written_rounds(event.get("rounds") or [])
            self.last_seq = seq
            await self._send(event["html"])
            return
        if (
            self._events_html is not None
            and event.get("after") == self.last_seq
            and "events" in event
            and not self._reading
        ):
            # Up to date: render the doorbell's own compact events, no read of the log.
            self._note_written_rounds(event.get("rounds") or [])
            self.last_seq = seq
            html = self._events_html(self.chat_id, event["events"])
            if html:
                await self._send(html)
            return
        await self.push_new_events()

    async def on_stream(self, event: dict[str, Any]) -> None:
        """A snapshot of the reply being streamed."""
        if self.last_seq is None or not await self.may_still_watch():
            return
        html = self.stream_fragment(event)
        if html:
            await self._send(html)

    def stream_fragment(self, event: dict[str, Any]) -> str:
        """The fragment of a snapshot, or "" for a reply written already (a socket that
        coalesces snapshots calls this when it sends, with the newest one it kept)."""
        if self.last_seq is None or self.access_lost:
            return ""
        run_id = str(event.get("run_id"))
        if int(event.get("round", 0)) <= self.flushed_round.get(run_id, -1):
            return ""  # that reply was written already
        self._arm_quiet_check()
        return self._stream_html(event)

    # --- access ----------------------------------------------------------------------------

    async def may_still_watch(self) -> bool:
        """Whether pushes may go on: access can be taken away while the socket is open.

        Checked again at most every ``ACCESS_RECHECK_SECONDS``; once lost, nothing
        more is pushed and the owner is told.
        """
        if self.access_lost:
            return False
        now = self._clock()
        if now - self._access_checked_at < ACCESS_RECHECK_SECONDS:
            return True
        self._access_checked_at = now
        if await self._may_view():
            return True
        self.access_lost = True
        self.close()
        await self._on_access_lost()
        return False

    # --- reading the log ---------------------------------------------------------------------

    def _note_written_rounds(self, rounds: list[tuple[str, int]]) -> None:
        for run_id, round_ in rounds:
            self.flushed_round[run_id] = max(self.flushed_round.get(run_id, -1), round_)

    async def push_new_events(self) -> None:
        # One reader at a time: a doorbell (or the quiet check) arriving while the log is
        # being read asks for one more read afterwards; a burst of doorbells costs two
        # reads, not one each, and no two readers send the same events.
        if self._reading:
            self._read_again = True
            return
        self._reading = True
        try:
            self._read_again = True
            while self._read_again:
                self._read_again = False
                await self._push_events_after_last_seq()
        finally:
            self._reading = False

    async def _push_events_after_last_seq(self) -> None:
        next_batch = database_sync_to_async(self._next_batch or fragments.next_batch)
        while self.last_seq is not None:
            events, html = await next_batch(self.chat_id, self.last_seq)
            if not events:
                return
            self._note_written_rounds(fragments.written_rounds(events))
            self.last_seq = events[-1].seq
            await self._send(html)
            if len(events) < fragments.REPLAY_BATCH:
                return

    async def push_current_partial(self) -> None:
        """A page (re)connecting during a run gets the reply written so far."""
        run = await database_sync_to_async(_live_run)(self.chat_id)
        if run is None:
            return
        self._arm_quiet_check()  # a run whose process died streams nothing more
        if self._partial_html is not None:
            await self._send(self._partial_html(self.chat_id, run))
            return
        if run.status == run.Status.WAITING:
            # Nothing is being written while the run waits for the user's approval:
            # an empty slot, not a typing indicator (as the live page shows it).
            await self._send(fragments.idle_stream_slot() + fragments.controls(True, self.chat_id))
            return
        text, reasoning = executor.local_partial(str(run.pk)) or (
            run.partial_text,
            run.partial_reasoning,
        )
        await self._send(
            fragments.partial_stream_slot(str(run.pk), text, reasoning, run.speakers)
            + fragments.controls(True, self.chat_id)
        )

    # --- the quiet check -----------------------------------------------------------------------

    def _arm_quiet_check(self) -> None:
        """Read the log once the chat has gone quiet for a while, and again every
        ``LIVE_CHECK_SECONDS`` while a run is live.

        The doorbell may be dropped under load (a full channel) or with a Redis restart,
        and when the one that announces the written reply or the run's end is lost, no
        later frame reveals the gap: the page would show the run going on until
        reloaded. Costs two queries once a chat goes quiet, and two every
        ``LIVE_CHECK_SECONDS`` while its run is live and quiet (waiting for an approval).
        """
        loop = asyncio.get_running_loop()
        self._last_snapshot_at = loop.time()
        if self._quiet_check is None:  # one timer per stream, not one per snapshot
            self._quiet_check = loop.call_later(QUIET_CHECK_SECONDS, self._start_quiet_check)

    def _start_quiet_check(self) -> None:
        loop = asyncio.get_running_loop()
        quiet_for = loop.time() - self._last_snapshot_at
        if quiet_for < QUIET_CHECK_SECONDS:
            remaining = QUIET_CHECK_SECONDS - quiet_for
            self._quiet_check = loop.call_later(remaining, self._start_quiet_check)
            return
        self._quiet_check = None
        self._quiet_task = loop.create_task(self._quiet_push())

    async def _quiet_push(self) -> None:
        try:
            if not await self.may_still_watch():
                return
            # One trip and two small fixed statements; the log is read only when it has
            # something new (a hundred pages waiting for their runs to start asked the
            # database thread for a read and a look each, every few seconds, while it had
            # the sends to store).
            seq, live = await database_sync_to_async(_quiet_look)(self.chat_id)
            if self.last_seq is not None and seq > self.last_seq:
                await self.push_new_events()
            if live:
                loop = asyncio.get_running_loop()
                if self._quiet_check is None:
                    self._quiet_check = loop.call_later(LIVE_CHECK_SECONDS, self._start_quiet_check)
        except Exception:  # noqa: BLE001 - a safety net must not take the socket down
            logger.warning("quiet check of chat %s failed", self.chat_id, exc_info=True)


def _quiet_look(chat_id: str) -> tuple[int, bool]:
    """The chat's last display seq, and whether a run of it is live."""
    chat = UUID(chat_id)
    return store.display_seq_now(chat), transitions.has_live_run(chat)


def _live_run(chat_id: str) -> Run | None:
    return Run.objects.filter(chat_id=UUID(chat_id), status__in=transitions.LIVE).first()
