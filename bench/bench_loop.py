"""CPU time of the agent loop on top of OpenAIProvider, per 1,000 streamed tokens.

Run: ``.venv/bin/python bench/bench_loop.py [--tokens 2000] [--streams 5] [--repeat 3]``

Same set-up as ``bench_provider.py``: the fake OpenAI server runs in a *subprocess*
(``python -m tests.fakeopenai``), so ``time.process_time()`` here counts only this side.
Each timed stream is one whole run of :class:`chat.agent.loop.AgentLoop` (window
selection, compaction check, request, streaming, the final message, usage) on an
in-memory host that does per token what the Django host does without its I/O: deltas are
not stored, the partial reply is kept and the checkpoint / push clocks are read. What
the database and the channel layer cost per checkpoint is outside this figure (they run
a few times a second, not per token).

Modes:

* ``burst``     the server writes the whole reply at once: few large reads;
* ``per-write`` one write per token, no delay: reads carry a few tokens each.

Target from the issue: provider + loop under 50 ms CPU per 1,000 tokens. Each row is the
best of ``--repeat`` measurements (the least disturbed by other processes).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_provider import (  # noqa: E402
    TARGET_MS_PER_1K,
    _Timer,
    fake_server_process,
    measure_provider,
)
from chat.agent import events as ev  # noqa: E402
from chat.agent.builtin_tools import default_registry  # noqa: E402
from chat.agent.loop import AgentLoop, LoopConfig  # noqa: E402
from chat.agent.workspace import Workspace  # noqa: E402
from chat.llm.openai import OpenAIProvider  # noqa: E402
from chat.llm.types import (  # noqa: E402
    ChatRequest,
    Provider,
    StreamChunk,
    StreamEnd,
    TextDelta,
    Usage,
)
from tests.agent.fakes import MemoryHost  # noqa: E402

CHECKPOINT_INTERVAL = 1.0  # the defaults of LYCEUM_CHECKPOINT_INTERVAL / _STREAM_PUSH_INTERVAL
PUSH_INTERVAL = 0.2


class BenchHost(MemoryHost):
    """MemoryHost with the Django host's per-token behaviour (and memory), minus its I/O.

    MemoryHost records every event and every stream snapshot for tests; kept for 2,000
    tokens that is quadratic memory the real host never holds.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deltas = 0
        self.partial = ("", "")
        self.last_checkpoint = self.last_push = 0.0
        self.checkpoints = self.pushes = 0

    async def emit(self, event: ev.RunEvent) -> None:
        if isinstance(event, ev.Delta):
            self.deltas += 1
        if event.persisted:  # the Django host drops deltas here too
            self.events.append(event)

    async def stream_update(self, text: str, reasoning: str) -> None:
        self.partial = (text, reasoning)
        now = time.monotonic()
        if now - self.last_checkpoint >= CHECKPOINT_INTERVAL:
            self.last_checkpoint = now
            self.checkpoints += 1
        if now - self.last_push >= PUSH_INTERVAL:
            self.last_push = now
            self.pushes += 1


async def _one_run(provider: Provider, workspace: Workspace) -> int:
    host = BenchHost()
    host.send("Write a long answer.")
    loop = AgentLoop(
        host,
        provider,
        default_registry(),
        LoopConfig(model="fake-model", context_window=32_000),
        workspace=workspace,
        chat_id="bench",
    )
    outcome = await loop.run()
    if outcome.status != "completed" or not outcome.text:
        raise RuntimeError(f"the run did not complete: {outcome}")
    if host.channels.display[-1].content != outcome.text:
        raise RuntimeError("the final message is not the streamed text")
    if loop.usage_estimated:
        raise RuntimeError("the fake server sent no usage")
    # A read's deltas come merged (chat.llm.wire.merge_deltas): fewer deltas than tokens
    # once the reads carry several; the tokens are the fake server's count.
    return loop.usage_out


async def _loop_streams(base_url: str, streams: int, timer: _Timer) -> int:
    provider = OpenAIProvider("bench", base_url, "sk-bench", max_retries=0)
    try:
        with tempfile.TemporaryDirectory() as root:
            workspace = Workspace(root)
            await _one_run(provider, workspace)  # warm-up: imports, client, connection
            received = 0
            with timer.span():
                for _ in range(streams):
                    received += await _one_run(provider, workspace)
            return received
    finally:
        await provider.aclose()


