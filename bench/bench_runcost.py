"""What one run costs the server: statements, trips to the database thread, and time, by phase.

A run start was the bottleneck of a burst of sends (issue 16): every send, run claim,
reply commit and run end goes through one database thread per process. This script
runs chats in this process, the way Daphne runs them in process (the in-process runner,
the in-memory channel layer, the fake OpenAI server on loopback), and prints:

* statements per run, grouped by the outermost Lyceum function that made them
  (``send_message``, ``_claim_and_load``, ``_commit``, ``finish_run``, ...);
* trips to the database thread per run (``database_sync_to_async`` calls);
* database-thread and event-loop-thread CPU per run;
* for a burst of ``--burst`` sends at once: from each send to its run's end, p50 / p95.

Usage::

    .venv/bin/python bench/bench_runcost.py                 # SQLite
    .venv/bin/python bench/bench_runcost.py --postgres --burst 50
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_streams import percentile, server_env, setup_django, temporary_database  # noqa: E402

PROJECT_DIRS = (str(ROOT / "chat"), str(ROOT / "classroom"))


class StatementTally:
    """Counts statements by the outermost project function on the stack that made them."""

    def __init__(self) -> None:
        self.by_site: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.sql: collections.Counter[str] = collections.Counter()

    def __call__(self, execute, sql, params, many, context):
        self.total += 1
        site = self._site()
        self.by_site[site] += 1
        self.sql[f"{site.split(':')[-1]:24.24} {sql[:120]}"] += 1
        return execute(sql, params, many, context)

    @staticmethod
    def _site() -> str:
        # A walk up the frames, not traceback.extract_stack: that reads and stats the
        # source files, and its cost (about 0.2 ms a statement) was counted as the
        # database thread's.
        frame, depth, outer = sys._getframe(1), 0, None
        while frame is not None and depth < 60:
            if frame.f_code.co_filename.startswith(PROJECT_DIRS):
                outer = frame
            frame, depth = frame.f_back, depth + 1
        if outer is None:
            return "(other)"
        rel = Path(outer.f_code.co_filename).relative_to(ROOT)
        return f"{rel}:{outer.f_code.co_name}"


async def run_all(args: argparse.Namespace, base_url: str) -> None:
    from asgiref.sync import SyncToAsync
    from channels.db import database_sync_to_async
    from django.contrib.auth import get_user_model
    from django.db import connection

    from chat import actions
    from chat.models import Provider, ProviderModel, Run
    from chat.runhost import executor

    def make_fixtures(n: int) -> tuple[Any, list[Any]]:
        user = get_user_model().objects.create_user("bench", password="x" * 12)
        provider = Provider.objects.create(
            name="fake", kind="openai", base_url=base_url, api_key="sk-bench-0123456789"
        )
        ProviderModel.objects.create(
            provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
        )
        chats = [actions.new_chat(user, model="fake-model") for _ in range(n)]
        return user, chats

    total = args.runs + args.burst
    user, chats = await database_sync_to_async(make_fixtures)(total)

    trips = collections.Counter()
    original_call = SyncToAsync.__call__

    async def counting_call(self, *a, **kw):
        trips[getattr(self.func, "__qualname__", str(self.func))] += 1
        return await original_call(self, *a, **kw)

    SyncToAsync.__call__ = counting_call  # type: ignore[method-assign]

    # The database thread's CPU by the function of each trip (the polling apart).
    from channels.db import DatabaseSyncToAsync

    trip_cpu: collections.Counter[str] = collections.Counter()
    original_handler = DatabaseSyncToAsync.thread_handler

    def timing_handler(self, loop, *a, **kw):
        started = time.thread_time()
        try:
            return original_handler(self, loop, *a, **kw)
        finally:
            name = getattr(self.func, "__qualname__", str(self.func))
            trip_cpu[name] += time.thread_time() - started

    DatabaseSyncToAsync.thread_handler = timing_handler  # type: ignore[method-assign]

    # What of it renders the doorbells' fragments (on the database thread, by the trip).
    from chat.live import doorbell as doorbell_module
    from chat.runhost import host as host_module

    doorbell_cpu: collections.Counter[str] = collections.Counter()
    original_doorbell = doorbell_module.events_doorbell

    def timed_doorbell(chat_id, rows):
        started = time.thread_time()
        try:
            return original_doorbell(chat_id, rows)
        finally:
            doorbell_cpu[threading.current_thread().name] += time.thread_time() - started

    doorbell_module.events_doorbell = timed_doorbell
    host_module.events_doorbell = timed_doorbell

    tally = StatementTally()

    def install_tally() -> None:
        # Not ``execute_wrapper()``: its context manager would pop the tally when collected.
        connection.execute_wrappers.append(tally)

    await database_sync_to_async(install_tally)()

    def run_ended(run_id: str) -> bool:
        return Run.objects.filter(pk=run_id).exclude(status__in=["queued", "running"]).exists()

    async def one(chat, i: int) -> tuple[float, float]:
        """Send one message; (when it was sent, when its run had ended)."""
        sent_at = time.perf_counter()
        sent = await database_sync_to_async(actions.send_message)(
            user, chat.pk, f"hello {i}", uuid.uuid4().hex
        )
        while not await database_sync_to_async(run_ended)(str(sent.run_id)):
            await asyncio.sleep(0.005)
        return sent_at, time.perf_counter()

    # Sequential runs: the cost of one run with nothing else going on.
    cpu0_loop = time.thread_time()
    tally.total = 0
    tally.by_site.clear()
    tally.sql.clear()
    trips.clear()
    trip_cpu.clear()
    doorbell_cpu.clear()
    start = time.perf_counter()
    db_cpu0 = await database_sync_to_async(time.thread_time)()
    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
        await database_sync_to_async(profiler.enable)()
    for i in range(args.runs):
        await one(chats[i], i)
    db_cpu1 = await database_sync_to_async(time.thread_time)()
    if profiler is not None:
        await database_sync_to_async(profiler.disable)()
        profiler.dump_stats(args.cprofile)
        print(f"database thread profile: {args.cprofile}")
    elapsed = time.perf_counter() - start
    cpu_loop = time.thread_time() - cpu0_loop

    # The polling made statements and trips too: subtract them (one per poll).
    polls = trips.get("run_all.<locals>.run_ended", 0)
    runs = args.runs
    print(f"\n== one run at a time, {runs} runs ({args.tokens} tokens each)")
    print(f"wall per run                         {elapsed / runs * 1000:8.1f} ms")
    print(f"statements per run (w/o polling)     {(tally.total - polls) / runs:8.1f}")
    print(f"trips to the db thread per run       {(sum(trips.values()) - polls) / runs:8.1f}")
    print(f"db thread CPU per run (w/ polling)   {(db_cpu1 - db_cpu0) / runs * 1000:8.1f} ms")
    print(f"event-loop CPU per run (w/ polling)  {cpu_loop / runs * 1000:8.1f} ms")
    run_cpu = sum(v for k, v in trip_cpu.items() if "run_ended" not in k)
    print(f"db thread CPU per run (w/o polling)  {run_cpu / runs * 1000:8.1f} ms")
    loop_thread = threading.current_thread().name
    rendered = sum(v for k, v in doorbell_cpu.items() if k != loop_thread)
    print(f"  of it the doorbells' fragments       {rendered / runs * 1000:8.1f} ms")
    print("\nstatements per run, by outermost Lyceum function:")
    for site, count in tally.by_site.most_common(25):
        if "run_ended" in site or "bench_runcost" in site:
            continue
        print(f"  {count / runs:6.1f}  {site}")
    print("\ntrips per run, by function (and their database-thread CPU per run):")
    for name, count in trips.most_common(20):
        if "run_ended" in name:
            continue
        print(f"  {count / runs:6.1f}  {trip_cpu.get(name, 0.0) / runs * 1000:6.2f} ms  {name}")
    if args.sql:
        print("\nstatements (all runs):")
        for sql, count in tally.sql.most_common(40):
            print(f"  {count:5d}  {sql}")

    if args.burst:
        ends = await asyncio.gather(*(one(chats[runs + i], runs + i) for i in range(args.burst)))
        firsts = sorted(f - s for s, f in ends)
        print(f"\n== a burst of {args.burst} sends at once")
        print(
            f"send -> run ended, p50 / p95          "
            f"{percentile(firsts, 50) * 1000:.0f} / {percentile(firsts, 95) * 1000:.0f} ms"
        )
    await executor.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs one at a time (30)")
    parser.add_argument("--burst", type=int, default=0, help="then this many sends at once")
    parser.add_argument("--tokens", type=int, default=20, help="tokens per reply (20)")
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--sql", action="store_true", help="list the statements")
    parser.add_argument("--cprofile", metavar="FILE", help="cProfile the database thread")
    args = parser.parse_args()

    from tests.fakeopenai import FakeOpenAI, Script

    with tempfile.TemporaryDirectory(prefix="lyceum-runcost-") as tmp:
        workdir = Path(tmp)
        with temporary_database(workdir, args.postgres) as db_env:
            env = server_env(
                db_env,
                workdir,
                LYCEUM_RUNNER="inprocess",
                LYCEUM_GENERATE_TITLES="0",
            )
            setup_django(env)
            with FakeOpenAI() as server:
                server.default = Script(text=" ".join(f"w{i}" for i in range(args.tokens)))
                asyncio.run(run_all(args, server.base_url))


if __name__ == "__main__":
    main()
