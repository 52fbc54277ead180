"""CPU cost of streaming through OpenAIProvider, per 1,000 tokens.

Run: ``.venv/bin/python bench/bench_provider.py [--tokens 2000] [--streams 5]``

The fake OpenAI server runs in a *subprocess* (``python -m tests.fakeopenai``), so
``time.process_time()`` here measures only the client side: the HTTP client, the SSE decoder, JSON
parsing, the accumulator and the async generators. Target from the issue: provider + agent
loop under 50 ms CPU per 1,000 tokens. To add the loop later, write a ``measure_loop``
next to :func:`measure_provider` (same server helper, same result keys) and add a row.

Modes:

* ``burst``     the server writes the whole reply at once: few large reads (best case);
* ``per-write`` one write per token, no delay: reads carry a few tokens each;
* ``paced``     one token per millisecond: about one token per read (worst case per token).

``paced, httpx`` is the paced mode through the provider on httpx (``transport="asyncio"``,
what the provider used before ``chat/llm/httpclient.py``; still used when a proxy is set).

Baselines for the paced mode, the same bytes read and thrown away:

* ``  httpx``          bare httpx with its stock transport (httpcore on anyio);
* ``  httpx+asyncio``  bare httpx on ``chat.llm.netbackend.AsyncioTransport`` (httpcore on
  plain asyncio);
* ``  lean``           bare ``chat.llm.httpclient.Pool``, the client the provider uses;
* ``  socket``         a hand-written request on an asyncio socket (kernel + event loop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from chat.core.messages import user  # noqa: E402
from chat.llm.httpclient import Pool  # noqa: E402
from chat.llm.netbackend import AsyncioTransport  # noqa: E402
from chat.llm.openai import OpenAIProvider  # noqa: E402
from chat.llm.types import ChatRequest, StreamEnd, TextDelta  # noqa: E402

TARGET_MS_PER_1K = 50.0


@contextlib.contextmanager
def fake_server_process(
    tokens: int, token_delay: float = 0.0, coalesce: bool = True
) -> Iterator[str]:
    """Start ``tests.fakeopenai`` in a subprocess serving ``tokens``-token replies; yield its URL."""
    command = [sys.executable, "-m", "tests.fakeopenai", "--port", "0", "--tokens", str(tokens)]
    command += ["--token-delay", str(token_delay)]
    if not coalesce:
        command.append("--no-coalesce")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        if len(line) != 2 or line[0] != "READY":
            raise RuntimeError(f"the fake server did not start: {line!r}")
        yield f"http://127.0.0.1:{line[1]}/v1"
    finally:
        process.terminate()
        process.wait(10)


async def _stream_once(provider: OpenAIProvider) -> int:
    request = ChatRequest(model="fake-model", messages=[user("Write a long answer.")])
    texts: list[str] = []
    end: StreamEnd | None = None
    async for chunk in provider.stream(request):
        if isinstance(chunk, TextDelta):
            texts.append(chunk.text)
        elif isinstance(chunk, StreamEnd):
            end = chunk
    if end is None or end.finish_reason != "stop" or end.usage is None:
        raise RuntimeError("the stream did not finish normally")
    if "".join(texts) != end.text:
        raise RuntimeError("the deltas do not add up to the reply")
    # A read's deltas come merged (chat.llm.wire.merge_deltas): the tokens are the
    # fake server's count of what it sent.
    return end.usage.output_tokens


class _Timer:
    """CPU and wall time of the timed streams only (the warm-up stream is excluded)."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    @contextlib.contextmanager
    def span(self) -> Iterator[None]:
        cpu, wall = time.process_time(), time.perf_counter()
        yield
        self.cpu, self.wall = time.process_time() - cpu, time.perf_counter() - wall


async def _provider_streams(
    base_url: str, streams: int, timer: _Timer, transport: str = "lean"
) -> int:
    provider = OpenAIProvider("bench", base_url, "sk-bench", max_retries=0, transport=transport)
    try:
        await _stream_once(provider)  # warm-up: imports, client, first connection
        received = 0
        with timer.span():
            for _ in range(streams):
                received += await _stream_once(provider)
        return received
    finally:
        await provider.aclose()


async def _httpx_streams(
    base_url: str, streams: int, timer: _Timer, transport: httpx.AsyncBaseTransport | None = None
) -> int:
    """Baseline: the same requests through bare httpx, bytes read and thrown away."""
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": True}

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{base_url}/chat/completions", json=body) as response:
            async for _data in response.aiter_bytes():
                pass

    async with httpx.AsyncClient(transport=transport) as client:
        await one(client)
        with timer.span():
            for _ in range(streams):
                await one(client)
    return 0


async def _socket_streams(base_url: str, streams: int, timer: _Timer) -> int:
    """Floor: a hand-written HTTP request on an asyncio socket (kernel + event loop only)."""
    host, port = base_url.split("//", 1)[1].split("/", 1)[0].split(":")
    payload = b'{"model": "fake-model", "messages": [], "stream": true}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    ) % (len(payload), payload)

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request)
        await writer.drain()
        while await reader.read(65536):
            pass
        writer.close()

    await one()
    with timer.span():
        for _ in range(streams):
            await one()
    return 0


