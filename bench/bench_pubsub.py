"""The live layer's Redis path alone: a worker's stream snapshots to Daphne's sockets.

One process publishes stream snapshots the way the run host does (``group_send_keeping``:
the pushed copy set and the snapshot published in one round trip, a run awaiting each of
its pushes) for ``--chats`` chats at ``--pushes`` pushes a second each; a subprocess
subscribes one channel per chat as Daphne's sockets do (``new_channel``, ``group_add``,
``receive``) and counts what arrives. Each side prints its CPU per 1,000 snapshots
(``time.process_time``, all threads), so the figure is the layer's alone, without
rendering, the provider or the sockets.

    flock /tmp/bench.lock .venv/bin/python bench/bench_pubsub.py --chats 200 --seconds 10

Needs Redis at 127.0.0.1:6379 (a unique prefix, nothing left behind but keys with a TTL,
deleted at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
os.environ.setdefault("DEBUG", "1")

REDIS = "redis://127.0.0.1:6379/0"


def layer(prefix: str):
    from chat.live.layers import PipelinedPubSubChannelLayer

    return PipelinedPubSubChannelLayer(hosts=[{"address": REDIS}], prefix=prefix)


def snapshot(chat: int, n: int, words: int) -> dict:
    text = " ".join(f"w{i}t{time.time_ns() // 1000}" for i in range(words))
    return {
        "type": "chat.stream",
        "chat_id": f"chat-{chat}",
        "run_id": f"run-{chat}",
        "round": 0,
        "speakers": [],
        "text": text,
        "reasoning": "",
        "html": f'<div id="stream-slot"><p>{text}</p></div>',
        "sent_at": time.time(),
        "n": n,
    }


async def subscribe(prefix: str, chats: int, expected: int, ready: Path) -> None:
    import django

    django.setup()
    live = layer(prefix)
    counts = [0] * chats

    async def reader(chat: int) -> None:
        channel = await live.new_channel()
        await live.group_add(f"chat.{chat}", channel)
        while True:
            message = await live.receive(channel)
            counts[chat] += 1
            assert message["chat_id"] == f"chat-{chat}"

    tasks = [asyncio.ensure_future(reader(c)) for c in range(chats)]
    await asyncio.sleep(1.0)
    ready.write_text("ready")
    started = None
    deadline = None
    while True:
        await asyncio.sleep(0.05)
        total = sum(counts)
        if started is None and total:
            started = time.process_time()
            first = total
        if total >= expected or (deadline and time.monotonic() > deadline):
            break
        if deadline is None and Path(str(ready) + ".done").exists():
            deadline = time.monotonic() + 3
    cpu = time.process_time() - (started or 0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps({"received": sum(counts), "counted": sum(counts) - first, "cpu": cpu}))


async def publish(prefix: str, chats: int, pushes: float, seconds: float, words: int) -> dict:
    import django

    django.setup()
    live = layer(prefix)
    done = 0
    keys = []

    async def run(chat: int) -> None:
        nonlocal done
        n = 0
        key = f"{prefix}:pushed:run-{chat}"
        keys.append(key)
        start = time.monotonic() + chat / chats / pushes
        while time.monotonic() - start < seconds:
            n += 1
            message = snapshot(chat, n, words + n // 3)
            value = json.dumps([0, message["text"], "", time.time()]).encode()
            await live.group_send_keeping(f"chat.{chat}", message, key, value, 60)
            done += 1
            due = start + n / pushes
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    cpu = time.process_time()
    wall = time.monotonic()
    await asyncio.gather(*(run(c) for c in range(chats)))
    cpu = time.process_time() - cpu
    wall = time.monotonic() - wall
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS)
    await client.delete(*keys)
    await client.aclose()
    return {"published": done, "cpu": cpu, "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=200)
    parser.add_argument("--pushes", type=float, default=10.0, help="per chat per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--words", type=int, default=60, help="a snapshot's words at the start")
    parser.add_argument("--subscriber", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.subscriber:
        prefix, expected, ready = args.subscriber
        asyncio.run(subscribe(prefix, args.chats, int(expected), Path(ready)))
        return
    import redis.utils

    prefix = f"benchpubsub{secrets.token_hex(4)}"
    ready = Path(f"/tmp/{prefix}.ready")
    expected = int(args.chats * args.pushes * args.seconds)
    sub = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--chats",
            str(args.chats),
            "--subscriber",
            prefix,
            str(expected),
            str(ready),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    while not ready.exists():
        time.sleep(0.05)
    pub = asyncio.run(publish(prefix, args.chats, args.pushes, args.seconds, args.words))
    Path(str(ready) + ".done").write_text("done")
    out, _ = sub.communicate(timeout=60)
    ready.unlink()
    Path(str(ready) + ".done").unlink()
    got = json.loads(out)
    print(
        f"bench_pubsub: {args.chats} chats x {args.pushes:g} pushes/s x {args.seconds:g} s, "
        f"hiredis {redis.utils.HIREDIS_AVAILABLE}, load {Path('/proc/loadavg').read_text().split()[0]}"
    )
    print(f"published {pub['published']} in {pub['wall']:.1f} s, received {got['received']}")
    print(f"publisher CPU ms / 1k snapshots   {pub['cpu'] * 1e6 / pub['published']:.0f}")
    print(f"subscriber CPU ms / 1k snapshots  {got['cpu'] * 1e6 / max(1, got['counted']):.0f}")


if __name__ == "__main__":
    main()
