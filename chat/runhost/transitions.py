"""The states a run goes through, as database changes: start, decide, finish, recover.

Plain synchronous functions, each called inside (or as) one transaction, shared by
the user actions (``chat.actions``) and the executor. They write events and ring
the doorbell after the commit; they never start a run themselves: whoever calls
them launches what they return (see ``chat.runhost.executor.launch_on_commit``).

Every run ends in exactly one terminal state, guarded in the database
(:func:`finish_run` updates only a live run), and ending a run closes what it left
open: approvals still pending get their ``approval_decided`` event, tool calls
still running get a ``tool_end`` of status ``cancelled`` or ``failed``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from chat import rows, store
from chat.agent import events as ev
from chat.agent.loop import Decision
from chat.catalog import default_model
from chat.core import eventlog
from chat.core.eventlog import MSG
from chat.core.messages import ChatMessage
from chat.core.tokens import estimate_text_tokens
from chat.live.doorbell import ring
from chat.llm.types import ErrorCategory, Usage
from chat.models import ChatSession, QueuedInput, Run, ToolApproval
from chat.relay.usage import record_run_usage
from chat.runhost import pushed, setup
from chat.runhost.host import DjangoRunHost, has_queued_inputs, partial_message, stamp

LIVE = [Run.Status.RUNNING, Run.Status.WAITING]
DISPATCH_GRACE = timedelta(seconds=45)
STALE_AFTER = timedelta(seconds=15)  # the default of settings.LYCEUM_RUN_STALE_SECONDS
INTERRUPTED_MESSAGE = gettext_noop(
    "The reply was interrupted because the process running it stopped. "
    "The text written so far is kept."
)
NEVER_STARTED_MESSAGE = gettext_noop(
    "The reply never started: no process took it in time, even when it was handed over "
    "again. Send the message again."
)


def dispatch_deadline():
    """A heartbeat far enough ahead to cover the trip to a worker.

    A run is handed over the channel layer (whose messages expire after 30 s); until a
    process starts it and beats itself, this keeps the sweeper from calling it dead.
    """
    return timezone.now() + DISPATCH_GRACE


def stale_after() -> timedelta:
    """How old a running run's heartbeat may get before the run counts as dead."""
    seconds = getattr(settings, "LYCEUM_RUN_STALE_SECONDS", None)
    return timedelta(seconds=seconds) if seconds else STALE_AFTER


def live_run(chat: ChatSession, *, lock: bool = False) -> Run | None:
    runs = Run.objects.select_for_update() if lock else Run.objects
    return runs.filter(chat=chat, status__in=LIVE).first()


def has_live_run(chat: ChatSession | Any, *, lock: bool = False) -> bool:
    """Whether ``chat`` (a chat or its id) has a live run (``lock``: its row locked, as
    :func:`live_run`).

    A fixed statement, written out: every send asks it on the database thread, and
    building it with the ORM cost more than running it.
    """
    opts = Run._meta
    quote = connection.ops.quote_name
    status = quote(str(opts.get_field("status").column))
    sql = (
        f"SELECT 1 FROM {quote(opts.db_table)} WHERE {quote(opts.get_field('chat').column)} = %s"
        f" AND {status} IN ({', '.join(['%s'] * len(LIVE))}) LIMIT 1"
    )
    if lock and connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    pk = chat.pk if isinstance(chat, ChatSession) else chat
    chat_id = opts.get_field("chat").get_db_prep_value(pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [chat_id, *(str(s) for s in LIVE)])
        return cursor.fetchone() is not None


def new_run(chat: ChatSession, *, kind: str = Run.Kind.REPLY, thinking: bool = True) -> Run:
    """A run of ``chat`` (inside a transaction, after checking none is live)."""
    # Written out (chat/rows.py): every send that starts a run makes one on the process's
    # one database thread.
    return rows.create(
        Run,
        chat=chat,
        model=chat.model or default_model(),
        kind=kind,
        thinking=thinking,
        heartbeat_at=dispatch_deadline(),
    )


