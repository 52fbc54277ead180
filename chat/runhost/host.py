"""The Django run host: how a running agent loop persists and publishes.

:class:`DjangoRunHost` implements the loop's ``RunHost`` protocol on the database and
the channel layers. It writes the run's events (batched, one transaction and one
doorbell per batch), commits messages at safe cuts, renders the reply being streamed
once per push (for every subscriber) and pushes it on a timer, and stores the
approval requests that suspend a run. Rendering happens here, at the source, so a
hundred open pages cost one render per snapshot, not a hundred.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from chat import artifacts, rows, store
from chat.agent import events as ev
from chat.agent.loop import QueuedText
from chat.core import eventlog
from chat.core.channels import LiveChannels
from chat.core.messages import ChatMessage, ToolCall, assistant
from chat.core.voices import Voices, VoiceSplitter, split_reply
from chat.live.doorbell import aring, events_doorbell, ring, ring_now
from chat.models import QueuedInput, Run, ToolApproval
from chat.presentation import fragments
from chat.presentation.markdown import StreamingMarkdown, remember_rendered
from chat.runhost import pushed

logger = logging.getLogger(__name__)

# Announcements of a reply starting, which the page can show a moment later: written
# together (with whatever comes next, or after the delay), one transaction and one
# doorbell instead of one each, which a hundred replies starting at once queued up on
# the process's one database thread. (An input taken only clears its "queued" mark: written
# at once, it was a trip to that thread between the run's claim and its upstream request.)
BATCHED_EVENTS = (ev.RunStart, ev.IterationStart, ev.ContextUsage, ev.InputTaken)
EVENT_BATCH_DELAY = 0.05
# Pushes of a stream are at least this share of the push interval apart. The upstream is
# read once per interval (chat.catalog), and text comes in one batch per read: were
# pushes a whole interval apart, they would settle into a fixed lag behind the reads
# (measured: 66 ms on every token of a stream). A little less lets each batch go out at once.
PUSH_GAP = 0.75


def stamp(event: ev.RunEvent, run: Run) -> dict[str, Any]:
    event.chat_id = str(run.chat_id)
    event.run_id = str(run.pk)
    payload = event.to_dict()
    payload.pop("seq", None)
    return payload


class _PushAfterCurrent:
    """Stands in for the push timer while a push waits for the one in flight."""

    def cancel(self) -> None:
        pass


_AFTER_PUSH = _PushAfterCurrent()


class DjangoRunHost:
    """Persists and publishes what a running loop produces."""

    def __init__(self, run: Run, context: list[ChatMessage]) -> None:
        self.run = run
        self.chat_id = run.chat_id
        self.channels = LiveChannels(context=list(context))
        self.persisted = len(context)
        self.display_written = 0
        self.round = 0
        self.last_push = 0.0
        self.grants: set[str] = set()
        self.agent_prompt = ""  # the chat's agent's, as the run started (set by the runner)
        self.partial = ("", "")
        self.markdown = StreamingMarkdown()
        self.voices = Voices.from_names(run.speakers)
        # Inputs taken in the run's claim transaction, for the loop's first take.
        self.prefetched_queue: list[QueuedText] | None = None
        self.voice_markdown: list[StreamingMarkdown] = []
        self.voice_html: list[tuple[str, str]] = []  # per reply: (its text, its HTML)
        self.voice_splitter: VoiceSplitter | None = None
        self._push_due: asyncio.Handle | _PushAfterCurrent | None = None
        self._unwritten: list[tuple[ev.RunEvent, dict[str, Any]]] = []
        self._events_due: asyncio.TimerHandle | None = None
        self._writing: asyncio.Future | None = None
        self._pushing: asyncio.Future | None = None

    # RunHost protocol ------------------------------------------------------------------

    async def emit(self, event: ev.RunEvent) -> None:
        if not event.persisted:
            return
        self._unwritten.append((event, stamp(event, self.run)))
        if isinstance(event, BATCHED_EVENTS):
            if self._events_due is None:
                loop = asyncio.get_running_loop()
                self._events_due = loop.call_later(EVENT_BATCH_DELAY, self._write_events_later)
            return
        await self.write_events()

    def _write_events_later(self) -> None:
        self._events_due = None
        self._writing = asyncio.ensure_future(self._write_events_quietly())

    async def _write_events_quietly(self) -> None:
        try:
            await self.write_events()
        except Exception:  # noqa: BLE001 - the next write retries these events first
            logger.warning("events of run %s not written yet", self.run.pk, exc_info=True)

    async def write_events(self) -> None:
        """Write the events emitted so far, in order, in one transaction; ring once.

        Everything else the run writes to the log comes after them: callers writing
        messages or the run's end call this first (the database thread runs jobs in
        the order they were handed over, so a batch taken earlier is written earlier).
        """
        if self._events_due is not None:
            self._events_due.cancel()
            self._events_due = None
        batch, self._unwritten = self._unwritten, []
        if not batch:
            return
        try:
            doorbell = await database_sync_to_async(self._append_events)(batch)
        except BaseException:
            self._unwritten[:0] = batch
            raise
        await aring(self.chat_id, doorbell)

    def _append_events(self, batch: list[tuple[ev.RunEvent, dict[str, Any]]]) -> dict[str, Any]:
        with transaction.atomic():
            rows = self._write_event_rows(batch)
        return events_doorbell(self.chat_id, rows)

    def _write_event_rows(
        self,
        batch: list[tuple[ev.RunEvent, dict[str, Any]]],
        messages: list[ChatMessage] | None = None,
        *,
        context: list[dict[str, Any]] | None = None,
        run_changes: dict[str, Any] | None = None,
    ) -> list:
        """Append a batch of events, then ``messages`` (inside a transaction), and the
        ``context`` events on the session channel, in one append (one seq reservation,
        one insert); the display rows written. The run's row is updated once, with
        ``run_changes`` and the batch's iteration."""
        payloads = [payload for _event, payload in batch]
        if messages:
            stamp_ms = store.now_ms()
            payloads += [eventlog.msg_event(m, stamp_ms) for m in messages]
        written = store.append_to_channels(
            self.chat_id, {store.DISPLAY: payloads, store.SESSION: context or []}
        )
        changes = dict(run_changes or {})
        iterations = [e.iteration for e, _p in batch if isinstance(e, ev.IterationStart)]
        if iterations:
            changes["iteration"] = iterations[-1]
        if changes:
            rows.update(Run, self.run.pk, **changes)  # written out: every commit of a run
        return written[store.DISPLAY]

    def take_new_display(self, *, remember_html: bool = False) -> list[ChatMessage]:
        """Display messages not yet written, stamped with this run and its stream round.

        A round is one streamed reply; the stream snapshots carry the round they belong
        to, so a subscriber can drop a late snapshot of a reply already written.
        With ``remember_html`` (only from the event loop, where the snapshots are
        rendered) the streamed reply's HTML is kept for rendering its message.
        """
        new_display = self.channels.display[self.display_written :]
        self.display_written = len(self.channels.display)
        replied = False
        for message in new_display:
            message.extra.setdefault("run_id", str(self.run.pk))
            if is_streamed_reply(message):
                # Every voice of one reply shares its round.
                message.extra["round"] = self.round
                replied = True
                if remember_html and message.content:
                    self._remember_final_html(message)
        if replied:
            self.round += 1
            self.partial = ("", "")  # written: a reconnecting page must not see it twice
            self.markdown = StreamingMarkdown()
            self.voice_markdown, self.voice_html, self.voice_splitter = [], [], None
            self.stop_pushing()
        return new_display

    def _remember_final_html(self, message: ChatMessage) -> None:
        """Keep the streamed reply's HTML for rendering its message (on the database
        thread, where a render from scratch held up every other run's writes)."""
        if self.voices is None:
            renderer: StreamingMarkdown | None = self.markdown
        else:
            voice = message.extra.get("voice")
            renderer = None
            if isinstance(voice, int) and voice < len(self.voice_markdown):
                renderer = self.voice_markdown[voice]
        if renderer is None:
            return
        html = renderer.render_final(message.content)
        if html is not None:
            remember_rendered(message.content, html)

    def push_partial(self, message: ChatMessage) -> None:
        """A partial reply kept at the run's end, written as the loop writes replies."""
        if message.sender_name:
            self.channels.push_labelled(message)
        else:
            self.channels.push_both(message)

    async def commit(self) -> None:
        # The events emitted so far go first, in the same transaction and doorbell as the
        # messages: one trip to the database thread a reply, not two.
        if self._events_due is not None:
            self._events_due.cancel()
            self._events_due = None
        batch, self._unwritten = self._unwritten, []
        new_display = self.take_new_display(remember_html=True)
        try:
            doorbell = await database_sync_to_async(self._commit)(new_display, batch)
        except BaseException:
            self._unwritten[:0] = batch
            raise
        if doorbell:
            await aring(self.chat_id, doorbell)

    def _commit(
        self,
        new_display: list[ChatMessage],
        batch: list[tuple[ev.RunEvent, dict[str, Any]]] | None = None,
    ) -> dict[str, Any] | None:
        run_changes: dict[str, Any] = {}
        if any("round" in m.extra for m in new_display):
            # The streamed reply is now a message: the checkpoint starts over.
            run_changes.update(partial_text="", partial_reasoning="")
        cut, context = store.context_due(self.channels.context, self.persisted)
        with transaction.atomic():
            # The context goes with the display events: one counter update, one insert.
            rows = self._write_event_rows(
                batch or [], new_display, context=context, run_changes=run_changes
            )
            written = rows[len(rows) - len(new_display) :]
            rows += self._keep_code_blocks(new_display, written)
        self.persisted = cut
        return events_doorbell(self.chat_id, rows) if rows else None

    def _keep_code_blocks(self, messages: list[ChatMessage], rows: list) -> list:
        """Substantial code blocks of the replies just written become artifact versions."""
        cards = []
        for message, row in zip(messages, rows, strict=True):
            fenced = "```" in message.content or "~~~" in message.content
            if message.role == "assistant" and not message.tool_calls and fenced:
                cards += artifacts.save_code_blocks(
                    self.chat_id, message.content, row.seq, run_id=str(self.run.pk)
                )
        return cards

    async def stream_update(self, text: str, reasoning: str) -> None:
        self.partial = (text, reasoning)  # the keeper checkpoints it (chat.keeper)
        if self._push_due is None:
            now = time.monotonic()
            # Coalesced: text arriving before the push is due goes out in that push, so
            # no text waits longer than one interval, and a quiet stream is pushed at once.
            gap = settings.LYCEUM_STREAM_PUSH_INTERVAL * PUSH_GAP
            wait = self.last_push + gap - now
            loop = asyncio.get_running_loop()
            # Due now (a read's text, the pushes a read apart): after this turn, the rest
            # of the read with it, and without a timer on the loop's heap.
            if wait <= 0:
                self._push_due = loop.call_soon(self._push_when_due)
            else:
                self._push_due = loop.call_later(wait, self._push_when_due)

    def _push_when_due(self) -> None:
        if self._pushing is not None and not self._pushing.done():
            # One push in flight per run: snapshots stay in order, and a slow channel
            # layer is not flooded. This one goes out as soon as that one is through.
            self._push_due = _AFTER_PUSH
            self._pushing.add_done_callback(self._push_if_waiting)
            return
        self._push_due = None
        self.last_push = time.monotonic()
        if self.partial == ("", ""):
            return
        # On a layer that sends without waiting, the snapshot goes out here, with no task
        # made for it; else (Redis, or the run's start still to write first) in a task.
        if self._unwritten or not ring_now(self.chat_id, self._snapshot):
            self._pushing = asyncio.ensure_future(self.push_stream())

    def _push_if_waiting(self, _pushed: asyncio.Future) -> None:
        if self._push_due is _AFTER_PUSH:
            self._push_when_due()

    def pending_work(self) -> list[asyncio.Future]:
        """What the host has going besides the run's own task (stopping a process)."""
        self.stop_pushing()
        return [f for f in (self._writing, self._pushing) if f is not None]

    def stop_pushing(self) -> None:
        """Drop a snapshot still due: the reply it would show is written, or the run ended."""
        if self._events_due is not None:  # the run's end writes them (or they go with it)
            self._events_due.cancel()
            self._events_due = None
        if self._push_due is not None:
            self._push_due.cancel()
            self._push_due = None

    async def push_stream(self) -> None:
        if self._unwritten:  # the run's start reaches the page (and the API) first
            await self.write_events()
        text, reasoning = self.partial
        await aring(
            self.chat_id,
            self._snapshot(),
            keep=pushed.keep_args(str(self.run.pk), self.round, text, reasoning),
        )

    def _snapshot(self) -> dict[str, Any]:
        """The stream snapshot of the reply so far, as every subscriber gets it."""
        text, reasoning = self.partial
        run_id = str(self.run.pk)
        # Rendered here, once, for every subscriber (and in the worker, when runs run
        # in one): only the reply's last block is rendered again.
        if self.voices is None:
            html = fragments.stream_slot(
                run_id, self.markdown.render(text) if text else "", reasoning
            )
        else:
            html = fragments.stream_slot(
                run_id, reasoning=reasoning, voices=self._voices_html(text)
            )
        return {
            "type": "chat.stream",
            "chat_id": str(self.chat_id),
            "run_id": run_id,
            "round": self.round,
            "speakers": self.run.speakers or [],
            "text": text,
            "reasoning": reasoning,
            "html": html,
            "sent_at": time.time(),
        }

    def _voices_html(self, text: str) -> list[tuple[str, str]]:
        """Each speaker's reply so far, rendered.

        The reply only grows at its end: the splitter is fed what was added since the
        last push, and only a reply whose text changed is rendered again (by its own
        streaming renderer); the others keep their HTML.
        """
        assert self.voices is not None
        if self.voice_splitter is None or not text.startswith(self.voice_splitter.raw):
            self.voice_splitter = VoiceSplitter(self.voices)  # not a continuation
            self.voice_markdown, self.voice_html = [], []
        self.voice_splitter.feed(text[len(self.voice_splitter.raw) :])
        out = []
        for index, (speaker, said) in enumerate(self.voice_splitter.replies()):
            if index == len(self.voice_markdown):
                self.voice_markdown.append(StreamingMarkdown())
                self.voice_html.append(("", ""))
            if self.voice_html[index][0] != said:
                html = self.voice_markdown[index].render(said) if said else ""
                self.voice_html[index] = (said, html)
            out.append((speaker, self.voice_html[index][1]))
        return out

    async def take_queued(self) -> list[QueuedText]:
        if self.prefetched_queue is not None:  # taken with the run's claim (executor)
            queued, self.prefetched_queue = self.prefetched_queue, None
            return queued
        return await database_sync_to_async(take_queued_inputs)(self.chat_id, self.run)

    async def system_prompt(self) -> str:
        today = timezone.now().strftime("%A %d %B %Y")
        return f"{self.agent_prompt}\n\nToday is {today}.".strip()

    async def restore_context(self, messages: list[ChatMessage]) -> None:
        await database_sync_to_async(store.restore_context)(self.chat_id, messages)
        self.persisted = len(messages)

    async def suspend(self, message: ChatMessage, pending: list[ToolCall], usage) -> None:
        self.usage = usage
        await self.write_events()
        await database_sync_to_async(self._suspend)(message, pending)

    def _suspend(self, message: ChatMessage, pending: list[ToolCall]) -> None:
        expires = timezone.now() + timedelta(seconds=settings.LYCEUM_APPROVAL_TIMEOUT)
        with transaction.atomic():
            ToolApproval.objects.bulk_create(
                [
                    ToolApproval(
                        chat_id=self.chat_id,
                        run=self.run,
                        call_id=call.id,
                        tool_name=call.name,
                        arguments=call.arguments,
                        expires_at=expires,
                    )
                    for call in pending
                ]
            )
            payloads = [
                stamp(
                    ev.ApprovalRequired(
                        call_id=call.id,
                        name=call.name,
                        input=_json_or_raw(call.arguments),
                        expires_at=expires.isoformat(),
                    ),
                    self.run,
                )
                for call in pending
            ]
            rows = store.append_display(self.chat_id, payloads)
            Run.objects.filter(pk=self.run.pk).update(
                status=Run.Status.WAITING,
                claimed=False,  # whoever resumes it claims it again
                input_tokens=self.usage.input_tokens,
                output_tokens=self.usage.output_tokens,
                usage_estimated=self.usage.estimated,
                pending_message=message.to_dict(),
                partial_text="",
                partial_reasoning="",
            )
            ring(self.chat_id, rows)

    def granted(self, tool_name: str) -> bool:
        return tool_name in self.grants


