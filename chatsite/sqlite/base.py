"""SQLite with its writers queued in the kernel instead of on SQLite's busy timeout.

Two processes writing one SQLite file (Daphne and a ``runworker``) meet on SQLite's write
lock. A writer that finds it taken waits in SQLite's busy handler, which sleeps and tries
again: 1, 2, 5, 10, 15, 20, 25 ms and on up to 100 ms a try, whether or not the lock came
free meanwhile. Each process reaches the database from one thread, so while that thread
sleeps every other database job of the process waits behind it: with 200 streams a send
waited seconds for its first token (bench_streams, Redis and one worker).

Here every write transaction (``BEGIN IMMEDIATE``, what ``atomic`` starts) and every write
statement outside one first takes an exclusive ``flock`` on a file beside the database
(``<name>-writer``). A waiter blocks in the kernel and is woken the moment the holder lets
go; SQLite's own lock is then free, so its busy handler does not sleep. An in-memory
database has no file and keeps SQLite's way.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from django.db.backends.sqlite3 import base

# Statements that write: they take SQLite's write lock when run outside a transaction
# (a WITH that writes is left to the busy timeout: the app has none).
_WRITES = ("insert", "update", "delete", "replace")


class WriterLock:
    """An exclusive ``flock`` on one file, per connection (a descriptor of its own, so two
    connections of one process exclude each other as two processes do)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self.held = False

    def acquire(self) -> None:
        if self.held:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # lets the GIL go while it waits
        self.held = True

    def try_acquire(self) -> bool:
        """Take the lock if it is free now, never waiting (the event loop's admissions,
        ``chat/relay/nowait.py``); False when another connection holds it."""
        if self.held:
            return True
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            assert self._fd is not None
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LockingCursorWrapper(base.SQLiteCursorWrapper):
    writer: DatabaseWrapper

    def execute(self, query: str, params: Any = None) -> Any:
        if self.writer.needs_statement_lock(query):
            with self.writer.statement_lock():
                return super().execute(query, params)
        return super().execute(query, params)

    def executemany(self, query: str, param_list: Any) -> Any:
        if self.writer.needs_statement_lock(query):
            with self.writer.statement_lock():
                return super().executemany(query, param_list)
        return super().executemany(query, param_list)


class _StatementLock:
    def __init__(self, lock: WriterLock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


class DatabaseWrapper(base.DatabaseWrapper):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._writer_lock: WriterLock | None = None

    def writer_lock(self) -> WriterLock | None:
        if self._writer_lock is None and not self.is_in_memory_db():
            self._writer_lock = WriterLock(f"{self.settings_dict['NAME']}-writer")
        return self._writer_lock

    def create_cursor(self, name: str | None = None) -> Any:
        cursor = self.connection.cursor(factory=LockingCursorWrapper)
        cursor.writer = self
        return cursor

    def needs_statement_lock(self, query: str) -> bool:
        """A write outside a transaction (autocommit): its own implicit transaction."""
        if self.in_atomic_block or self._writer_lock is not None and self._writer_lock.held:
            return False
        # The head only: every statement passes here, and a query may be long.
        return (
            query[:32].lstrip()[:7].lower().startswith(_WRITES) and self.writer_lock() is not None
        )

    def statement_lock(self) -> _StatementLock:
        lock = self.writer_lock()
        assert lock is not None
        return _StatementLock(lock)

    def _start_transaction_under_autocommit(self) -> None:
        lock = self.writer_lock()
        if lock is None:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
            return
        lock.acquire()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]
        except BaseException:
            lock.release()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]
        finally:
            self._release_writer()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]
        finally:
            self._release_writer()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]
        finally:
            if self._writer_lock is not None:
                self._writer_lock.close()
                self._writer_lock = None

    def _release_writer(self) -> None:
        if self._writer_lock is not None:
            self._writer_lock.release()