def start_run_if_idle(chat: ChatSession) -> str | None:
    """Start a run for inputs left queued (e.g. after a run ended). Returns its id."""
    if not has_queued_inputs(chat.pk):
        return None  # the usual case, read without taking the write lock
    with transaction.atomic():
        if live_run(chat, lock=True) is not None:
            return None
        if not QueuedInput.objects.filter(chat=chat, consumed=False).exists():
            return None
        try:
            with transaction.atomic():
                run = new_run(chat)
        except IntegrityError:
            return None
        QueuedInput.objects.filter(chat=chat, consumed=False).update(run=run)
    return str(run.pk)


def start_stranded_runs() -> list[str]:
    """Start runs for messages queued behind a run that ended without starting the next.

    Inputs already given to a run (``run`` set) are that run's, answered or not, and
    never start another.
    """
    chat_ids = set(
        QueuedInput.objects.filter(consumed=False, run__isnull=True)
        .exclude(chat__runs__status__in=LIVE)
        .values_list("chat_id", flat=True)
    )
    started = []
    for chat in ChatSession.objects.filter(pk__in=chat_ids):
        run_id = start_run_if_idle(chat)
        if run_id:
            started.append(run_id)
    return started


def redispatch_undispatched(now=None) -> list[str]:
    """Runs handed over that no process claimed by their dispatch deadline: hand them over
    once more (the dispatch was lost: a Redis restart, a worker gone with it).

    The heartbeat moves to now, so a run still unclaimed a stale window later is
    recovered by :func:`recover_stale_runs` (as never started). Returns the runs to launch.
    """
    now = now or timezone.now()
    overdue = Run.objects.filter(
        status=Run.Status.RUNNING, claimed=False, redispatched=0, heartbeat_at__lt=now
    ).values_list("pk", flat=True)
    handed = []
    for run_id in list(overdue[:100]):
        if Run.objects.filter(
            pk=run_id, status=Run.Status.RUNNING, claimed=False, redispatched=0
        ).update(redispatched=1, heartbeat_at=now):
            handed.append(str(run_id))
    return handed


def unclaimed_runs(limit: int) -> list[str]:
    """Runs handed to the workers that no process has claimed yet, oldest first."""
    waiting = Run.objects.filter(status=Run.Status.RUNNING, claimed=False).order_by("started_at")
    return [str(pk) for pk in waiting.values_list("pk", flat=True)[:limit]]


# --- approvals ----------------------------------------------------------------------------------


def record_decision(approval: ToolApproval) -> str | None:
    """Write an approval's decision; the run to resume when it was the last one waited for."""
    decision = ev.ApprovalDecided(
        call_id=approval.call_id,
        name=approval.tool_name,
        decision=str(approval.status),
        reason=approval.reason,
    )
    rows = store.append_display(approval.chat_id, [stamp(decision, approval.run)])
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
            run_id = record_decision(approval)
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


def _close_pending_approvals(run: Run, reason: str) -> list[dict[str, Any]]:
    """Deny what the run still waits for; the ``approval_decided`` events that say so.

    Without the events a reloaded page would show Approve and Deny on a call nobody
    can answer any more.
    """
    # The look is written out (chat/rows.py): every run's end makes it, and most find none.
    names = ("id", "call_id", "tool_name")
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(rows.column(ToolApproval, n) for n in names)} "
            f"FROM {rows.table(ToolApproval)} WHERE {rows.column(ToolApproval, 'run')} = %s "
            f"AND {rows.column(ToolApproval, 'status')} = %s",
            [rows.prep(ToolApproval, "run", run.pk), str(ToolApproval.Status.PENDING)],
        )
        pending = [rows.convert(ToolApproval, names, row) for row in cursor.fetchall()]
    if not pending:
        return []
    ToolApproval.objects.filter(pk__in=[pk for pk, _call, _name in pending]).update(
        status=ToolApproval.Status.DENIED, reason=reason, decided_at=timezone.now()
    )
    return [
        stamp(
            ev.ApprovalDecided(
                call_id=call_id,
                name=tool_name,
                decision=str(ToolApproval.Status.DENIED),
                reason=reason,
            ),
            run,
        )
        for _pk, call_id, tool_name in pending
    ]