def _json_or_raw(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def is_streamed_reply(message: ChatMessage) -> bool:
    """A reply the run streamed: the main agent's, or one of its voices' (not a sub-agent's)."""
    return message.role == "assistant" and (not message.sender_name or "voice" in message.extra)


def partial_message(
    text: str, reasoning: str, status: str, speakers: list[str] | None = None
) -> list[ChatMessage]:
    """The partial reply kept when a run stops early, marked with how it ended.

    With several speakers, one labelled message per speaker's reply so far.
    """
    if not text and not reasoning:
        return []
    voices = Voices.from_names(speakers)
    if voices is None:
        return [assistant(text, reasoning_content=reasoning or None, extra={"ended": status})]
    replies = split_reply(voices, text) or [(voices.fallback, "")]
    return [
        assistant(
            said,
            sender_name=speaker,
            reasoning_content=(reasoning or None) if index == 0 else None,
            extra={"ended": status, "voice": index},
        )
        for index, (speaker, said) in enumerate(replies)
    ]


def take_queued_inputs(chat_id, run: Run, *, locked: bool = False) -> list[QueuedText]:
    """The chat's inputs no run has taken yet, now taken by ``run`` (oldest first).

    ``locked``: the caller's transaction holds the write lock already (a run's claim),
    so the inputs are taken at once, without a look first.

    Written-out statements (chat/rows.py): a look, and one ``UPDATE … RETURNING`` that
    takes the inputs and reads them (it locks their rows as the update it is); every run
    makes them on the process's one database thread, where the ORM's building of the
    same statements cost more than running them.
    """
    if not locked and not has_queued_inputs(chat_id):
        return []  # the usual case, read without taking the write lock
    chat = rows.prep(QueuedInput, "chat", chat_id)
    table = rows.table(QueuedInput)
    where = _waiting_inputs()
    names = ("id", "content", "display_seq", "images")
    sql = (
        f"UPDATE {table} SET {rows.column(QueuedInput, 'consumed')} = %s, "
        f"{rows.column(QueuedInput, 'run')} = %s WHERE {where} "
        f"RETURNING {', '.join(rows.column(QueuedInput, name) for name in names)}"
    )
    params = [rows.prep(QueuedInput, "consumed", True), rows.prep(QueuedInput, "run", run.pk)]
    # In the claim's transaction: no savepoint.
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(sql, [*params, chat])
        taken = sorted(
            (rows.convert(QueuedInput, names, row) for row in cursor.fetchall()),
            key=lambda row: row[0],
        )
    return [
        QueuedText(content, display_seq or 0, artifacts.images_for_model(images))
        for _pk, content, display_seq, images in taken
    ]


def _waiting_inputs() -> str:
    return f"{rows.column(QueuedInput, 'chat')} = %s AND NOT {rows.column(QueuedInput, 'consumed')}"


def has_queued_inputs(chat_id) -> bool:
    """Whether inputs of the chat wait for a run (a written-out look, chat/rows.py)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {rows.table(QueuedInput)} WHERE {_waiting_inputs()} LIMIT 1",
            [rows.prep(QueuedInput, "chat", chat_id)],
        )
        return cursor.fetchone() is not None
