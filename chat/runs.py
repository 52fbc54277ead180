"""Runs on the Django side: what a user can do to a chat, and the host a run writes through.

Actions (send, cancel, decide an approval, switch model, compact) are plain
functions that check access, change the database in one transaction, and ring
the doorbell after the commit. The runner (``chat.runner``) executes runs; this
module's :class:`DjangoRunHost` is how a running loop persists and publishes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from chat import agents, live, store
from chat.access import ChatAction, access_chat
from chat.agent import events as ev
from chat.agent.loop import Decision, QueuedText
from chat.core.channels import LiveChannels
from chat.core.eventlog import msg_event
from chat.core.messages import ChatMessage, ToolCall, assistant
from chat.models import (
    Agent,
    ChatEvent,
    ChatSession,
    ChatToolGrant,
    QueuedInput,
    Run,
    ToolApproval,
)
from chat.providers import UnknownModel, available_models, default_model
from chat.rendering import StreamingMarkdown, remember_rendered
from chat.store import StoredEvent
from chatsite.layers import group_send_soon, live_layer

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 32_000
TITLE_CHARS = 50
LIVE = [Run.Status.RUNNING, Run.Status.WAITING]
DISPATCH_GRACE = timedelta(seconds=45)
# Announcements of a reply starting, which the page can show a moment later: written
# together (with whatever comes next, or after the delay), one transaction and one
# doorbell instead of one each, which a hundred replies starting at once queued up on
# the process's one database thread.
BATCHED_EVENTS = (ev.RunStart, ev.IterationStart, ev.ContextUsage)
EVENT_BATCH_DELAY = 0.05
# Pushes of a stream are at least this share of the push interval apart. The upstream is
# read once per interval (chat.providers), and text comes in one batch per read: were
# pushes a whole interval apart, they would settle into a fixed lag behind the reads
# (measured: 66 ms on every token of a stream). A little less lets each batch go out at once.
PUSH_GAP = 0.75


class ActionError(Exception):
    """A user action that cannot be done, with a message for that user."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# --- doorbell ---------------------------------------------------------------------------------


def chat_group(chat_id) -> str:
    return f"chat.{chat_id}"


def run_control_group(run_id) -> str:
    return f"runctl.{run_id}"


def ring(chat_id, rows: list[ChatEvent]) -> None:
    """After the commit, tell the chat's subscribers about display events just written."""
    layer = live_layer()
    if layer is None or not rows:
        return

    transaction.on_commit(
        lambda: group_send_soon(layer, chat_group(chat_id), events_doorbell(chat_id, rows))
    )


async def aring(chat_id, message: dict[str, Any]) -> None:
    layer = live_layer()
    if layer is None:
        return
    try:
        await layer.group_send(chat_group(chat_id), message)
    except Exception:  # noqa: BLE001
        logger.warning("doorbell for chat %s failed", chat_id, exc_info=True)


def events_doorbell(chat_id, rows: list[ChatEvent]) -> dict[str, Any]:
    """The doorbell for display events just written, carrying their fragments.

    Rendered here once for every subscriber, where the events are at hand. A
    subscriber that has seen everything before them pushes the fragments as they
    are; any other reads the log from its own ``seq``: the log stays the truth, and a
    doorbell may be lost or overtaken.
    """
    events = [StoredEvent(row.seq, row.kind, row.payload) for row in rows]
    message: dict[str, Any] = {"type": "chat.events", "seq": events[-1].seq}
    if events[-1].seq - events[0].seq != len(events) - 1:
        return message  # not one run of seqs: let each subscriber read the log
    try:
        html = live.fragments_for_events(events, str(chat_id))
    except Exception:  # noqa: BLE001 - the subscribers render them from the log instead
        logger.warning("fragments for chat %s failed", chat_id, exc_info=True)
        return message
    message.update(after=events[0].seq - 1, html=html, rounds=live.written_rounds(events))
    return message


def dispatch_deadline():
    """A heartbeat far enough ahead to cover the trip to a worker.

    A run is handed over the channel layer (whose messages expire after 30 s); until a
    process starts it and beats itself, this keeps the sweeper from calling it dead.
    """
    return timezone.now() + DISPATCH_GRACE


# --- default agent and chat creation -------------------------------------------------------


