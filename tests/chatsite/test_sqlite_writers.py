"""chatsite.sqlite: writers of one SQLite file queue on a lock in the kernel, not on
SQLite's busy timeout (which sleeps between tries, and at zero fails at once)."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from django.db import connections
from django.db.utils import OperationalError

from chatsite.sqlite.base import DatabaseWrapper


def _wrapper(path, alias: str) -> DatabaseWrapper:
    """A connection of the project's backend to ``path`` with no busy timeout at all: any
    wait is the writer lock's (two of them stand for two processes)."""
    settings = dict(connections["default"].settings_dict)
    settings.update(NAME=str(path), OPTIONS={**settings["OPTIONS"], "timeout": 0})
    wrapper = DatabaseWrapper(settings, alias)
    wrapper.inc_thread_sharing()
    return wrapper


def _begin(wrapper: DatabaseWrapper) -> None:
    """What ``atomic`` does on entering on SQLite (``atomic`` looks its alias up in
    ``connections``, which these two are not in)."""
    wrapper.ensure_connection()
    wrapper._start_transaction_under_autocommit()
    wrapper.autocommit = False


def _commit(wrapper: DatabaseWrapper) -> None:
    wrapper.commit()
    wrapper.autocommit = True


@pytest.fixture(autouse=True)
def _own_files(django_db_blocker):
    """These tests open their own database files, not the test database."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture
def two_connections(tmp_path):
    a, b = _wrapper(tmp_path / "w.sqlite3", "a"), _wrapper(tmp_path / "w.sqlite3", "b")
    with a.cursor() as cursor:
        cursor.execute("CREATE TABLE counter (n INTEGER)")
        cursor.execute("INSERT INTO counter VALUES (0)")
    yield a, b
    a.close()
    b.close()


def _hold_a_transaction(a: DatabaseWrapper, held: threading.Event, seconds: float) -> None:
    _begin(a)
    with a.cursor() as cursor:
        cursor.execute("UPDATE counter SET n = n + 1")
    held.set()
    time.sleep(seconds)
    _commit(a)


@pytest.mark.parametrize("in_transaction", [True, False])
def test_a_second_writer_waits_for_the_first_instead_of_failing(two_connections, in_transaction):
    a, b = two_connections
    held = threading.Event()
    holder = threading.Thread(target=_hold_a_transaction, args=(a, held, 0.3))
    holder.start()
    assert held.wait(5)
    started = time.monotonic()
    if in_transaction:
        _begin(b)
    with b.cursor() as cursor:  # outside a transaction: the statement's own
        cursor.execute("UPDATE counter SET n = n + 10")
    if in_transaction:
        _commit(b)
    waited = time.monotonic() - started
    holder.join()
    with b.cursor() as cursor:
        cursor.execute("SELECT n FROM counter")
        assert cursor.fetchone() == (11,)  # both writes, neither lost
    assert waited > 0.1  # it waited for the first writer's commit


def test_without_the_lock_the_second_writer_is_refused(tmp_path):
    """What the lock saves (the other side of the test above): a plain second writer with
    no busy timeout is refused while the first holds SQLite's write lock."""
    path = tmp_path / "plain.sqlite3"
    first = sqlite3.connect(path, isolation_level=None, timeout=0)
    first.execute("PRAGMA journal_mode=WAL")
    first.execute("CREATE TABLE counter (n INTEGER)")
    first.execute("BEGIN IMMEDIATE")
    second = sqlite3.connect(path, isolation_level=None, timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        second.execute("INSERT INTO counter VALUES (1)")
    first.execute("ROLLBACK")
    first.close()
    second.close()


def test_a_failed_begin_or_a_rollback_lets_the_lock_go(two_connections, monkeypatch):
    a, b = two_connections
    from django.db.backends.sqlite3 import base

    def refuse(self):
        raise OperationalError("no")

    with monkeypatch.context() as patch:
        patch.setattr(base.DatabaseWrapper, "_start_transaction_under_autocommit", refuse)
        with pytest.raises(OperationalError):
            _begin(a)
    _begin(a)
    a.rollback()
    a.autocommit = True
    lock = a.writer_lock()
    assert lock is not None and not lock.held
    _begin(b)  # not stuck behind a
    with b.cursor() as cursor:
        cursor.execute("UPDATE counter SET n = 5")
    _commit(b)
