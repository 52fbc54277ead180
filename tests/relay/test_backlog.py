"""Daphne listens with a queue of 2048 connections (the app sets it, not a launcher)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_daphne_from_the_command_line_listens_with_a_long_accept_queue(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        "DEBUG": "1",
        "SQLITE_PATH": str(tmp_path / "db.sqlite3"),
    }
    daphne = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "chatsite.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        backlog = None
        deadline = time.monotonic() + 30
        while backlog is None and time.monotonic() < deadline:
            # A listening socket's Send-Q is its accept queue's length.
            listed = subprocess.run(
                ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True
            ).stdout.split()
            backlog = int(listed[2]) if len(listed) > 2 else None
            time.sleep(0.2)
        assert backlog == 2048
    finally:
        daphne.terminate()
        daphne.wait(10)