def _close_open_calls(run: Run, status: str) -> list[dict[str, Any]]:
    """``tool_end`` events for the run's tool calls that started and never ended."""
    ended = {
        "cancelled": "The reply was stopped before this tool call finished.",
        "failed": "The reply ended before this tool call finished.",
    }[status]
    return [
        stamp(ev.ToolEnd(call_id=call_id, name=name, output=ended, status=status), run)
        for call_id, name in store.open_tool_calls(run.chat_id, str(run.pk))
    ]


def finish_waiting_run_cancelled(run: Run) -> None:
    """Cancel a run that waits for the user: nothing executes it, so it ends right here."""
    payloads = _close_pending_approvals(run, "The reply was stopped.")
    run.status = Run.Status.CANCELLED
    run.finished_at = timezone.now()
    run.pending_message = None
    run.save(update_fields=["status", "finished_at", "pending_message"])
    payloads.append(stamp(ev.Cancelled(partial_text=""), run))
    rows = store.append_display(run.chat_id, payloads)
    ring(run.chat_id, rows)


def cancel_if_requested(run_id: str) -> None:
    """A cancel that arrived while the run was suspending ends it now.

    The watcher only sees cancels while the run executes; without this the cancel
    would be lost and the run would wait for an approval the user no longer wants.
    """
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .filter(pk=run_id, status=Run.Status.WAITING, cancel_requested=True)
            .first()
        )
        if run is not None:
            finish_waiting_run_cancelled(run)


# --- the end of a run -----------------------------------------------------------------------------


def finish_run(
    host: DjangoRunHost,
    status: str,
    event: ev.RunEvent,
    partials: list[ChatMessage],
    usage: Usage,
) -> bool:
    """Write the one terminal state and event of a run. False if it had ended already."""
    run = host.run
    with transaction.atomic():
        # Written out (chat/rows.py), as the other statements of a run's end: every run
        # makes them on the process's one database thread.
        updated = rows.update(
            Run,
            run.pk,
            _where_in=("status", LIVE),
            status=status,
            finished_at=timezone.now(),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            usage_estimated=usage.estimated,
            error_category=getattr(event, "category", ""),
            error_message=getattr(event, "message", ""),
            partial_text=getattr(event, "partial_text", ""),
            pending_message=None,
        )
        if not updated:
            return False
        record_run_usage(run, usage, status)  # the same budget as the relay (chat/relay)
        # A run that ended before taking the message that started it (an early cancel)
        # must not leave it for the next run to answer.
        consumed = rows.column(QueuedInput, "consumed")
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {rows.table(QueuedInput)} SET {consumed} = %s "
                f"WHERE {rows.column(QueuedInput, 'run')} = %s AND NOT {consumed}",
                [rows.prep(QueuedInput, "consumed", True), rows.prep(QueuedInput, "run", run.pk)],
            )
        closing = _close_pending_approvals(run, "The reply ended before an answer.")
        if status != Run.Status.COMPLETED:
            call_status = "cancelled" if status == Run.Status.CANCELLED else "failed"
            closing += _close_open_calls(run, call_status)
        for partial in partials:
            host.push_partial(partial)
        stamp_ms = store.now_ms()
        messages = [eventlog.msg_event(m, stamp_ms) for m in host.take_new_display()]
        _cut, context = store.context_due(host.channels.context, host.persisted)
        # One counter update and one insert for the messages, the end and the context.
        written = store.append_to_channels(
            run.chat_id,
            {store.DISPLAY: [*messages, *closing, stamp(event, run)], store.SESSION: context},
        )
        ring(run.chat_id, written[store.DISPLAY])
        setup.run_finished(run, status)
    return True


