"""Full-text search over a user's messages: 10,000 chats, one query.

Run: ``.venv/bin/python bench/bench_search.py [--postgres] [--chats 10000] [--runs 15]``
(from the repository root).

It builds, in a fresh temporary database (SQLite via ``SQLITE_PATH``, or PostgreSQL with
``--postgres``; ``benchdb.django_database``, shared with ``bench_longchat``), ``--chats``
chats of one user, each with four messages (two questions, two replies of about 60
words), plus 2,000 chats of another user, written with ``bulk_create`` (on SQLite the
FTS5 triggers of migration 0010 index every row as it is inserted; on PostgreSQL the
stored ``search_vector`` column of migration 0012 is computed on insert, and the database
is ``ANALYZE``d after). Then it times ``chat.search.search_messages`` (the function the sidebar calls)
for a rare word, a common word, two words, and a prefix: median and p90 over ``--runs``
calls after a warm-up. Target from issue 15: under 100 ms.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_streams import percentile  # noqa: E402
from benchdb import analyze, django_database  # noqa: E402

TARGET_MS = 100.0
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
    "photosynthesis",
    "volcano",
    "harbour",
    "lantern",
    "orchard",
    "quartz",
    "meadow",
    "glacier",
]
QUERIES = {
    "rare word": "axolotl",
    "common word": "module",
    "two words": "volcano harbour",
    "prefix": "photosyn",
}


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


def build(chats: int, others: int) -> object:
    from django.contrib.auth import get_user_model

    from chat.core.eventlog import msg_event
    from chat.core.messages import assistant, user
    from chat.models import ChatEvent, ChatSession

    rng = random.Random(15)
    users = get_user_model()
    owner = users.objects.create_user("searcher", password="x")
    other = users.objects.create_user("other", password="x")
    for who, count in ((owner, chats), (other, others)):
        for start in range(0, count, 1000):
            sessions = [
                ChatSession(id=uuid.uuid4(), owner=who, title=f"Chat {n}", last_display_seq=4)
                for n in range(start, min(start + 1000, count))
            ]
            ChatSession.objects.bulk_create(sessions)
            events = []
            for index, session in enumerate(sessions):
                n = start + index
                texts = [
                    user(_text(rng, 12)),
                    assistant(_text(rng, 60) + (" The axolotl regrows." if n % 997 == 0 else "")),
                    user(_text(rng, 10)),
                    assistant(_text(rng, 60)),
                ]
                events += [
                    ChatEvent(
                        chat=session,
                        channel="display",
                        seq=seq,
                        kind="msg",
                        payload=msg_event(message, 0),
                    )
                    for seq, message in enumerate(texts, start=1)
                ]
            ChatEvent.objects.bulk_create(events)
    return owner


def measure(owner, runs: int) -> dict[str, tuple[float, float, int]]:
    from chat.search import search_messages

    results = {}
    for label, query in QUERIES.items():
        search_messages(owner, query)  # warm-up
        times = []
        hits = 0
        for _ in range(runs):
            started = time.perf_counter()
            hits = len(search_messages(owner, query))
            times.append((time.perf_counter() - started) * 1000)
        results[label] = (statistics.median(times), percentile(times, 90), hits)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument("--chats", type=int, default=10_000, help="chats of the searcher (10000)")
    parser.add_argument("--others", type=int, default=2_000, help="chats of another user (2000)")
    parser.add_argument("--runs", type=int, default=15, help="timed calls per query (15)")
    args = parser.parse_args()
    with django_database("lyceum-bench-search-", args.postgres):
        from django.db import connection

        started = time.perf_counter()
        owner = build(args.chats, args.others)
        if args.postgres:
            analyze()
        built = time.perf_counter() - started
        print(
            f"{connection.vendor}: {args.chats:,} chats of one user (+{args.others:,} of "
            f"another), {4 * (args.chats + args.others):,} messages, built in {built:.1f} s"
        )
        worst = 0.0
        for label, (median, p90, hits) in measure(owner, args.runs).items():
            worst = max(worst, median)
            print(f"  {label:12} median {median:6.1f} ms   p90 {p90:6.1f} ms   {hits} hits")
        verdict = "OK" if worst < TARGET_MS else "OVER"
        print(f"slowest median {worst:.1f} ms (target < {TARGET_MS:.0f} ms): {verdict}")


if __name__ == "__main__":
    main()
