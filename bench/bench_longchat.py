"""Long chats: page render time and resync replay cost, 10 vs 10,000 display messages.

Run: ``.venv/bin/python bench/bench_longchat.py [--postgres] [--runs 15]``
(from the repository root; ``--help`` lists every option).

It builds chats directly with ``chat.store`` in a fresh temporary database (SQLite via
``SQLITE_PATH``, or PostgreSQL with ``--postgres``), written the way runs write them: each
turn is a user message, run events (``run_start``, ``iteration_start``,
``context_usage``), usually an assistant tool call with reasoning, ``tool_start`` /
``tool_end``, the tool result, and a final assistant reply in markdown with a fenced code
block, then ``complete``. "10 messages" and "10,000 messages" count ``msg`` events; the
display log holds about three times as many events in all. The session channel (what
the model sees) is written too.

Figures:

* ``page``: server time of ``GET /chat/<id>/`` through Django's test ``Client``
  (in-process, DEBUG off, the whole middleware stack and template), median and p90 of
  ``--runs`` requests after a warm-up; plus its SQL query count, SQL time and size. Targets from
  the issue: the 10,000-message page within 1.5x of the 10-message page, and < 150 ms.
* ``replay``: what the chat socket does for a client 1,000 events behind (a reconnect
  after a long sleep): ``store.display_events_after`` + ``fragments.fragments_for_events`` in
  batches of 200, exactly as ``ChatConsumer._push_new_events`` loops; median over the
  runs, with the bytes it would send.

On PostgreSQL the database is ``ANALYZE``d after the chats are built, as autovacuum would
do on a live server (``--no-analyze`` shows the planner without statistics).

Static files are served by the plain storage here (no ``collectstatic`` in a temporary
run; the manifest storage of production only changes the URLs in the page).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_streams: shared helpers

from bench_streams import percentile  # noqa: E402
from benchdb import analyze, django_database  # noqa: E402

TARGET_RATIO = 1.5
TARGET_PAGE_MS = 150.0
WORDS = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "then",
    "runs",
    "the",
    "tests",
    "and",
    "reports",
    "what",
    "changed",
    "in",
    "the",
    "module",
    "because",
    "the",
    "window",
    "keeps",
    "recent",
    "messages",
    "while",
    "older",
    "tool",
    "results",
    "become",
    "short",
    "placeholders",
    "so",
    "the",
    "model",
    "sees",
    "the",
    "summary",
    "and",
    "every",
    "user",
    "still",
    "sees",
    "the",
    "history",
]
TOOLS = ["read_file", "list_files", "calculator", "current_time", "write_file"]


# --- building a chat ------------------------------------------------------------------------------


def _sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def _markdown_reply(rng: random.Random, turn: int) -> str:
    """A typical answer: heading, prose with emphasis, a list, a code block, a table."""
    code = "\n".join(f"    total += item.price * {rng.randint(1, 9)}  # line {n}" for n in range(8))
    return (
        f"## Step {turn}\n\n{_sentence(rng, 40)} **{rng.choice(WORDS)}** and `{rng.choice(TOOLS)}`"
        f" matter here.\n\n- {_sentence(rng, 10)}\n- {_sentence(rng, 12)}\n- {_sentence(rng, 8)}"
        f"\n\n```python\ndef total_{turn}(items):\n    total = 0\n    for item in items:\n"
        f"{code}\n    return total\n```\n\n| name | value |\n|---|---|\n| a | {turn} |\n"
        f"| b | {turn * 7} |\n\n{_sentence(rng, 25)}"
    )


class ChatWriter:
    """Appends display (and session) events for one chat the way a run would."""

    def __init__(self, chat_id: str, run_id: str) -> None:
        from chat.core.channels import LiveChannels

        self.chat_id = chat_id
        self.run_id = run_id
        self.display: list[dict[str, Any]] = []
        self.channels = LiveChannels()
        self.messages = 0

    def message(self, message) -> None:
        from chat import store
        from chat.core import eventlog

        self.channels.push_both(message)
        message.extra.setdefault("run_id", self.run_id)
        self.display.append(eventlog.msg_event(message, store.now_ms()))
        self.messages += 1

    def event(self, event) -> None:
        event.chat_id, event.run_id = self.chat_id, self.run_id
        payload = event.to_dict()
        payload.pop("seq", None)
        self.display.append(payload)

    def flush(self) -> None:
        from chat import store

        for start in range(0, len(self.display), 1000):
            store.append_display(self.chat_id, self.display[start : start + 1000])
        self.display.clear()
        store.persist_context(self.chat_id, self.channels.context, 0)


def build_chat(owner, messages: int, seed: int) -> str:
    """A chat with exactly ``messages`` display messages (plus their run events)."""
    from chat import store
    from chat.agent import events as ev
    from chat.core.messages import ToolCall, assistant, tool_result, user

    rng = random.Random(seed)
    chat = store.create_chat(owner, title=f"Long chat of {messages} messages", model="demo")
    writer = ChatWriter(str(chat.pk), "00000000-0000-0000-0000-000000000000")
    turn = 0
    while writer.messages < messages:
        turn += 1
        writer.message(user(_sentence(rng, rng.randint(6, 30))))
        writer.event(ev.RunStart(model="demo"))
        writer.event(ev.IterationStart(iteration=1, max_iterations=12))
        writer.event(ev.ContextUsage(tokens=1000 + turn * 40, context_window=32_000))
        if rng.random() < 0.6 and writer.messages + 3 <= messages:
            name = rng.choice(TOOLS)
            call = ToolCall(f"call_{turn}", name, f'{{"path": "notes/{turn}.md", "n": {turn}}}')
            writer.message(assistant("", reasoning_content=_sentence(rng, 20), tool_calls=[call]))
            writer.event(ev.ToolStart(call_id=call.id, name=name, input={"path": f"{turn}.md"}))
            output = "\n".join(_sentence(rng, 12) for _ in range(rng.randint(3, 12)))
            writer.event(ev.ToolEnd(call_id=call.id, name=name, output=output, status="done"))
            writer.message(tool_result(call.id, output))
            writer.event(ev.IterationStart(iteration=2, max_iterations=12))
            writer.event(ev.ContextUsage(tokens=1200 + turn * 40, context_window=32_000))
        if writer.messages < messages:
            writer.message(assistant(_markdown_reply(rng, turn)))
        writer.event(ev.Complete(input_tokens=1200, output_tokens=300, text=""))
        if len(writer.display) >= 3000:
            writer.flush()
    writer.flush()
    return str(chat.pk)


# --- measuring ------------------------------------------------------------------------------------


def timed(action: Callable[[], Any], runs: int, warmup: int = 3) -> tuple[list[float], Any]:
    """Wall times in ms of ``runs`` calls after ``warmup`` untimed ones; the last result."""
    result = None
    for _ in range(warmup):
        result = action()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = action()
        times.append((time.perf_counter() - start) * 1000)
    return times, result


def measure_page(client, chat_id: str, runs: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.presentation import display

    url = f"/chat/{chat_id}/"

    def get():
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
        return response

    times, response = timed(get, runs)

    def get_cold():  # as the first view after a restart: nothing rendered is cached yet
        display.forget_rendered()
        return get()

    cold_times, _ = timed(get_cold, runs)
    with CaptureQueriesContext(connection) as queries:
        get()
    return {
        "median": statistics.median(times),
        "cold": statistics.median(cold_times),
        "p90": percentile(times, 90),
        "queries": len(queries),
        "kib": len(response.content) / 1024,
        "items": response.content.count(b' data-seq="') - 1,  # minus the #seq-marker
        "sql_ms": sum(float(q["time"]) for q in queries.captured_queries) * 1000,
        "slowest": sorted(queries.captured_queries, key=lambda q: -float(q["time"]))[:3],
    }


def replay(chat_id: str, last_seq: int) -> tuple[int, int, int]:
    """The consumer's resync loop (``fragments.next_batch`` until a short batch)."""
    from chat.presentation import fragments

    events_sent = batches = size = 0
    while True:
        events, html = fragments.next_batch(chat_id, last_seq)
        if not events:
            break
        last_seq = events[-1].seq
        events_sent += len(events)
        batches += 1
        size += len(html.encode())
        if len(events) < fragments.REPLAY_BATCH:
            break
    return events_sent, batches, size


