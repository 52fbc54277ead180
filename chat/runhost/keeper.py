"""The bookkeeping of every run a process executes, in one database job per interval.

Each executing run needs three things from the database now and then: its reply so far
saved (the checkpoint a restart keeps), its heartbeat written (so another process can
tell it from a dead one), and its cancel flag read (the fallback when the cancel
doorbell was lost). Done run by run, a hundred streaming runs made 150 small
transactions a second on the process's one database thread, and every other database
call of the process (and, through the GIL, every socket write) queued behind them.
The keeper does them for all runs together: one transaction per
``LYCEUM_CHECKPOINT_INTERVAL``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from chat.models import Run

logger = logging.getLogger(__name__)


@dataclass
class KeptRun:
    """A run this process executes, as the keeper sees it."""

    partial: Callable[[], tuple[str, str]]  # the reply so far: text and reasoning
    checkpointed: tuple[str, str] = ("", "")
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Checkpoint:
    run_id: str
    text: str
    reasoning: str


class RunKeeper:
    """Checkpoints, heartbeats and cancel checks for the runs of one event loop."""

    def __init__(self) -> None:
        self.runs: dict[str, KeptRun] = {}
        self._task: asyncio.Task | None = None

    def keep(self, run_id: str, partial: Callable[[], tuple[str, str]]) -> KeptRun:
        kept = self.runs[run_id] = KeptRun(partial)
        if self._task is None or self._task.done():
            # A fresh context: the caller's (a request's, a socket's) may be gone by the
            # time the keeper's database calls run.
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._keep_while_running(), context=contextvars.Context())
        return kept

    def release(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    async def stop(self) -> None:
        task, self._task = self._task, None
        self.runs.clear()
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _keep_while_running(self) -> None:
        # Beat at least three times within the stale window, whatever the checkpoints do.
        interval = min(settings.LYCEUM_CHECKPOINT_INTERVAL, settings.LYCEUM_RUN_STALE_SECONDS / 3)
        while self.runs:
            await asyncio.sleep(interval)
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - the next tick writes everything again
                logger.warning("run bookkeeping failed", exc_info=True)

    async def tick(self) -> None:
        """Save changed replies, beat every run, and flag the runs asked to cancel."""
        kept = dict(self.runs)
        if not kept:
            return
        checkpoints = []
        for run_id, run in kept.items():
            partial = run.partial()
            if partial != run.checkpointed:
                checkpoints.append((run, Checkpoint(run_id, *partial)))
        cancelled = await database_sync_to_async(keep_runs)(
            list(kept), [checkpoint for _run, checkpoint in checkpoints]
        )
        for run, checkpoint in checkpoints:
            run.checkpointed = (checkpoint.text, checkpoint.reasoning)
        for run_id in cancelled:
            kept[run_id].cancel_requested.set()


def keep_runs(run_ids: list[str], checkpoints: list[Checkpoint]) -> set[str]:
    """One transaction: checkpoints and heartbeats of running runs; the ids asked to cancel.

    Only runs still running are written: a late checkpoint must not refill a run that
    has ended or waits for approval.
    """
    now = timezone.now()
    with transaction.atomic():
        if checkpoints:
            _write_checkpoints(checkpoints, now)
        running = Run.objects.filter(pk__in=run_ids, status=Run.Status.RUNNING)
        running.update(heartbeat_at=now)
        cancelled = Run.objects.filter(pk__in=run_ids, cancel_requested=True)
        return {str(pk) for pk in cancelled.values_list("pk", flat=True)}


def _write_checkpoints(checkpoints: list[Checkpoint], now) -> None:
    # One prepared statement for all of them: the ORM would compile one UPDATE per run.
    quote = connection.ops.quote_name
    opts = Run._meta
    sql = (
        f"UPDATE {quote(opts.db_table)} SET {quote('partial_text')} = %s, "
        f"{quote('partial_reasoning')} = %s, {quote('checkpoint_at')} = %s "
        f"WHERE {quote(opts.pk.column)} = %s AND {quote('status')} = %s"
    )
    at = opts.get_field("checkpoint_at").get_db_prep_value(now, connection)
    pk = opts.pk
    rows = [
        (c.text, c.reasoning, at, pk.get_db_prep_value(c.run_id, connection), Run.Status.RUNNING)
        for c in checkpoints
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


_keepers: dict[asyncio.AbstractEventLoop, RunKeeper] = {}


def keeper() -> RunKeeper:
    """The keeper of the running event loop (tests run several loops, one after another)."""
    loop = asyncio.get_running_loop()
    found = _keepers.get(loop)
    if found is None:
        for old in [old for old in _keepers if old.is_closed()]:
            del _keepers[old]
        found = _keepers[loop] = RunKeeper()
    return found
