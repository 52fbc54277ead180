"""Deterministic counts of the long chat's resync replay, for comparing two trees.

Run from a tree's root: ``.venv/bin/python bench/replay_counts.py [--tree PATH]``.
``--tree`` (default: the current directory) names the checkout whose code is measured:
its ``bench/bench_longchat.py`` builds the chat (10,000 messages, the same seed as that
bench) and its ``next_batch`` (``chat.presentation.fragments`` now, ``chat.live`` before
issue 16's work) replays. So one copy of this file measures an older tree as it stands.

Prints, for a client 1,000 events behind (the bench's replay, ``next_batch`` until a
short batch), the figures that do not move with the box's speed: SQL statements (by
shape), Python function calls under cProfile (total and the top callees), bytes of HTML,
template renders; and the thread's CPU (``time.thread_time``), median of ``--runs``,
each beside a yardstick: a fixed pure-Python loop's thread CPU, for the box's speed.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path


def _tree_imports(tree: Path) -> None:
    for path in (tree / "bench", tree):
        sys.path.insert(0, str(path))


def _database(postgres: bool):
    try:
        from benchdb import django_database  # main

        return django_database("lyceum-replay-counts-", postgres)
    except ImportError:  # 6db9e04: the bench made its own
        import contextlib

        from bench_streams import server_env, setup_django, temporary_database

        @contextlib.contextmanager
        def older():
            workdir = Path(tempfile.mkdtemp(prefix="lyceum-replay-counts-"))
            try:
                with temporary_database(workdir, postgres) as db_env:
                    setup_django(server_env(db_env, workdir))
                    yield workdir
            finally:
                shutil.rmtree(workdir, ignore_errors=True)

        return older()


def yardstick_ms() -> float:
    """CPU of a fixed pure-Python workload: the box's speed, read beside the figure."""
    start = time.thread_time()
    total = 0
    for n in range(300_000):
        total += n % 7
    return (time.thread_time() - start) * 1000


def _shape(sql: str) -> str:
    sql = re.sub(r"'[^']*'", "?", sql)
    sql = re.sub(r"\b\d+\b", "?", sql)
    return re.sub(r"\s+", " ", sql)[:160]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=Path.cwd())
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--behind", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--top", type=int, default=25, help="callees listed from cProfile")
    parser.add_argument("--dump", type=Path, help="write the replay's cProfile stats here")
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    _tree_imports(tree)

    with _database(args.postgres):
        import bench_longchat
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.template import Template
        from django.test.utils import CaptureQueriesContext

        from chat import store

        owner = get_user_model().objects.create_user("replay", password="bench-pass-1")
        chat_id = bench_longchat.build_chat(owner, args.messages, seed=args.messages)
        last = store.last_display_seq(chat_id)
        start_seq = last - args.behind

        def replay():
            return bench_longchat.replay(chat_id, start_seq)

        for _ in range(3):  # warm: the caches a running server has
            replay()

        with CaptureQueriesContext(connection) as queries:
            events, batches, size = replay()
        shapes = Counter(_shape(q["sql"]) for q in queries.captured_queries)

        renders = Counter()
        original = Template.render

        def counting(self, context):
            renders[getattr(self.origin, "template_name", None) or "?"] += 1
            return original(self, context)

        Template.render = counting  # type: ignore[method-assign]
        try:
            replay()
        finally:
            Template.render = original  # type: ignore[method-assign]

        profiler = cProfile.Profile()
        profiler.enable()
        replay()
        profiler.disable()
        stats = pstats.Stats(profiler)
        if args.dump:
            stats.dump_stats(args.dump)
        total_calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
        primitive = sum(v[0] for v in stats.stats.values())  # type: ignore[attr-defined]

        cpu, wall, sticks = [], [], []
        for _ in range(args.runs):
            sticks.append(yardstick_ms())
            started, started_wall = time.thread_time(), time.perf_counter()
            replay()
            cpu.append((time.thread_time() - started) * 1000)
            wall.append((time.perf_counter() - started_wall) * 1000)

    print(f"tree {tree}  ({'PostgreSQL' if args.postgres else 'SQLite'})")
    print(
        f"replay {args.behind} behind of {last} display events: {events} events, "
        f"{batches} batches, {size:,} bytes of HTML"
    )
    print(f"SQL statements: {len(queries)}")
    for shape, count in shapes.most_common():
        print(f"  {count:3d} x {shape}")
    print(f"template renders: {sum(renders.values())}")
    for name, count in renders.most_common():
        print(f"  {count:4d} x {name}")
    print(f"Python function calls (cProfile): {total_calls:,} ({primitive:,} primitive)")
    print(
        f"thread CPU median {statistics.median(cpu):.1f} ms, min {min(cpu):.1f} ms; wall "
        f"median {statistics.median(wall):.1f} ms; yardstick median "
        f"{statistics.median(sticks):.1f} ms ({args.runs} runs)"
    )
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main(sys.argv[1:])