def new_chat(user, *, agent: Agent | None = None, model: str = "", title: str = "") -> ChatSession:
    agent = agent or agents.default_agent()
    try:
        alias = default_model(model or agent.default_model)
    except UnknownModel as exc:
        raise ActionError(str(exc), "unknown_model") from None
    if model and alias != model:
        raise ActionError(str(UnknownModel(model)), "unknown_model")
    chat = store.create_chat(user, title=title, model=alias)
    chat.agent = agent
    chat.save(update_fields=["agent"])
    return chat


# --- send ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendResult:
    input_id: int
    display_seq: int
    run_id: str | None  # a run to dispatch (None when the message was queued or repeated)
    duplicate: bool
    queued: bool


def send_message(
    user,
    chat_id,
    text: str,
    client_id: str,
    *,
    thinking: bool = True,
    edit_of: int | None = None,
) -> SendResult:
    """Store a user message once per ``client_id``; start a run unless one is live."""
    text = (text or "").strip()
    if not text:
        raise ActionError("The message is empty.", "empty")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ActionError(
            f"The message is too long ({len(text)} characters; the limit is {MAX_MESSAGE_CHARS}).",
            "too_long",
        )
    client_id = (client_id or "").strip()[:64]
    if not client_id:
        raise ActionError("The message has no client id.", "no_client_id")
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    existing = QueuedInput.objects.filter(chat=chat, client_id=client_id).first()
    if existing:
        return SendResult(existing.pk, existing.display_seq or 0, None, True, False)
    try:
        with transaction.atomic():
            return _record_send(chat, text, client_id, thinking, edit_of)
    except IntegrityError:
        # Two sends with the same client id raced; the first one won.
        existing = QueuedInput.objects.get(chat=chat, client_id=client_id)
        return SendResult(existing.pk, existing.display_seq or 0, None, True, False)


def _record_send(
    chat: ChatSession, text: str, client_id: str, thinking: bool, edit_of: int | None
) -> SendResult:
    live = Run.objects.select_for_update().filter(chat=chat, status__in=LIVE).first()
    entry = QueuedInput.objects.create(chat=chat, client_id=client_id, content=text)
    message = ChatMessage(role="user", content=text, extra={"input_id": entry.pk})
    if edit_of:
        message.extra["edit_of"] = edit_of
    if live:
        message.extra["queued"] = True
    (row,) = store.append_display(chat.pk, [msg_event(message, store.now_ms())])
    entry.display_seq = row.seq
    entry.save(update_fields=["display_seq"])
    rows = [row]
    if not chat.title:
        rows += _set_title(chat, text.splitlines()[0][:TITLE_CHARS])
    run_id = None
    if live is None:
        run = Run.objects.create(
            chat=chat,
            model=chat.model or default_model(),
            thinking=thinking,
            heartbeat_at=dispatch_deadline(),
        )
        run_id = str(run.pk)
        # The message belongs to the run it started, even if the run ends before taking it.
        QueuedInput.objects.filter(pk=entry.pk).update(run=run)
    ring(chat.pk, rows)
    return SendResult(entry.pk, row.seq, run_id, False, live is not None)


def start_run_if_idle(chat: ChatSession) -> str | None:
    """Start a run for inputs left queued (e.g. after a run ended). Returns its id."""
    if not QueuedInput.objects.filter(chat=chat, consumed=False).exists():
        return None  # the usual case, read without taking the write lock
    with transaction.atomic():
        if Run.objects.select_for_update().filter(chat=chat, status__in=LIVE).exists():
            return None
        if not QueuedInput.objects.filter(chat=chat, consumed=False).exists():
            return None
        try:
            with transaction.atomic():
                run = Run.objects.create(
                    chat=chat, model=chat.model or default_model(), heartbeat_at=dispatch_deadline()
                )
        except IntegrityError:
            return None
        QueuedInput.objects.filter(chat=chat, consumed=False).update(run=run)
    return str(run.pk)


def _new_run(chat: ChatSession, *, kind: str = Run.Kind.REPLY) -> Run:
    """A run for ``chat`` if none is live (call inside a transaction)."""
    if Run.objects.select_for_update().filter(chat=chat, status__in=LIVE).exists():
        raise ActionError("Wait for the current reply to finish.", "busy")
    return Run.objects.create(
        chat=chat, model=chat.model or default_model(), kind=kind, heartbeat_at=dispatch_deadline()
    )


