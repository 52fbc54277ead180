"""The relay's usage records, written in batches: one transaction per interval per process.

Written one by one, each record (with its settled limits and its keys' counters) was a
transaction on the process's one database thread, 11-13 ms of it: a hundred streams
ending together queued for more than a second, and every other database call of the
process behind them. The writer keeps what finished requests leave (a record, the
admission to settle, the keys' attempts, the exchange to store) and writes everything
kept in one transaction every ``LYCEUM_RELAY_USAGE_FLUSH`` seconds (0.2 by default), the
way ``chat/runhost/keeper.py`` does for checkpoints.

Nothing kept is dropped: a batch that fails is written again item by item (one bad item
does not take the others with it) and what still fails is kept for the next flush; the
process flushes what it holds when it exits (``atexit``). :func:`flush` writes now (tests,
shutdown code).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections, transaction

from chat.models import UsageRecord
from chat.relay import limits, pool, quiet

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 5  # flushes an item may fail before it is logged in full and given up


@dataclass
class Item:
    record: UsageRecord  # unsaved
    admission: limits.Admission | None = None
    used: int = 0
    attempts: list[pool.KeyOutcome] = field(default_factory=list)
    exchange: tuple[Any, ...] | None = None  # record_relay_exchange's arguments
    failures: int = 0


class UsageWriter:
    def __init__(self) -> None:
        self._items: list[Item] = []
        self._lock = threading.Lock()  # add() runs on the loop and on the database thread
        self._flushing = threading.Lock()
        self._task: asyncio.Task[None] | None = None

    def add(self, item: Item) -> None:
        with self._lock:
            self._items.append(item)

    def pending(self) -> int:
        with self._lock:
            return len(self._items)

    def ensure_running(self) -> None:
        """Start this event loop's flusher (call from the loop; cheap when it runs)."""
        task = self._task
        if task is not None and not task.done():
            return
        loop = asyncio.get_running_loop()
        # A fresh context: the database calls go to the process's own database thread.
        self._task = loop.create_task(self._run(), context=contextvars.Context())

    async def _run(self) -> None:
        interval = float(getattr(settings, "LYCEUM_RELAY_USAGE_FLUSH", 0.2))
        while True:
            await asyncio.sleep(interval)
            if self._items:
                await quiet.moment()
                try:
                    await database_sync_to_async(self.flush)()
                except Exception:  # noqa: BLE001 - kept items are written next time
                    logger.exception("writing the relay's usage records failed")

    def flush(self) -> int:
        """Write everything kept (sync: the database thread, a test, exit). Items written."""
        with self._flushing:
            with self._lock:
                items, self._items = self._items, []
            if not items:
                return 0
            try:
                self._write(items)
                written = items
            except Exception:  # noqa: BLE001 - one by one, so one bad item fails alone
                logger.warning("a batch of %d usage records failed; item by item", len(items))
                written = []
                for item in items:
                    try:
                        self._write([item])
                        written.append(item)
                    except Exception:  # noqa: BLE001
                        item.failures += 1
                        if item.failures >= MAX_ATTEMPTS:
                            logger.exception("usage record given up: %r", vars(item.record))
                        else:
                            logger.warning("usage record kept for the next flush", exc_info=True)
                            self.add(item)
            self._store_exchanges(written)
            return len(written)

    @staticmethod
    def _write(items: list[Item]) -> None:
        settled = [(item.admission, item.used) for item in items if item.admission is not None]
        in_redis = bool(settings.REDIS_URL)
        try:
            with transaction.atomic():
                UsageRecord.objects.bulk_create([item.record for item in items])
                if not in_redis:  # the counters are rows: in the same transaction
                    limits.settle_many(settled)
                pool.record_outcomes([a for item in items for a in item.attempts])
        except BaseException:
            for admission, _used in settled:
                admission.settled = False  # rolled back: settled again with the retry
            raise
        if in_redis:  # once the records are in (a retry must not count twice)
            try:
                limits.settle_many(settled)
            except Exception:
                logger.exception("settling %d relay admissions in Redis failed", len(settled))

    @staticmethod
    def _store_exchanges(items: list[Item]) -> None:
        from chat import actions

        for item in items:
            if item.exchange is None:
                continue
            try:
                actions.record_relay_exchange(*item.exchange)
            except Exception:
                logger.exception("storing the relay exchange of a session_key failed")


writer = UsageWriter()


def flush() -> int:
    return writer.flush()


def _flush_at_exit() -> None:
    if not writer.pending():
        return
    try:
        close_old_connections()
        writer.flush()
    except Exception:  # noqa: BLE001 - the process is ending; say what was lost
        logger.exception("the relay's last usage records could not be written at exit")


atexit.register(_flush_at_exit)
