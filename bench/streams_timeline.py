"""Where a burst of sends spends its time before the first token: read from a work directory
``bench_streams.py --keep`` left (its SQLite database and the fake upstream's log).

    .venv/bin/python bench/streams_timeline.py /tmp/lyceum-bench-streams-XXXX

For every chat: when its user message was committed (the send stored), when the run's
start events were written (the run claimed, then its first batch of events), and when
the fake upstream wrote the reply's first token (its stamp). Times are the database's
``created_at`` (UTC, to the microsecond) and the token's stamp, on one machine's clock.
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path


def _when(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(workdir: Path) -> None:
    db = sqlite3.connect(workdir / "bench.sqlite3")
    chats: dict[str, dict[str, float | str]] = {}
    rows = db.execute(
        "SELECT chat_id, kind, payload, created_at FROM chat_chatevent"
        " WHERE channel = 'display' ORDER BY chat_id, seq"
    )
    for chat, kind, payload, created in rows:
        seen = chats.setdefault(chat, {})
        body = json.loads(payload)
        if kind == "msg" and body.get("role") == "user" and "sent" not in seen:
            seen["sent"], seen["prompt"] = _when(created), str(body.get("content"))
        elif kind == "run_start" and "started" not in seen:
            seen["started"] = _when(created)
    first_token: dict[str, float] = {}
    for line in (workdir / "replies.jsonl").read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        if stamp := re.search(r"t(\d{16})", entry["text"]):
            first_token.setdefault(entry["prompt"], int(stamp.group(1)) / 1e6)
    timed = [
        (float(c["sent"]), float(c["started"]), first_token[str(c["prompt"])])
        for c in chats.values()
        if "sent" in c and "started" in c and c.get("prompt") in first_token
    ]
    if not timed:
        sys.exit("no chat with a send, a run start and a first token")
    origin = min(sent for sent, _s, _t in timed)
    stages = {
        "send stored, after the first": [sent - origin for sent, _s, _t in timed],
        "send stored -> run's start written": [started - sent for sent, started, _t in timed],
        "run's start written -> first token sent": [tok - started for _s, started, tok in timed],
        "send stored -> first token sent": [tok - sent for sent, _s, tok in timed],
    }
    print(f"{len(timed)} chats")
    for name, values in stages.items():
        print(
            f"{name:<42} p50 {_pct(values, 0.5):6.2f} s   p95 {_pct(values, 0.95):6.2f} s"
            f"   max {max(values):6.2f} s"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
