"""ReadWatch: one timer per streamed body for its first-byte and idle deadlines."""

from __future__ import annotations

import asyncio

import pytest

from chat.llm.openai import ReadWatch


async def _body(pieces: list[tuple[float, bytes]]):
    for delay, data in pieces:
        await asyncio.sleep(delay)
        yield data


async def _read_all(watch: ReadWatch, reads, between: float = 0.0) -> list[bytes]:
    got = []
    while data := await watch.read(reads):
        got.append(data)
        await asyncio.sleep(between)  # the caller's own work: never counted as idle
    return got


async def test_a_slow_caller_between_reads_is_not_a_stalled_provider():
    loop = asyncio.get_running_loop()
    reads = _body([(0.0, b"a"), (0.01, b"b"), (0.01, b"c")])
    with ReadWatch(loop.time() + 1.0, idle_timeout=0.05) as watch:
        assert await _read_all(watch, reads, between=0.12) == [b"a", b"b", b"c"]


async def test_a_read_pending_past_the_idle_timeout_raises_timeout_and_nothing_else():
    loop = asyncio.get_running_loop()
    reads = _body([(0.0, b"a"), (0.3, b"late")])
    with ReadWatch(loop.time() + 1.0, idle_timeout=0.05) as watch:
        assert await watch.read(reads) == b"a"
        with pytest.raises(TimeoutError):
            await watch.read(reads)
        assert watch.started
    # The task was not left cancelled: it goes on awaiting normally.
    await asyncio.sleep(0.01)
    assert asyncio.current_task().cancelling() == 0


async def test_no_first_byte_before_the_deadline_raises_timeout():
    loop = asyncio.get_running_loop()
    reads = _body([(0.3, b"late")])
    with ReadWatch(loop.time() + 0.05, idle_timeout=10.0) as watch:
        with pytest.raises(TimeoutError):
            await watch.read(reads)
        assert not watch.started


async def test_a_real_cancel_stays_a_cancel():
    loop = asyncio.get_running_loop()

    async def reader():
        with ReadWatch(loop.time() + 5.0, idle_timeout=5.0) as watch:
            await watch.read(_body([(1.0, b"x")]))

    task = asyncio.ensure_future(reader())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
