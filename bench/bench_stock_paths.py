"""Two fast paths against the plain alternative, back to back in one run.

Run: ``.venv/bin/python bench/bench_stock_paths.py [--tokens 300] [--tps 50] [--streams 1,50]``

(a) ``OpenAIProvider`` streaming from a loopback fake upstream (``tests.fakeopenai`` in a
    subprocess, so ``time.process_time()`` here is the client side only), on its custom
    network backend (``transport="asyncio"``, ``chat/llm/netbackend.py``) against httpx's
    stock transport (``transport="stock"``: httpcore on anyio). One provider per row,
    kept for every stream of the row (client reuse: one httpx client and its pool). Each
    row is measured with reads as data arrives (``read_interval=0``) and with the
    production setting (``read_interval=0.1``, ``LYCEUM_STREAM_PUSH_INTERVAL``'s
    default), at 1 stream and at N concurrent streams. Figures: client CPU per 1,000
    streamed tokens, and first-token latency (``stream()`` called -> first
    ``TextDelta``; the fake upstream sends ``Connection: close``, so it includes a TCP
    connect). The paced reads are a feature of the custom backend
    (``AsyncioStream.pace_reads``); on the stock transport the provider reads as data
    arrives whatever ``read_interval`` says, which is what deleting the backend would give.
    Both rows are httpx: the provider's default is now its own client (``transport="lean"``,
    ``chat/llm/httpclient.py``), and these are the paths it keeps for a proxy in the
    environment or when asked; ``bench_provider.py`` sets the own client against httpx.

(b) ``chat.presentation.markdown.StreamingMarkdown`` on markdown-shaped replies streamed in pieces of
    about one model token, rendered every ``--every`` pieces (a push interval's worth):
    the class as it is (the word-append fast path on), the same class with the fast path
    off (a subclass whose ``_appendable`` says no: every snapshot re-renders the last
    block), and rendering the whole text each snapshot (``render_markdown_uncached``).
    Figure: CPU per 1,000 tokens. The HTML of the last snapshot is checked to be the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from chat.core.messages import user  # noqa: E402
from chat.llm.openai import OpenAIProvider  # noqa: E402
from chat.llm.types import ChatRequest, StreamEnd, TextDelta  # noqa: E402
from chat.presentation.markdown import StreamingMarkdown, render_markdown_uncached  # noqa: E402

# --- (a) provider streaming ------------------------------------------------------------

Row = dict[str, Any]


@contextlib.contextmanager
def fake_upstream(tokens: int, tps: float) -> Iterator[str]:
    """``tests.fakeopenai`` in a subprocess: ``tokens`` markdown words at ``tps`` per second."""
    command = [sys.executable, "-m", "tests.fakeopenai", "--port", "0"]
    command += ["--tokens", str(tokens), "--tokens-per-second", str(tps), "--markdown"]
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


@contextlib.contextmanager
def anyio_stream_pacing() -> Iterator[None]:
    """Bench-only: give httpcore's anyio stream the ``pace_reads`` of ``AsyncioStream``.

    The plain alternative to the custom backend for paced reads: sleep before a read
    until the interval is over, unless anyio already holds received bytes. anyio pauses
    the socket between reads, so what arrives meanwhile waits in the kernel and the next
    read takes it at once, as with the custom backend.
    """
    from httpcore._backends.anyio import AnyIOStream

    real_read = AnyIOStream.read

    def pace_reads(self: Any, interval: float) -> None:
        self.bench_interval, self.bench_next = interval, 0.0

    async def read(self: Any, max_bytes: int, timeout: float | None = None) -> bytes:
        interval = getattr(self, "bench_interval", 0.0)
        protocol = getattr(self._stream, "_protocol", None)
        if interval and not (protocol is not None and protocol.read_queue):
            wait = self.bench_next - asyncio.get_running_loop().time()
            if wait > 0:
                await asyncio.sleep(wait)
        data: bytes = await real_read(self, max_bytes, timeout)
        if interval:
            self.bench_next = asyncio.get_running_loop().time() + interval
        return data

    AnyIOStream.pace_reads = pace_reads  # type: ignore[attr-defined]
    AnyIOStream.read = read  # type: ignore[method-assign]
    try:
        yield
    finally:
        del AnyIOStream.pace_reads  # type: ignore[attr-defined]
        AnyIOStream.read = real_read  # type: ignore[method-assign]


async def _one_stream(provider: OpenAIProvider) -> tuple[int, float]:
    """(text deltas, seconds to the first one)."""
    request = ChatRequest(model="fake-model", messages=[user("Write a long answer.")])
    started = time.perf_counter()
    first: float | None = None
    deltas = 0
    end: StreamEnd | None = None
    async for chunk in provider.stream(request):
        if isinstance(chunk, TextDelta):
            if first is None:
                first = time.perf_counter() - started
            deltas += 1
        elif isinstance(chunk, StreamEnd):
            end = chunk
    if end is None or end.finish_reason != "stop" or first is None:
        raise RuntimeError("the stream did not finish normally")
    return deltas, first


async def _provider_row(
    base_url: str, transport: str, read_interval: float, streams: int, rounds: int
) -> Row:
    provider = OpenAIProvider(
        "bench",
        base_url,
        "sk-bench",
        max_retries=0,
        transport=transport,
        read_interval=read_interval,
    )
    try:
        await _one_stream(provider)  # warm-up: the client, imports, the first connection
        clients = {id(provider._client())}
        firsts: list[float] = []
        tokens = 0
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            results = await asyncio.gather(*(_one_stream(provider) for _ in range(streams)))
            tokens += sum(count for count, _ in results)
            firsts += [first for _, first in results]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        clients.add(id(provider._client()))
        if len(clients) != 1:
            raise RuntimeError("the provider built a second client")
    finally:
        await provider.aclose()
    return {
        "tokens": tokens,
        "cpu_ms_per_1k": cpu * 1e6 / tokens,
        "first_p50_ms": statistics.median(firsts) * 1000,
        "first_max_ms": max(firsts) * 1000,
        "wall_s": wall,
    }


def measure_provider(
    tokens: int, tps: float, stream_counts: list[int], intervals: list[float], rounds_one: int
) -> list[tuple[str, Row, Row, Row | None]]:
    rows = []
    with fake_upstream(tokens, tps) as base_url:
        for interval in intervals:
            for streams in stream_counts:
                rounds = rounds_one if streams == 1 else 1
                label = f"{streams} stream{'s' if streams > 1 else ''}, read_interval {interval:g}"
                # Alternate which goes first, so a drift in machine load hits both.
                asyncio_row = asyncio.run(
                    _provider_row(base_url, "asyncio", interval, streams, rounds)
                )
                stock_row = asyncio.run(_provider_row(base_url, "stock", interval, streams, rounds))
                paced_row = None
                if interval:
                    with anyio_stream_pacing():
                        paced_row = asyncio.run(
                            _provider_row(base_url, "stock", interval, streams, rounds)
                        )
                rows.append((label, asyncio_row, stock_row, paced_row))
    return rows


def _cpu(row: Row | None) -> str:
    return f"{row['cpu_ms_per_1k']:>10.1f}" if row else f"{'-':>10}"


def _saving(fast: Row, row: Row | None) -> str:
    if row is None:
        return f"{'-':>8}"
    return f"{1 - fast['cpu_ms_per_1k'] / row['cpu_ms_per_1k']:>8.0%}"


def _first(row: Row | None) -> str:
    if row is None:
        return f"{'-':>13}"
    return f"{row['first_p50_ms']:.1f} / {row['first_max_ms']:.1f}".rjust(13)


def print_provider(rows: list[tuple[str, Row, Row, Row | None]]) -> None:
    print("(a) OpenAIProvider streaming, client process CPU; custom netbackend vs stock httpx")
    print("    stk+paced: stock httpx with bench-only paced reads on anyio's stream")
    print(
        f"{'':<30} {'CPU ms / 1k tokens':>32} {'asyncio saves vs':>17}   first token p50 / max ms"
    )
    print(
        f"{'':<30} {'asyncio':>10} {'stock':>10} {'stk+paced':>10} {'stock':>8} {'stk+pcd':>8}"
        f" {'asyncio':>13} {'stock':>13} {'stk+paced':>13}"
    )
    print("-" * 130)
    for label, fast, stock, paced in rows:
        print(
            f"{label:<30} {_cpu(fast)} {_cpu(stock)} {_cpu(paced)} {_saving(fast, stock)} "
            f"{_saving(fast, paced)} {_first(fast)} {_first(stock)} {_first(paced)}"
        )


# --- (b) streaming markdown ------------------------------------------------------------

_PROSE = (
    "the model reads each file then writes a short summary of what changed and why it "
    "matters for the next step of the plan while keeping every test green and the diff small"
)
WORDS = _PROSE.split(" ")


def markdown_reply(seed: int, paragraphs: int = 6) -> str:
    """A reply shaped like a model's answer: paragraphs, bold and code words, a list,
    a heading, a fenced code block and a small table."""
    rng = random.Random(seed)

    def sentence(length: int) -> str:
        words = []
        for _ in range(length):
            word = rng.choice(WORDS)
            roll = rng.random()
            if roll < 0.06:
                word = f"**{word}**"
            elif roll < 0.10:
                word = f"`{word}`"
            words.append(word)
        return " ".join(words).capitalize() + "."

    parts = []
    for index in range(paragraphs):
        if index % 3 == 1:
            parts.append(f"## Step {index}")
        parts.append(" ".join(sentence(rng.randint(8, 18)) for _ in range(rng.randint(2, 4))))
        if index % 2 == 0:
            parts.append("\n".join(f"- {sentence(rng.randint(4, 9))}" for _ in range(4)))
        if index == 2:
            parts.append(
                "```python\ndef summary(paths):\n    for path in paths:\n"
                "        print(path.read_text()[:80])\n    return len(paths)\n```"
            )
        if index == 4:
            parts.append("| file | lines |\n| --- | --- |\n| a.py | 120 |\n| b.py | 48 |")
    return "\n\n".join(parts) + "\n"


def model_tokens(text: str, seed: int) -> list[str]:
    """``text`` in pieces of 1-6 characters (about a model token each)."""
    rng = random.Random(seed)
    pieces, start = [], 0
    while start < len(text):
        end = min(len(text), start + rng.choice((1, 2, 3, 4, 4, 5, 5, 6)))
        pieces.append(text[start:end])
        start = end
    return pieces


def word_tokens(text: str) -> list[str]:
    """``text`` in pieces of one word with its leading space (as most providers send)."""
    pieces: list[str] = []
    current = ""
    for char in text:
        if char in " \n" and current.strip():
            pieces.append(current)
            current = ""
        current += char
    if current:
        pieces.append(current)
    return pieces


class NoWordAppend(StreamingMarkdown):
    """StreamingMarkdown with the word-append fast path off: the last block is re-rendered
    on every snapshot (the finished blocks before it are still kept)."""

    def _appendable(self, added: str, done: str) -> bool:
        return False


def _render_stream(pieces: list[str], every: int, how: str) -> tuple[float, str]:
    renderer: StreamingMarkdown | None = None
    if how == "fast path":
        renderer = StreamingMarkdown()
    elif how == "no word append":
        renderer = NoWordAppend()
    text, html = "", ""
    cpu = time.process_time()
    for index, piece in enumerate(pieces, 1):
        text += piece
        if index % every == 0 or index == len(pieces):
            html = renderer.render(text) if renderer else render_markdown_uncached(text)
    return time.process_time() - cpu, html


def measure_markdown(replies: int, every: int) -> list[tuple[str, dict[str, float]]]:
    ways = ("fast path", "no word append", "whole text")
    rows = []
    warm = word_tokens(markdown_reply(-1))
    for how in ways:  # imports, the parser, Pygments' lexer: paid once, outside the figures
        _render_stream(warm, every, how)
    for split in ("words", "model tokens"):
        cpu = dict.fromkeys(ways, 0.0)
        tokens = 0
        for seed in range(replies):
            text = markdown_reply(seed)
            pieces = word_tokens(text) if split == "words" else model_tokens(text, seed)
            tokens += len(pieces)
            final = {}
            for how in ways:
                spent, final[how] = _render_stream(pieces, every, how)
                cpu[how] += spent
            if len(set(final.values())) != 1:
                raise RuntimeError(f"the renderings differ for reply {seed} ({split})")
        rows.append((split, {how: cpu[how] * 1e6 / tokens for how in ways} | {"tokens": tokens}))
    return rows


def print_markdown(rows: list[tuple[str, dict[str, float]]], every: int) -> None:
    print(f"\n(b) StreamingMarkdown, CPU ms per 1k tokens, a snapshot every {every} pieces")
    header = (
        f"{'pieces':<14} {'tokens':>7} {'fast path':>10} {'no word append':>15} "
        f"{'whole text':>11} {'saving vs no append':>20}"
    )
    print(header)
    print("-" * len(header))
    for split, r in rows:
        saving = 1 - r["fast path"] / r["no word append"]
        print(
            f"{split:<14} {int(r['tokens']):>7} {r['fast path']:>10.1f} "
            f"{r['no word append']:>15.1f} {r['whole text']:>11.1f} {saving:>20.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300, help="tokens per streamed reply")
    parser.add_argument("--tps", type=float, default=50.0, help="upstream tokens per second")
    parser.add_argument("--streams", default="1,50", help="concurrent streams per row")
    parser.add_argument("--intervals", default="0,0.1", help="read_interval values")
    parser.add_argument("--rounds-one", type=int, default=3, help="sequential 1-stream replies")
    parser.add_argument("--replies", type=int, default=20, help="markdown replies")
    parser.add_argument("--every", type=int, default=3, help="pieces per markdown snapshot")
    parser.add_argument("--skip-provider", action="store_true")
    parser.add_argument("--skip-markdown", action="store_true")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    if not args.skip_provider:
        rows = measure_provider(
            args.tokens,
            args.tps,
            [int(n) for n in args.streams.split(",")],
            [float(n) for n in args.intervals.split(",")],
            args.rounds_one,
        )
        print_provider(rows)
    if not args.skip_markdown:
        print_markdown(measure_markdown(args.replies, args.every), args.every)


if __name__ == "__main__":
    main()
