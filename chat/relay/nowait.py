"""The relay's database admission in the event loop itself, when it needs no wait.

With the limits in SQLite a request was admitted on the process's database thread, and
that costs a hand-over each way: the thread starts only once the event loop lets the GIL
go (after the upstream's connect, which is the loop's Python), and the loop learns the
answer a turn later. 0.17 ms of admission became about 1.2 ms of first-token time
(bench/README.md, "Stop 22"). Here the event loop's thread admits on a SQLite connection
of its own (one per thread and database file): the same reads and updates as
``limits._db_admit``, in one ``BEGIN IMMEDIATE`` transaction, under the same writer lock
that every Lyceum connection to the file takes (``chatsite/sqlite/base.py``) -- but never
waiting for it: the lock is tried without blocking and SQLite's busy timeout is 0.

Whenever it would have to wait (another writer, of this process or another, holds the
lock), or a counter is still to be created (seeded from the usage records), or a policy
has a lockout (the doors'), or anything fails, nothing is taken and :func:`admit`
answers None: the caller admits on the database thread as before. The limits stay exact
as SQLite makes them: every taker of a counter holds the database's write lock from its
read to its commit, whichever connection or process it is.

Only for SQLite databases in a file in WAL mode (a reader never blocks the commit, and no
commit here runs a checkpoint: the other connections do), and only with the limits in
the database (no ``REDIS_URL``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings

from chat.models import UsageCounter
from chat.relay import limits

RETRY_SECONDS = 5.0  # a database found unsuitable (not WAL, not there) is tried again after


class _Line:
    """One thread's own connection to one SQLite file, and its writer lock."""

    def __init__(self, name: str, locked: bool) -> None:
        self.name = name
        self.pid = os.getpid()
        # mode=rw: a database not created yet is not created here.
        uri = f"file:{quote(name)}?mode=rw"
        self.conn = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None)
        try:
            mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"journal mode {mode}, not WAL")
            # As the app's connections (settings.py), and no checkpoint in the event loop.
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA wal_autocheckpoint=0")
        except BaseException:
            self.conn.close()
            raise
        self.lock: Any = None
        if locked:
            from chatsite.sqlite.base import WriterLock

            self.lock = WriterLock(f"{name}-writer")
        self.table = '"' + UsageCounter._meta.db_table + '"'

    def close(self) -> None:
        if self.pid == os.getpid():  # a forked child leaves its parent's connection alone
            self.conn.close()
            if self.lock is not None:
                self.lock.close()


class _State(threading.local):
    line: _Line | None = None
    unsuitable: tuple[str, float] | None = None  # a database name, and when it was found so


_state = _State()
_inherited: list[_Line] = []  # a parent's lines after a fork: kept open, never used


def _database() -> tuple[str, bool] | None:
    """The default database's file and whether its connections take the writer lock, when
    it is SQLite in a file; else None."""
    db = settings.DATABASES["default"]
    engine = db.get("ENGINE", "")
    if engine not in ("chatsite.sqlite", "django.db.backends.sqlite3"):
        return None
    name = str(db.get("NAME") or "")
    if not name or name == ":memory:" or "mode=memory" in name:
        return None
    return name, engine == "chatsite.sqlite"


def _line() -> _Line | None:
    database = _database()
    if database is None:
        return None
    name, locked = database
    state = _state
    line = state.line
    if line is not None and line.pid != os.getpid():
        _inherited.append(line)
        line = state.line = None
    if line is not None and line.name == name:
        return line
    if line is not None:
        line.close()
        state.line = None
    unsuitable = state.unsuitable
    if unsuitable and unsuitable[0] == name and time.monotonic() - unsuitable[1] < RETRY_SECONDS:
        return None
    try:
        if not Path(name).exists():
            raise sqlite3.OperationalError("no database file")
        state.line = _Line(name, locked)
    except sqlite3.Error:
        state.unsuitable = (name, time.monotonic())
        return None
    state.unsuitable = None
    return state.line


def _drop() -> None:
    line, _state.line = _state.line, None
    if line is not None:
        with contextlib.suppress(sqlite3.Error):
            line.close()


def admit(policies: list[limits.Policy], cost: int) -> limits.Admission | None:
    """Take one request from every bucket and hold ``cost`` tokens now, in this thread, or
    raise :class:`limits.Refused`; None when that would mean waiting or it cannot be done
    here (nothing was taken: admit on the database thread)."""
    if settings.REDIS_URL or any(policy.lockout for policy in policies):
        return None
    line = _line()
    if line is None:
        return None
    lock = line.lock
    if lock is not None and not lock.try_acquire():
        return None  # another writer holds the database
    period = limits.period_of()
    conn = line.conn
    try:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return None  # SQLite's own lock is taken (a writer outside the lock)
        try:
            counters = _counters(conn, line.table, policies, period)
            if counters is None:
                conn.execute("ROLLBACK")
                return None  # a counter to create: the database thread seeds it
            now = time.time()
            levels, _shut, wait, reason = limits._verdict(policies, counters, now, cost, True)
            if reason:
                conn.execute("ROLLBACK")
                raise limits._refusal(reason, wait)
            statements = limits._take_statements(
                line.table, "?", policies, counters, levels, now, cost, True, True
            )
            for sql, params in statements:
                conn.execute(sql, params)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.Error:
        # Not committed (SQLite rolls back what fails to commit): nothing was taken.
        _drop()
        return None
    finally:
        if lock is not None:
            lock.release()
    return limits.Admission(policies, period, cost)


def _counters(
    conn: sqlite3.Connection, table: str, policies: list[limits.Policy], period: str
) -> list[limits.Counter] | None:
    scopes = [policy.scope for policy in policies]
    sql = (
        "SELECT scope, id, used_tokens, reserved_tokens, bucket, bucket_at, locked_until "  # noqa: S608
        f"FROM {table} WHERE period = ? AND scope IN ({', '.join(['?'] * len(scopes))})"
    )
    found = {row[0]: tuple(row[1:]) for row in conn.execute(sql, [period, *scopes])}
    if len(found) < len(scopes):
        return None
    return [found[scope] for scope in scopes]  # type: ignore[misc]


def close() -> None:
    """Close this thread's connection (tests; it is opened again when next needed)."""
    _drop()
    _state.unsuitable = None