def _last_user_index(context: list[ChatMessage]) -> int:
    for index in range(len(context) - 1, -1, -1):
        if context[index].role == "user":
            return index
    raise ActionError("There is no message to answer yet.", "empty")


def regenerate(user, chat_id) -> str:
    """Answer the last user message again; the earlier reply stays in the log and on screen."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        run = _new_run(chat)
        context = store.load_context(chat.pk)
        keep = _last_user_index(context) + 1
        if keep < len(context):
            store.restore_context(chat.pk, context[:keep])
        note = ChatMessage(role="system", content="Regenerating the last reply.")
        rows = store.append_display_messages(chat.pk, [note])
        ring(chat.pk, rows)
    return str(run.pk)


def edit_last_message(user, chat_id, text: str, client_id: str) -> SendResult:
    """Replace the last user message with ``text`` and answer it; both versions stay shown."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        if Run.objects.select_for_update().filter(chat=chat, status__in=LIVE).exists():
            raise ActionError("Wait for the current reply to finish.", "busy")
        context = store.load_context(chat.pk)
        store.restore_context(chat.pk, context[: _last_user_index(context)])
        previous = (
            QueuedInput.objects.filter(chat=chat)
            .order_by("-pk")
            .values_list("display_seq", flat=True)
            .first()
        )
        result = send_message(user, chat.pk, text, client_id, edit_of=previous)
    return result


def request_compaction(user, chat_id) -> str:
    """ "Compact now": a run that only compacts the context."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        run = _new_run(chat, kind=Run.Kind.COMPACT)
    return str(run.pk)


# --- cancel -------------------------------------------------------------------------------


def cancel_run(user, chat_id) -> str | None:
    """Ask the live run to stop. Idempotent; returns the run id or None when idle."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(chat=chat, status__in=LIVE).first()
        if run is None:
            return None
        if run.status == Run.Status.WAITING:
            # Nothing is executing: finish it here.
            _finish_waiting_run_cancelled(run)
            return str(run.pk)
        if not run.cancel_requested:
            Run.objects.filter(pk=run.pk).update(cancel_requested=True)
        _ring_cancel(run.pk)
    return str(run.pk)


def _ring_cancel(run_id) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    transaction.on_commit(
        lambda: group_send_soon(
            layer, run_control_group(run_id), {"type": "run.cancel", "run_id": str(run_id)}
        )
    )


def _finish_waiting_run_cancelled(run: Run) -> None:
    now = timezone.now()
    ToolApproval.objects.filter(run=run, status=ToolApproval.Status.PENDING).update(
        status=ToolApproval.Status.DENIED, reason="The reply was stopped.", decided_at=now
    )
    run.status = Run.Status.CANCELLED
    run.finished_at = now
    run.pending_message = None
    run.save(update_fields=["status", "finished_at", "pending_message"])
    rows = store.append_display(run.chat_id, [_stamp(ev.Cancelled(partial_text=""), run)])
    ring(run.chat_id, rows)


# --- approvals ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecideResult:
    run_id: str | None  # a run to resume, when this answer was the last one it waited for
    status: str


def decide_approval(
    user, chat_id, call_id: str, *, approve: bool, reason: str = "", always: bool = False
) -> DecideResult:
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        approval = (
            ToolApproval.objects.select_for_update()
            .filter(chat=chat, call_id=call_id)
            .select_related("run")
            .first()
        )
        if approval is None:
            raise ActionError("There is no such tool call waiting for approval.", "not_found")
        if approval.status != ToolApproval.Status.PENDING:
            return DecideResult(None, approval.status)  # answered already: idempotent
        approval.status = ToolApproval.Status.APPROVED if approve else ToolApproval.Status.DENIED
        approval.reason = (reason or "").strip()[:2000]
        approval.decided_by = user
        approval.decided_at = timezone.now()
        approval.save()
        if always and approve:
            ChatToolGrant.objects.get_or_create(
                chat=chat, tool_name=approval.tool_name, defaults={"granted_by": user}
            )
        run_id = _record_decision(approval)
    return DecideResult(run_id, approval.status)