async def _provider_httpx_streams(base_url: str, streams: int, timer: _Timer) -> int:
    return await _provider_streams(base_url, streams, timer, transport="asyncio")


async def _lean_streams(base_url: str, streams: int, timer: _Timer) -> int:
    """Baseline: bare ``httpclient.Pool``, the client the provider uses, bytes thrown away."""
    body = (
        b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": true}'
    )
    headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
    pool = Pool(10.0)

    async def one() -> None:
        response = await pool.post(f"{base_url}/chat/completions", body, headers)
        async for _data in response.aiter_body():
            pass
        await response.aclose()

    try:
        await one()
        with timer.span():
            for _ in range(streams):
                await one()
    finally:
        await pool.aclose()
    return 0


async def _httpx_asyncio_streams(base_url: str, streams: int, timer: _Timer) -> int:
    """Baseline: bare httpx on the asyncio network backend the provider uses."""
    return await _httpx_streams(base_url, streams, timer, AsyncioTransport())


CLIENTS = {
    "provider": _provider_streams,
    "provider (httpx)": _provider_httpx_streams,
    "lean": _lean_streams,
    "httpx": _httpx_streams,
    "httpx+asyncio": _httpx_asyncio_streams,
    "socket": _socket_streams,
}


def measure(
    tokens: int,
    streams: int = 5,
    token_delay: float = 0.0,
    coalesce: bool = True,
    client: str = "provider",
) -> dict[str, Any]:
    """Client CPU time for ``streams`` replies of ``tokens`` tokens (after one warm-up)."""
    timer = _Timer()
    with fake_server_process(tokens, token_delay, coalesce) as base_url:
        received = asyncio.run(CLIENTS[client](base_url, streams, timer))
    total = tokens * streams
    if client.startswith("provider") and received != total:
        raise RuntimeError(f"expected {total} tokens, received {received}")
    return {
        "client": client,
        "tokens": total,
        "streams": streams,
        "cpu_s": timer.cpu,
        "wall_s": timer.wall,
        "cpu_ms_per_1k": timer.cpu * 1000.0 / total * 1000.0,
        "tokens_per_s": total / timer.wall if timer.wall else float("inf"),
    }


def measure_provider(tokens: int, streams: int = 5, **options: Any) -> dict[str, Any]:
    """Stream through OpenAIProvider; the result's ``cpu_ms_per_1k`` is the figure to watch."""
    return measure(tokens, streams, client="provider", **options)


def print_table(rows: list[tuple[str, dict[str, Any]]]) -> None:
    header = (
        f"{'mode':<15} {'streams x tokens':>17} {'client CPU ms':>14} "
        f"{'CPU ms / 1k tok':>16} {'wall s':>7} {'tokens/s':>10}  target <{TARGET_MS_PER_1K:g}"
    )
    print(header)
    print("-" * len(header))
    for mode, r in rows:
        verdict = "ok" if r["cpu_ms_per_1k"] < TARGET_MS_PER_1K else "over"
        if not r["client"].startswith("provider"):
            verdict = "(baseline)"
        shape = f"{r['streams']} x {r['tokens'] // r['streams']}"
        print(
            f"{mode:<15} {shape:>17} {r['cpu_s'] * 1000:>14.1f} {r['cpu_ms_per_1k']:>16.2f} "
            f"{r['wall_s']:>7.2f} {r['tokens_per_s']:>10.0f}  {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=5)
    parser.add_argument("--paced-tokens", type=int, default=500)
    args = parser.parse_args()
    paced = {"token_delay": 0.001, "coalesce": False}
    rows = [
        ("burst", measure_provider(args.tokens, args.streams)),
        ("per-write", measure_provider(args.tokens, args.streams, coalesce=False)),
        ("paced", measure_provider(args.paced_tokens, 2, **paced)),
        ("paced, httpx", measure(args.paced_tokens, 2, client="provider (httpx)", **paced)),
        ("  httpx", measure(args.paced_tokens, 2, client="httpx", **paced)),
        ("  httpx+asyncio", measure(args.paced_tokens, 2, client="httpx+asyncio", **paced)),
        ("  lean", measure(args.paced_tokens, 2, client="lean", **paced)),
        ("  socket", measure(args.paced_tokens, 2, client="socket", **paced)),
    ]
    print("OpenAIProvider streaming cost (client process only; server in a subprocess)")
    print_table(rows)
    print(
        "\n'paced, httpx' is the provider on httpx (as with a proxy). '  httpx', '  httpx+asyncio',"
        "\n'  lean' and '  socket' are baselines for the paced rows: the same bytes read by bare"
        "\nhttpx on its stock transport (anyio), by bare httpx on the asyncio backend, by the"
        "\nprovider's own client (chat/llm/httpclient.py) and by a raw asyncio socket (kernel +"
        "\nevent loop). The provider's own share is 'paced' minus '  lean'."
    )


if __name__ == "__main__":
    main()