def measure_replay(chat_id: str, behind: int, runs: int) -> dict[str, Any]:
    from chat import store

    last = store.last_display_seq(chat_id)
    start_seq = max(0, last - behind)
    times, (events, batches, size) = timed(lambda: replay(chat_id, start_seq), runs)
    if events != last - start_seq:
        raise RuntimeError(f"replay sent {events} events, expected {last - start_seq}")
    return {
        "median": statistics.median(times),
        "p90": percentile(times, 90),
        "events": events,
        "batches": batches,
        "kib": size / 1024,
    }


def profile_page(client, chat_id: str) -> None:
    """cProfile of 10 requests of the page: where its server time goes."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(10):
        client.get(f"/chat/{chat_id}/")
    profiler.disable()
    print("\ncProfile of 10 page requests (cumulative, top 30):")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)


# --- report ---------------------------------------------------------------------------------------


def print_report(database: str, chats: dict[int, dict[str, Any]], behind: int) -> None:
    sizes = sorted(chats)
    small, large = chats[sizes[0]], chats[sizes[-1]]
    print(f"\nbench_longchat on {database}")
    header = f"{'':<34}" + "".join(f"{f'{n:,} messages':>20}" for n in sizes)
    print(header)
    print("-" * len(header))

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:<34}" + "".join(f"{c:>20}" for c in cells))

    row("display events in the chat", [f"{chats[n]['events']:,}" for n in sizes])
    row("page GET median", [f"{chats[n]['page']['median']:.1f} ms" for n in sizes])
    row("page GET p90", [f"{chats[n]['page']['p90']:.1f} ms" for n in sizes])
    row("page GET median, cold caches", [f"{chats[n]['page']['cold']:.1f} ms" for n in sizes])
    row("page SQL queries", [str(chats[n]["page"]["queries"]) for n in sizes])
    row("page size", [f"{chats[n]['page']['kib']:.0f} KiB" for n in sizes])
    ratio = large["page"]["median"] / small["page"]["median"]
    row(
        f"replay {behind:,} events behind, median",
        [f"{chats[n]['replay']['median']:.1f} ms" if chats[n]["replay"] else "-" for n in sizes],
    )
    row(
        "replay p90",
        [f"{chats[n]['replay']['p90']:.1f} ms" if chats[n]["replay"] else "-" for n in sizes],
    )
    row(
        "replay events / batches / size",
        [
            f"{r['events']} / {r['batches']} / {r['kib']:.0f} KiB"
            if (r := chats[n]["replay"])
            else "-"
            for n in sizes
        ],
    )
    row("items rendered on the page", [str(chats[n]["page"]["items"]) for n in sizes])
    row("page SQL time (one request)", [f"{chats[n]['page']['sql_ms']:.1f} ms" for n in sizes])
    print()
    ok_ratio = "ok" if ratio <= TARGET_RATIO else "MISSED"
    ok_page = "ok" if large["page"]["median"] < TARGET_PAGE_MS else "MISSED"
    print(
        f"page {sizes[-1]:,} / {sizes[0]:,} messages: {ratio:.2f}x "
        f"(target <= {TARGET_RATIO:g}x: {ok_ratio}); with cold caches "
        f"{large['page']['cold'] / small['page']['cold']:.2f}x"
    )
    same_window = [n for n in sizes[:-1] if chats[n]["page"]["items"] == large["page"]["items"]]
    if same_window:
        n = same_window[0]
        print(
            f"page {sizes[-1]:,} / {n:,} messages (both render {large['page']['items']} items): "
            f"{large['page']['median'] / chats[n]['page']['median']:.2f}x"
        )
    print(
        f"page with {sizes[-1]:,} messages: {large['page']['median']:.1f} ms "
        f"(target < {TARGET_PAGE_MS:g} ms: {ok_page})"
    )
    print(f"slowest queries of the {sizes[-1]:,}-message page:")
    for query in large["page"]["slowest"]:
        print(f"  {float(query['time']) * 1000:6.1f} ms  {query['sql'][:150]}")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument("--runs", type=int, default=15, help="timed runs per figure (15)")
    parser.add_argument(
        "--sizes", default="10,100,10000", help="display messages per chat (10,100,10000)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the largest page")
    parser.add_argument(
        "--no-analyze",
        action="store_true",
        help="PostgreSQL: skip ANALYZE after building (planner statistics of an empty table)",
    )
    parser.add_argument("--behind", type=int, default=1000, help="events the client misses")
    args = parser.parse_args(argv)
    sizes = sorted(int(x) for x in args.sizes.split(",") if x.strip())

    with django_database("lyceum-bench-longchat-", args.postgres):
        from django.contrib.auth import get_user_model
        from django.test import Client, override_settings

        from chat import store

        owner = get_user_model().objects.create_user("longchat", password="bench-pass-1")
        chats: dict[int, dict[str, Any]] = {}
        for size in sizes:
            started = time.perf_counter()
            chat_id = build_chat(owner, size, seed=size)
            events = store.last_display_seq(chat_id)
            print(
                f"built a chat of {size:,} messages ({events:,} display events) "
                f"in {time.perf_counter() - started:.1f} s"
            )
            chats[size] = {"id": chat_id, "events": events}
        if args.postgres and not args.no_analyze:
            analyze()
        plain_static = {
            "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        }
        with override_settings(STORAGES=plain_static):
            client = Client(headers={"host": "127.0.0.1"})
            client.force_login(owner)
            for size in sizes:
                chats[size]["page"] = measure_page(client, chats[size]["id"], args.runs)
                enough = chats[size]["events"] > args.behind
                chats[size]["replay"] = (
                    measure_replay(chats[size]["id"], args.behind, args.runs) if enough else None
                )
        database = "PostgreSQL" if args.postgres else "SQLite"
        if args.postgres:
            database += " (no ANALYZE)" if args.no_analyze else " (ANALYZEd)"
        print_report(database, chats, args.behind)
        if args.profile:
            with override_settings(STORAGES=plain_static):
                profile_page(client, chats[sizes[-1]]["id"])


if __name__ == "__main__":
    main(sys.argv[1:])
