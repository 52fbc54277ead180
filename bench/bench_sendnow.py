"""Daphne's CPU per streamed send with and without ``chatsite/sendnow.py``, back to back.

Run: ``/work/main/.venv/bin/python bench/bench_sendnow.py [--rounds 3] [--streams 30]``

A bare ASGI app in Daphne (this file's ``application``; no Django) streams 200 events,
one every 2 ms, per request; the client reads ``--streams`` such streams one after the
other. Daphne's process CPU over them, divided by the sends, is the per-send cost of
Daphne/Twisted plus the app's own small loop; alternating runs with the install off
(Twisted's own writes: a writer registered per send and a loop turn before it leaves)
and on. TTFT is request sent -> first event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVENTS = 200

if os.environ.get("LYCEUM_BENCH_SENDNOW") == "1":
    from chatsite.sendnow import install

    install()


async def application(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for i in range(EVENTS):
        await asyncio.sleep(0.002)
        await send(
            {"type": "http.response.body", "body": b"data: tok%d \n\n" % i, "more_body": True}
        )
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def run(sendnow: bool, streams: int) -> tuple[float, float]:
    sys.path.insert(0, str(ROOT))
    from bench.bench_relay import _cpu_seconds, _free_port, request

    port = _free_port()
    env = {**os.environ, "LYCEUM_BENCH_SENDNOW": "1" if sendnow else "0", "PYTHONPATH": str(ROOT)}
    daphne = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "bench.bench_sendnow:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        asyncio.run(request(port, "/", "", "", True))  # warm up
        cpu0 = _cpu_seconds(daphne.pid)
        ttfts = []
        for _ in range(streams):
            result = asyncio.run(request(port, "/", "", "", True))
            body = result["body"]
            assert body.endswith(b"data: [DONE]\n\n") and body.count(b"data: tok") == EVENTS
            ttfts.append(result["ttft"] * 1000)
        cpu = _cpu_seconds(daphne.pid) - cpu0
    finally:
        daphne.terminate()
        daphne.wait(5)
    return cpu * 1000 / (streams * (EVENTS + 1)), statistics.median(ttfts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=30)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}; {args.streams} streams of {EVENTS} events per run")
    for _ in range(args.rounds):
        for sendnow in (False, True):
            cpu, ttft = run(sendnow, args.streams)
            label = "sendnow" if sendnow else "twisted"
            print(f"{label:8} CPU per send {cpu:.4f} ms   TTFT p50 {ttft:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