def measure_loop(
    tokens: int, streams: int = 5, token_delay: float = 0.0, coalesce: bool = True
) -> dict[str, Any]:
    """Client CPU time of ``streams`` whole loop runs of ``tokens`` tokens (after a warm-up).

    Same result keys as :func:`bench.bench_provider.measure`.
    """
    timer = _Timer()
    with fake_server_process(tokens, token_delay, coalesce) as base_url:
        received = asyncio.run(_loop_streams(base_url, streams, timer))
    total = tokens * streams
    if received != total:
        raise RuntimeError(f"expected {total} deltas, the loop emitted {received}")
    return {
        "client": "provider+loop",
        "tokens": total,
        "streams": streams,
        "cpu_s": timer.cpu,
        "wall_s": timer.wall,
        "cpu_ms_per_1k": timer.cpu * 1000.0 / total * 1000.0,
        "tokens_per_s": total / timer.wall if timer.wall else float("inf"),
    }


class ReplayProvider:
    """Plays the chunks OpenAIProvider yields for the fake server's reply, with no I/O.

    Isolates the loop's own cost: in the per-write mode a slower consumer finds more
    tokens per read, which makes "provider+loop minus provider" an underestimate.
    """

    name = "replay"

    def __init__(self, tokens: int) -> None:
        pieces = [f"tok{i} " for i in range(tokens)]
        self.chunks = [TextDelta(p) for p in pieces]
        self.end = StreamEnd(
            finish_reason="stop",
            tool_calls=[],
            usage=Usage(11, tokens),
            text="".join(pieces),
            reasoning="",
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        for chunk in self.chunks:
            yield chunk
        yield self.end

    async def complete(self, request: ChatRequest) -> StreamEnd:
        return self.end

    async def list_models(self) -> list[str]:
        return ["fake-model"]


async def _replayed_runs(tokens: int, streams: int, timer: _Timer) -> int:
    provider = ReplayProvider(tokens)
    with tempfile.TemporaryDirectory() as root:
        workspace = Workspace(root)
        await _one_run(provider, workspace)
        received = 0
        with timer.span():
            for _ in range(streams):
                received += await _one_run(provider, workspace)
    return received


def measure_loop_alone(tokens: int, streams: int = 5) -> dict[str, Any]:
    """CPU time of the loop fed from memory (no HTTP, no parsing): its own per-token cost."""
    timer = _Timer()
    received = asyncio.run(_replayed_runs(tokens, streams, timer))
    total = tokens * streams
    if received != total:
        raise RuntimeError(f"expected {total} deltas, the loop emitted {received}")
    return {
        "client": "loop",
        "tokens": total,
        "streams": streams,
        "cpu_s": timer.cpu,
        "wall_s": timer.wall,
        "cpu_ms_per_1k": timer.cpu * 1000.0 / total * 1000.0,
        "tokens_per_s": total / timer.wall if timer.wall else float("inf"),
    }


def best_of(repeat: int, measure, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return min((measure(*args, **kwargs) for _ in range(repeat)), key=lambda r: r["cpu_s"])


def print_table(rows: list[tuple[str, dict[str, Any], dict[str, Any]]], alone: float) -> None:
    header = (
        f"{'mode':<10} {'streams x tokens':>17} {'provider ms/1k':>15} "
        f"{'provider+loop ms/1k':>20} {'difference':>11} {'tokens/s':>9}  "
        f"target <{TARGET_MS_PER_1K:g}"
    )
    print(header)
    print("-" * len(header))
    for mode, provider, loop in rows:
        shape = f"{loop['streams']} x {loop['tokens'] // loop['streams']}"
        only, both = provider["cpu_ms_per_1k"], loop["cpu_ms_per_1k"]
        verdict = "ok" if both < TARGET_MS_PER_1K else "over"
        print(
            f"{mode:<10} {shape:>17} {only:>15.2f} {both:>20.2f} {both - only:>11.2f} "
            f"{loop['tokens_per_s']:>9.0f}  {verdict}"
        )
    print(f"{'loop alone (chunks replayed from memory, no I/O)':<65} {alone:>11.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="best of N per figure")
    args = parser.parse_args()
    rows = []
    for mode, coalesce in (("burst", True), ("per-write", False)):
        shape = (args.tokens, args.streams)
        provider = best_of(args.repeat, measure_provider, *shape, coalesce=coalesce)
        loop = best_of(args.repeat, measure_loop, *shape, coalesce=coalesce)
        rows.append((mode, provider, loop))
    alone = best_of(args.repeat, measure_loop_alone, args.tokens, args.streams)
    print("CPU ms per 1,000 streamed tokens (client process only; server in a subprocess)")
    print_table(rows, alone["cpu_ms_per_1k"])
    print(
        "\n'provider' streams through OpenAIProvider alone; 'provider+loop' runs AgentLoop on"
        "\nit (one whole run per stream, in-memory host). In per-write mode a busier client"
        "\nfinds more tokens per read, so the difference understates the loop: the last"
        "\nline is the loop's own cost, fed the same chunks from memory."
    )


if __name__ == "__main__":
    main()
