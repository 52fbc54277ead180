"""Artifacts: a chat page with 500 artifacts, and a 200 MB zip streamed in constant memory.

Run: ``.venv/bin/python bench/bench_artifacts.py [--runs 15] [--artifacts 500] [--zip-mb 200]``
(from the repository root).

It builds chats in a fresh temporary SQLite database and media folder:

* ``no artifacts``: a chat of 60 exchanges (questions, markdown answers with a short
  code block: a full first page) and no artifact;
* ``500 artifacts``: the same 60 exchanges, then 500 files written through the agent's
  workspace (``ArtifactWorkspace.write``, every tenth one twice: a second version), so
  the log holds a card event per version, as a run leaves it;
* ``zip``: a chat whose files add up to ``--zip-mb`` MB (8 MB files of random bytes).

Figures:

* ``page``: server time of ``GET /chat/<id>/`` through Django's test ``Client`` (DEBUG
  off, the whole middleware stack and template), median and p90 of ``--runs`` requests
  after a warm-up. Target: the 500-artifact page within 1.5x of the one without.
* ``zip``: ``GET /chat/<id>/artifacts.zip`` read to the end in this process; the
  resident memory (``VmRSS``) is sampled at every chunk, and the growth over the RSS
  before the request is reported with the bytes and the throughput. Target: < 50 MB.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_streams import percentile, server_env, setup_django, temporary_database  # noqa: E402

FILE_MB = 8
EXCHANGES = 60


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def build_chat(owner, title: str, exchanges: int = EXCHANGES) -> str:
    """A chat with ``exchanges`` questions and markdown answers (a full first page)."""
    from chat import actions, store
    from chat.core.messages import assistant, user

    chat = actions.new_chat(owner, title=title)
    for i in range(exchanges):
        store.append_display_messages(
            chat.pk,
            [
                user(f"Question {i}: how do I read a file in Python?"),
                assistant(
                    f"Answer {i}: use **`open`** in a `with` block:\n\n"
                    "```python\nwith open('notes.md') as f:\n    text = f.read()\n```\n"
                ),
            ],
        )
    return str(chat.pk)


def add_files(chat_id: str, count: int) -> None:
    from chat.runhost.workspace import ArtifactWorkspace

    files = ArtifactWorkspace(chat_id)
    for i in range(count):
        body = f"# File {i}\n\n" + "".join(f"line {n} of file {i}\n" for n in range(40))
        path = f"src/module_{i:03d}.py" if i % 2 else f"notes/note_{i:03d}.md"
        files.write(path, body)
        if i % 10 == 0:
            files.write(path, body + "\n# edited\n")


def measure_page(client, chat_id: str, runs: int) -> dict[str, float]:
    client.get(f"/chat/{chat_id}/")  # warm-up: templates, caches
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(f"/chat/{chat_id}/")
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    return {
        "median": statistics.median(times),
        "p90": percentile(times, 90),
        "bytes": len(response.content),
    }


def build_zip_chat(owner, total_mb: int) -> str:
    from django.db import transaction

    from chat import artifacts

    chat_id = build_chat(owner, "zip", exchanges=1)
    for i in range(max(1, total_mb // FILE_MB)):
        with transaction.atomic():
            artifacts.save_version(
                chat_id, f"data/blob_{i:02d}.bin", os.urandom(FILE_MB * 1024 * 1024), source="file"
            )
    return chat_id


def measure_zip(client, chat_id: str) -> dict[str, float]:
    gc.collect()
    before = rss_mb()
    peak = before
    size = 0
    tail = b""
    started = time.perf_counter()
    response = client.get(f"/chat/{chat_id}/artifacts.zip")
    for chunk in response.streaming_content:
        size += len(chunk)
        tail = (tail + chunk)[-65536:]
        peak = max(peak, rss_mb())
    seconds = time.perf_counter() - started
    # The end of the archive (central directory) is there and names every file.
    assert tail.rfind(b"PK\x05\x06") != -1 or tail.rfind(b"PK\x06\x06") != -1
    return {
        "bytes": size,
        "seconds": seconds,
        "rss_before": before,
        "rss_growth": peak - before,
    }


def check_small_zip(client, chat_id: str) -> int:
    body = b"".join(client.get(f"/chat/{chat_id}/artifacts.zip").streaming_content)
    archive = zipfile.ZipFile(io.BytesIO(body))
    assert archive.testzip() is None
    return len(archive.namelist())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--artifacts", type=int, default=500)
    parser.add_argument("--zip-mb", type=int, default=200)
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="lyceum-bench-artifacts-"))
    try:
        with temporary_database(workdir, postgres=False) as db_env:
            setup_django(
                server_env(
                    db_env,
                    workdir,
                    LYCEUM_MEDIA_ROOT=str(workdir / "media"),
                    LYCEUM_ARTIFACT_CHAT_MAX_BYTES=str((args.zip_mb + 64) * 1024 * 1024),
                    LYCEUM_ARTIFACT_MAX_COUNT=str(args.artifacts + 100),
                )
            )
            from django.contrib.auth import get_user_model
            from django.test import Client, override_settings

            owner = get_user_model().objects.create_user("artifacts", password="bench-pass-1")
            empty = build_chat(owner, "empty")
            full = build_chat(owner, "full")
            started = time.perf_counter()
            add_files(full, args.artifacts)
            print(
                f"wrote {args.artifacts} artifacts ({args.artifacts // 10} with a second "
                f"version) in {time.perf_counter() - started:.1f} s"
            )
            started = time.perf_counter()
            zipped = build_zip_chat(owner, args.zip_mb)
            print(f"stored {args.zip_mb} MB for the zip in {time.perf_counter() - started:.1f} s")

            plain_static = {
                "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
                "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
            }
            with override_settings(STORAGES=plain_static):
                client = Client(headers={"host": "127.0.0.1"})
                client.force_login(owner)
                pages = {
                    "no artifacts": measure_page(client, empty, args.runs),
                    f"{args.artifacts} artifacts": measure_page(client, full, args.runs),
                }
                entries = check_small_zip(client, full)
                result = measure_zip(client, zipped)

            print(f"\nchat page (GET /chat/<id>/, {args.runs} runs, SQLite, DEBUG off)")
            for name, page in pages.items():
                print(
                    f"  {name:>14}: median {page['median']:6.1f} ms, p90 {page['p90']:6.1f} ms, "
                    f"{page['bytes'] / 1024:.0f} KB"
                )
            values = list(pages.values())
            ratio = values[1]["median"] / values[0]["median"]
            verdict = "ok" if ratio < 1.5 else "OVER"
            print(f"  ratio: {ratio:.2f}x (target < 1.5x) {verdict}")
            print(f"\nzip of the {args.artifacts}-artifact chat: {entries} entries, test ok")
            growth = result["rss_growth"]
            print(
                f"zip of {result['bytes'] / 1024**2:.0f} MB: {result['seconds']:.1f} s "
                f"({result['bytes'] / 1024**2 / result['seconds']:.0f} MB/s), RSS "
                f"{result['rss_before']:.0f} MB before, grew {growth:.1f} MB "
                f"(target < 50 MB) {'ok' if growth < 50 else 'OVER'}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