def _record_decision(approval: ToolApproval) -> str | None:
    decision = ev.ApprovalDecided(
        call_id=approval.call_id,
        name=approval.tool_name,
        decision=str(approval.status),
        reason=approval.reason,
    )
    rows = store.append_display(approval.chat_id, [_stamp(decision, approval.run)])
    ring(approval.chat_id, rows)
    still_pending = ToolApproval.objects.filter(
        run=approval.run_id, status=ToolApproval.Status.PENDING
    ).exists()
    if still_pending:
        return None
    updated = Run.objects.filter(pk=approval.run_id, status=Run.Status.WAITING).update(
        status=Run.Status.RUNNING, heartbeat_at=dispatch_deadline()
    )
    return str(approval.run_id) if updated else None


def expire_approvals(now=None) -> list[str]:
    """Deny approvals past their deadline; returns the runs to resume."""
    now = now or timezone.now()
    to_resume = []
    for approval_id in ToolApproval.objects.filter(
        status=ToolApproval.Status.PENDING, expires_at__lte=now
    ).values_list("pk", flat=True):
        with transaction.atomic():
            approval = (
                ToolApproval.objects.select_for_update()
                .select_related("run")
                .filter(pk=approval_id, status=ToolApproval.Status.PENDING)
                .first()
            )
            if approval is None:
                continue
            approval.status = ToolApproval.Status.EXPIRED
            approval.reason = "No answer in time."
            approval.decided_at = now
            approval.save()
            run_id = _record_decision(approval)
        if run_id:
            to_resume.append(run_id)
    return to_resume


def decisions_for(run: Run) -> dict[str, Decision]:
    decisions = {}
    for approval in ToolApproval.objects.filter(run=run):
        if approval.status == ToolApproval.Status.PENDING:
            continue
        decisions[approval.call_id] = Decision(
            approved=approval.status == ToolApproval.Status.APPROVED,
            reason=approval.reason,
            expired=approval.status == ToolApproval.Status.EXPIRED,
        )
    return decisions


# --- model switch, rename, compact ------------------------------------------------------------


