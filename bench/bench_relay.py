"""The relay against going direct and against a minimal pass-through, side by side in one run.

Run: ``/work/main/.venv/bin/python bench/bench_relay.py [--tokens 200] [--tps 200] [--streams 1,10,100]``
(``--postgres``: the relay's database, and so its limits, in a fresh PostgreSQL database;
``--redis URL``: the limits in Redis)

Three targets in front of one paced fake upstream (``tests.fakeopenai`` in a subprocess,
``--tokens`` tokens at ``--tps`` tokens/s, usage asked for with
``stream_options.include_usage``):

* direct: the client talks to the upstream;
* pipe: a 40-line asyncio TCP byte pipe (this file, ``--pipe``) in its own process;
* relay: Lyceum under Daphne (one process, SQLite, no Redis) at ``/api/v1/relay``.

The client is a hand-written asyncio HTTP/1.1 client (cheap, so the two cores go to the
servers). Per target and concurrency: every stream is checked complete and in order
(``tok0 … tok199``) and carrying usage; throughput is streamed tokens per second of
wall time against direct; TTFT is request sent → first ``data:`` byte. The proxy's CPU per
streamed token is its process's CPU time (``/proc``) over the run divided by the tokens.
Then non-streaming: sequential requests, mean latency against direct. The relay's usage
records are checked at the end (one per request, 200 completion tokens, not estimated).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TOKEN_RE = re.compile(rb"tok(\d+) ")
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_BASE_URL = "postgres://postgres@127.0.0.1:5432"


# --- the minimal pass-through ------------------------------------------------------------------


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def pipe_main(port: int, upstream_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


# --- processes ------------------------------------------------------------------------------


def _start(
    command: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], int]:
    popen = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert popen.stdout is not None
    line = popen.stdout.readline().split()
    if len(line) != 2 or line[0] != "READY":
        raise RuntimeError(f"{command} did not start: {line}")
    return popen, int(line[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def setup_relay(
    upstream_port: int, db_env: dict[str, str], redis: str
) -> tuple[dict[str, str], str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "chatsite.settings",
        **db_env,
        "REDIS_URL": redis,
        "LYCEUM_REDIS_PREFIX": f"bench-relay-{os.getpid()}",
        "LOG_LEVEL": "WARNING",
        # As in production: DEBUG off (no SQL kept per query), plain HTTP on loopback.
        "DEBUG": "0",
        "SECRET_KEY": "bench-relay-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "0",
        "LYCEUM_RELAY_RPM": "1000000",
        "LYCEUM_RELAY_BURST": "100000",
    }
    subprocess.run([PY, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    script = f"""
