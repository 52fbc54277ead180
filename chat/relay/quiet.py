"""Background database work of the relay waits for a moment when no request is starting.

The relay's own work on the database thread (the usage writer's batches, the caches'
reloads) holds the GIL in Python for a few milliseconds, and a thread that wants the GIL
back waits up to the switch interval (5 ms) for it. Done while a request is being
admitted and its upstream called, it lengthened that request's time to first byte by
as much. A request counts as starting from its arrival until its first byte goes out
(:class:`Starting`); :func:`moment` waits until none is, for at most ``QUIET_WAIT``.
"""

from __future__ import annotations

import asyncio
import contextlib

QUIET_WAIT = 0.25  # seconds; under steady load the work is done anyway after this long

_starting = 0
_waiters: list[asyncio.Future[None]] = []


class Starting:
    """One request from its arrival to its first byte out (:meth:`done`, idempotent)."""

    def __init__(self) -> None:
        global _starting
        _starting += 1
        self._open = True

    def done(self) -> None:
        global _starting
        if not self._open:
            return
        self._open = False
        _starting -= 1
        if not _starting:
            for waiter in _waiters:
                if not waiter.done():
                    waiter.set_result(None)
            _waiters.clear()


async def moment() -> None:
    """Return when no request is starting, or after ``QUIET_WAIT`` at the latest."""
    if not _starting:
        return
    waiter = asyncio.get_running_loop().create_future()
    _waiters.append(waiter)
    try:
        async with asyncio.timeout(QUIET_WAIT):
            await waiter
    except TimeoutError:
        with contextlib.suppress(ValueError):
            _waiters.remove(waiter)