def switch_model(user, chat_id, alias: str) -> str:
    """Use ``alias`` from the next request on (a run in progress keeps its model)."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    if alias not in {c.alias for c in available_models()}:
        raise ActionError(str(UnknownModel(alias)), "unknown_model")
    if alias == chat.model:
        return alias
    with transaction.atomic():
        ChatSession.objects.filter(pk=chat.pk).update(model=alias)
        rows = store.append_display(chat.pk, [{"type": "model_switched", "model": alias}])
        ring(chat.pk, rows)
    return alias


def rename_chat(user, chat_id, title: str) -> str:
    chat = access_chat(user, chat_id, ChatAction.MANAGE)
    title = " ".join((title or "").split())[:200]
    if not title:
        raise ActionError("A chat needs a title.", "empty")
    with transaction.atomic():
        ring(chat.pk, _set_title(chat, title))
    return title


def _set_title(chat: ChatSession, title: str) -> list[ChatEvent]:
    """Store the title (inside a transaction); the caller rings for the event returned."""
    ChatSession.objects.filter(pk=chat.pk).update(title=title)
    return store.append_display(chat.pk, [{"type": "title", "title": title}])


# --- the run host -----------------------------------------------------------------------------


def _stamp(event: ev.RunEvent, run: Run) -> dict[str, Any]:
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
        self._push_due: asyncio.TimerHandle | _PushAfterCurrent | None = None
        self._unwritten: list[tuple[ev.RunEvent, dict[str, Any]]] = []
        self._events_due: asyncio.TimerHandle | None = None
        self._writing: asyncio.Future | None = None
        self._pushing: asyncio.Future | None = None

    # RunHost protocol ------------------------------------------------------------------

    async def emit(self, event: ev.RunEvent) -> None:
        if not event.persisted:
            return
        self._unwritten.append((event, _stamp(event, self.run)))
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
            rows = store.append_display(self.chat_id, [payload for _event, payload in batch])
            iterations = [e.iteration for e, _p in batch if isinstance(e, ev.IterationStart)]
            if iterations:
                Run.objects.filter(pk=self.run.pk).update(iteration=iterations[-1])
        return events_doorbell(self.chat_id, rows)

    def take_new_display(self, *, remember_html: bool = False) -> list[ChatMessage]:
        """Display messages not yet written, stamped with this run and its stream round.

        A round is one streamed reply; the stream snapshots carry the round they belong
        to, so a subscriber can drop a late snapshot of a reply already written.
        With ``remember_html`` (only from the event loop, where the snapshots are
        rendered) the streamed reply's HTML is kept for rendering its message.
        """
        new_display = self.channels.display[self.display_written :]
        self.display_written = len(self.channels.display)
        for message in new_display:
            message.extra.setdefault("run_id", str(self.run.pk))
            if message.role == "assistant" and not message.sender_name:
                message.extra["round"] = self.round
                self.round += 1
                if remember_html and message.content:
                    html = self.markdown.render_final(message.content)
                    if html is not None:
                        remember_rendered(message.content, html)
                self.partial = ("", "")  # written: a reconnecting page must not see it twice
                self.markdown = StreamingMarkdown()
                self.stop_pushing()
        return new_display

    async def commit(self) -> None:
        await self.write_events()
        new_display = self.take_new_display(remember_html=True)
        doorbell = await database_sync_to_async(self._commit)(new_display)
        if doorbell:
            await aring(self.chat_id, doorbell)

    def _commit(self, new_display: list[ChatMessage]) -> dict[str, Any] | None:
        with transaction.atomic():
            rows = store.append_display_messages(self.chat_id, new_display)
            self.persisted = store.persist_context(
                self.chat_id, self.channels.context, self.persisted
            )
            if any("round" in m.extra for m in new_display):
                # The streamed reply is now a message: the checkpoint starts over.
                Run.objects.filter(pk=self.run.pk).update(partial_text="", partial_reasoning="")
        return events_doorbell(self.chat_id, rows) if rows else None

    async def stream_update(self, text: str, reasoning: str) -> None:
        self.partial = (text, reasoning)  # the keeper checkpoints it (chat.keeper)
        if self._push_due is None:
            now = time.monotonic()
            # Coalesced: text arriving before the push is due goes out in that push, so
            # no text waits longer than one interval, and a quiet stream is pushed at once.
            gap = settings.LYCEUM_STREAM_PUSH_INTERVAL * PUSH_GAP
            wait = max(0.0, self.last_push + gap - now)
            self._push_due = asyncio.get_running_loop().call_later(wait, self._push_when_due)

    def _push_when_due(self) -> None:
        if self._pushing is not None and not self._pushing.done():
            # One push in flight per run: snapshots stay in order, and a slow channel
            # layer is not flooded. This one goes out as soon as that one is through.
            self._push_due = _AFTER_PUSH
            self._pushing.add_done_callback(self._push_if_waiting)
            return
        self._push_due = None
        self.last_push = time.monotonic()
        if self.partial != ("", ""):
            self._pushing = asyncio.ensure_future(self.push_stream())

    def _push_if_waiting(self, _pushed: asyncio.Future) -> None:
        if self._push_due is _AFTER_PUSH:
            self._push_when_due()

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
        run_id = str(self.run.pk)
        # Rendered here, once, for every subscriber (and in the worker, when runs run
        # in one): only the reply's last block is rendered again.
        html = live.stream_slot(run_id, self.markdown.render(text) if text else "", reasoning)
        await aring(
            self.chat_id,
            {
                "type": "chat.stream",
                "run_id": run_id,
                "round": self.round,
                "text": text,
                "reasoning": reasoning,
                "html": html,
                "sent_at": time.time(),
            },
        )

    async def take_queued(self) -> list[QueuedText]:
        return await database_sync_to_async(self._take_queued)()

    def _take_queued(self) -> list[QueuedText]:
        waiting = QueuedInput.objects.filter(chat_id=self.chat_id, consumed=False)
        if not waiting.exists():  # the usual case: no write lock for it (SQLite takes one)
            return []
        with transaction.atomic():
            rows = list(
                QueuedInput.objects.select_for_update()
                .filter(chat_id=self.chat_id, consumed=False)
                .order_by("pk")
            )
            QueuedInput.objects.filter(pk__in=[r.pk for r in rows]).update(
                consumed=True, run=self.run
            )
        return [QueuedText(r.content, r.display_seq or 0) for r in rows]

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
                _stamp(
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
    import json

    try:
        return json.loads(raw)
    except ValueError:
        return raw


def partial_message(text: str, reasoning: str, status: str) -> ChatMessage | None:
    """The partial reply kept when a run stops early, marked with how it ended."""
    if not text and not reasoning:
        return None
    return assistant(text, reasoning_content=reasoning or None, extra={"ended": status})