from django.contrib.auth.models import User
from chat.apikeys import create_api_key
from chat.models import Provider, ProviderModel, ProviderKey
from chat.relay import secrets
user = User.objects.create_user("bench")
p = Provider.objects.create(name="up", base_url="http://127.0.0.1:{upstream_port}/v1")
ProviderModel.objects.create(provider=p, alias="bench-model", model_id="fake-model")
ProviderKey.objects.create(provider=p, label="k", secret=secrets.encrypt("sk-bench-upstream"))
print(create_api_key(user)[1])
"""
    out = subprocess.run(
        [PY, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return env, out.stdout.strip().splitlines()[-1]


def start_daphne(env: dict[str, str], profile: str = "") -> tuple[subprocess.Popen[str], int]:
    port = _free_port()
    launcher = [PY, "-m", "daphne"]
    if profile:  # cProfile of the event loop's thread, written when Daphne stops (SIGINT)
        launcher = [PY, "-m", "cProfile", "-o", profile, *launcher[1:]]
    popen = subprocess.Popen(
        [*launcher, "-b", "127.0.0.1", "-p", str(port), "chatsite.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            import socket

            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return popen, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("daphne did not start")


# --- the client -----------------------------------------------------------------------------


def _dechunk(body: bytes) -> bytes:
    out, index = [], 0
    while index < len(body):
        end = body.find(b"\r\n", index)
        if end < 0:
            break
        size = int(body[index:end].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out.append(body[end + 2 : end + 2 + size])
        index = end + 2 + size + 2
    return b"".join(out)


async def request(port: int, path: str, key: str, model: str, stream: bool) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "bench"}], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + payload)
    parts: list[bytes] = []
    ttft = None
    while data := await reader.read(65536):
        if ttft is None and b"data:" in data:
            ttft = time.perf_counter() - start
        parts.append(data)
    total = time.perf_counter() - start
    writer.close()
    raw = b"".join(parts)
    header, _, rest = raw.partition(b"\r\n\r\n")
    content = _dechunk(rest) if b"chunked" in header.lower() else rest
    return {"ttft": ttft, "total": total, "body": content, "status": int(header.split()[1])}


def check_stream(result: dict[str, Any], tokens: int) -> bool:
    body = result["body"]
    numbers = [int(n) for n in TOKEN_RE.findall(body)]
    return (
        result["status"] == 200
        and numbers == list(range(tokens))
        and b'"completion_tokens":' in body
        and body.rstrip().endswith(b"data: [DONE]")
    )


async def run_streams(port: int, path: str, key: str, model: str, n: int) -> list[dict[str, Any]]:
    return await asyncio.gather(*(request(port, path, key, model, True) for _ in range(n)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--tps", type=float, default=200)
    parser.add_argument("--streams", default="1,10,100")
    parser.add_argument("--single-repeats", type=int, default=5)
    parser.add_argument("--plain", type=int, default=100, help="non-streaming requests")
    parser.add_argument(
        "--redis", default="", help="REDIS_URL for the relay's limits (default: the database)"
    )
    parser.add_argument(
        "--profile", default="", metavar="OUT", help="run Daphne under cProfile, stats to OUT"
    )
    parser.add_argument(
        "--postgres", action="store_true", help="the relay's database in PostgreSQL, not SQLite"
    )
    parser.add_argument("--pipe", nargs=2, type=int, metavar=("PORT", "UPSTREAM"))
    args = parser.parse_args()
    if args.pipe:
        asyncio.run(pipe_main(*args.pipe))
        return
    fake, fake_port = _start(
        [
            PY,
            "-m",
            "tests.fakeopenai",
            "--port",
            "0",
            "--tokens",
            str(args.tokens),
            "--tokens-per-second",
            str(args.tps),
        ]
    )
    pipe, pipe_port = _start([PY, __file__, "--pipe", "0", str(fake_port)])
    db = tempfile.mktemp(prefix="bench-relay-", suffix=".sqlite3")
    pg_name = f"lyceum_bench_relay_{os.getpid()}" if args.postgres else ""
    if pg_name:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{pg_name}"')
    db_env = {"DATABASE_URL": f"{PG_BASE_URL}/{pg_name}"} if pg_name else {"SQLITE_PATH": db}
    env, key = setup_relay(fake_port, db_env, args.redis)
    database = "PostgreSQL" if pg_name else "SQLite"
    print(f"relay limits in {'Redis' if args.redis else 'the database'}, database {database}")
    print(f"load {os.getloadavg()[0]:.2f} / {os.getloadavg()[1]:.2f}")
    daphne, relay_port = start_daphne(env, args.profile)
    print("Daphne as shipped (TCP_NODELAY: set by Twisted's HTTPChannel on every connection)")
    targets = {
        "direct": (fake_port, "/v1/chat/completions", "fake-model", None),
        "pipe": (pipe_port, "/v1/chat/completions", "fake-model", pipe.pid),
        "relay": (relay_port, "/api/v1/relay/chat/completions", "bench-model", daphne.pid),
    }
    relay_requests = 0
    try:
        asyncio.run(run_streams(relay_port, targets["relay"][1], key, "bench-model", 2))  # warm up
        relay_requests += 2
        print(f"{args.tokens} tokens at {args.tps:g} tokens/s per stream, include_usage on")
        print(
            f"{'target':8} {'streams':>7} {'complete':>9} {'tok/s':>9} {'vs direct':>9} "
            f"{'TTFT p50 ms':>11} {'TTFT p95 ms':>11} {'CPU ms/token':>12}"
        )
        summary: dict[tuple[str, int], dict[str, float]] = {}
        yardstick: list[tuple[float, int]] = []
        for n in [int(s) for s in args.streams.split(",")]:
            for name, (port, path, model, pid) in targets.items():
                repeats = args.single_repeats if n <= 2 else 1
                results: list[dict[str, Any]] = []
                cpu0 = _cpu_seconds(pid) if pid else 0.0
                fake0 = _cpu_seconds(fake.pid)
                wall0 = time.perf_counter()
                for _ in range(repeats):
                    results += asyncio.run(run_streams(port, path, key, model, n))
                wall = time.perf_counter() - wall0
                cpu = (_cpu_seconds(pid) - cpu0) if pid else float("nan")
                if name == "direct":  # the box's yardstick: the fake upstream's own CPU
                    yardstick.append((_cpu_seconds(fake.pid) - fake0, len(results) * args.tokens))
                if name == "relay":
                    relay_requests += len(results)
                complete = sum(check_stream(r, args.tokens) for r in results)
                tokens = complete * args.tokens
                rate = tokens / wall
                ttfts = sorted(r["ttft"] * 1000 for r in results if r["ttft"] is not None)
                direct = summary.get(("direct", n), {}).get("rate", rate)
                cpu_per = cpu * 1000 / max(1, len(results) * args.tokens)
                summary[(name, n)] = {
                    "rate": rate,
                    "ttft": statistics.median(ttfts),
                    "cpu": cpu_per,
                }
                print(
                    f"{name:8} {n:7d} {complete:4d}/{len(results):<4d} {rate:9.0f} "
                    f"{rate / direct:9.2f} {statistics.median(ttfts):11.2f} "
                    f"{ttfts[int(0.95 * (len(ttfts) - 1))]:11.2f} {cpu_per:12.3f}"
                )
        # non-streaming
        print(f"\nnon-streaming, {args.plain} sequential requests")
        plain: dict[str, float] = {}
        for name, (port, path, model, pid) in targets.items():
            cpu0 = _cpu_seconds(pid) if pid else 0.0
            times = []
            for _ in range(args.plain):
                result = asyncio.run(request(port, path, key, model, False))
                assert result["status"] == 200, result["body"][:200]
                times.append(result["total"] * 1000)
            if name == "relay":
                relay_requests += args.plain
            cpu = (_cpu_seconds(pid) - cpu0) * 1000 / args.plain if pid else float("nan")
            plain[name] = statistics.mean(times)
            print(
                f"{name:8} mean {plain[name]:7.2f} ms  median {statistics.median(times):7.2f} ms"
                f"  overhead {plain[name] - plain['direct']:6.2f} ms  CPU {cpu:6.2f} ms/request"
            )
        for n in (int(s) for s in args.streams.split(",")):
            added = summary[("relay", n)]["ttft"] - summary[("direct", n)]["ttft"]
            label = "one stream" if n == 1 else f"{n} streams"
            print(
                f"{'' if n > 1 else chr(10)}added TTFT at {label} (median): relay {added:.2f} ms, "
                f"pipe {summary[('pipe', n)]['ttft'] - summary[('direct', n)]['ttft']:.2f} ms"
            )
        fake_cpu = sum(c for c, _ in yardstick) * 1e6 / max(1, sum(t for _, t in yardstick))
        print(f"fake upstream CPU per 1k tokens (direct runs): {fake_cpu:.1f} ms")
        time.sleep(1.0)
        check = subprocess.run(
            [
                PY,
                "manage.py",
                "shell",
                "-c",
                "from chat.models import UsageRecord as U; q=U.objects.all(); "
                "print(q.count(), q.filter(status='ok', estimated=False).count(), "
                "q.filter(status='ok', estimated=False, stream=True, completion_tokens="
                f"{args.tokens}).count())",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        records, ok, streamed_right = (
            int(x) for x in check.stdout.strip().splitlines()[-1].split()
        )
        print(
            f"usage records: {records} for {relay_requests} relay requests; "
            f"{ok} ok with real usage; {streamed_right} streamed with {args.tokens} completion tokens"
        )
    finally:
        if args.profile:
            daphne.send_signal(signal.SIGINT)  # cProfile writes its stats on a clean exit
            with contextlib.suppress(subprocess.TimeoutExpired):
                daphne.wait(20)
        for proc in (daphne, pipe, fake):
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for suffix in ("", "-wal", "-shm"):
            Path(db + suffix).unlink(missing_ok=True)
        if pg_name:
            import psycopg

            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