def finish_failed_early(run_id: str, message: str) -> None:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return
    host = DjangoRunHost(run, [])
    event = ev.Error(category=str(ErrorCategory.BAD_REQUEST), message=message)
    finish_run(host, Run.Status.FAILED, event, [], Usage())


def recover_stale_runs(*, everything: bool = False) -> list[str]:
    """Runs left running by a dead process become interrupted, keeping their checkpoint.

    ``everything`` is for start-up of the in-process runner, when no other process
    can be running them; otherwise only runs without a recent heartbeat count.
    """
    runs_to_recover = Run.objects.filter(status=Run.Status.RUNNING)
    if not everything:
        cutoff = timezone.now() - stale_after()
        runs_to_recover = runs_to_recover.filter(heartbeat_at__lt=cutoff) | runs_to_recover.filter(
            heartbeat_at__isnull=True, started_at__lt=cutoff
        )
    recovered = []
    for run in runs_to_recover.select_related("chat"):
        if _recover(run):
            recovered.append(str(run.pk))
    return recovered


def _recover(run: Run) -> bool:
    """End a run whose process is gone, from what it stored.

    A run that wrote its whole reply (the last message it wrote is a reply with no
    tool calls, and nothing was streamed after it) died between the reply and its
    terminal: it is completed, with that reply. Otherwise it is interrupted, and the
    error carries the text it streamed since, or else the reply it wrote last, so the
    API tells what the page shows.
    """
    host = DjangoRunHost(run, store.load_context(run.chat_id))
    written = _written_replies(run)
    # The partial reply is the round after the written ones, as the dead process had it:
    # numbered 0 again, an API follower took it for another reply and sent it twice.
    rounds = [int(m["extra"]["round"]) for m in written]
    host.round = max(rounds) + 1 if rounds else 0
    streamed, reasoning = run.partial_text, run.partial_reasoning
    last = pushed.last_pushed(run.pk)
    if pushed.newer_than_checkpoint(last, host.round, run.checkpoint_at):
        assert last is not None
        streamed, reasoning = last.text, last.reasoning  # what the pages were shown last
    text = streamed
    reply_written = (
        bool(written)
        and not written[-1].get("tool_calls")
        and not text
        and not reasoning
        and not store.open_tool_calls(run.chat_id, str(run.pk))
    )
    if reply_written:
        last_round = written[-1].get("extra", {}).get("round")
        reply = "\n\n".join(
            m.get("content") or "" for m in written if m.get("extra", {}).get("round") == last_round
        )
        usage = Usage(
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens or estimate_text_tokens(reply),
            estimated=True,
        )
        event: ev.RunEvent = ev.Complete(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            usage_estimated=True,
            text=reply,
        )
        return finish_run(host, Run.Status.COMPLETED, event, [], usage)
    never_started = not run.claimed and run.redispatched > 0 and not written and not text
    if not text and written:
        text = written[-1].get("content") or ""
    event = ev.Error(
        category=str(ErrorCategory.INTERRUPTED),
        message=NEVER_STARTED_MESSAGE if never_started else INTERRUPTED_MESSAGE,
        partial_text=text,
        status="interrupted",
    )
    # Only what was streamed and not yet written becomes a message; the rest is shown.
    partials = partial_message(streamed, reasoning, str(Run.Status.INTERRUPTED), run.speakers)
    return finish_run(host, Run.Status.INTERRUPTED, event, partials, Usage())


def _written_replies(run: Run) -> list[dict[str, Any]]:
    """The streamed replies the run wrote as messages (display payloads), oldest first."""
    return [
        e.payload
        for e in store.display_events_after(run.chat_id, 0)
        if e.kind == MSG
        and e.payload.get("role") == "assistant"
        and (e.payload.get("extra") or {}).get("run_id") == str(run.pk)
        and "round" in (e.payload.get("extra") or {})
    ]
