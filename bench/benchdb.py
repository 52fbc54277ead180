"""The database set-up the data benchmarks share (``bench_longchat``, ``bench_search``).

:func:`django_database` makes a temporary folder and a fresh, empty database (SQLite
there, or PostgreSQL), configures Django in this process and migrates; afterwards both
are removed. :func:`analyze` gives PostgreSQL's planner the statistics autovacuum would
keep on a live server.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench_streams import server_env, setup_django, temporary_database


@contextlib.contextmanager
def django_database(prefix: str, postgres: bool) -> Iterator[Path]:
    """Django configured on a fresh migrated database for the block; yields the work folder."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with temporary_database(workdir, postgres) as db_env:
            setup_django(server_env(db_env, workdir))
            yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def analyze() -> None:
    """Planner statistics, as autovacuum keeps them on a live PostgreSQL database.

    Without them the planner still thinks freshly filled tables are empty (for a long
    chat it sorts every event for "the newest 200" instead of walking the index
    backwards; for search it guesses how many messages hold a word)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
