"""The worker side of the runner: ``manage.py runworker lyceum-runs`` processes."""

from __future__ import annotations

import asyncio
import contextvars

from channels.consumer import AsyncConsumer
from channels.db import database_sync_to_async

from chat.live.direct import DirectDispatch
from chat.runhost import transitions
from chat.runhost.executor import start_local

CLAIM_EXTRA_RUNS = 20  # runs a worker takes along with the one it was handed


class RunWorkerConsumer(DirectDispatch, AsyncConsumer):
    """Receives runs on ``LYCEUM_WORKER_CHANNEL``."""

    async def run_execute(self, message: dict) -> None:
        # Returns at once: the consumer handles one message at a time, runs go on as tasks.
        start_local(str(message["run_id"]), resume=bool(message.get("resume")))
        take_along_soon()


# A hundred sends at once otherwise waited for the channel layer to hand their runs over
# one by one (several Redis round trips each, behind every stream this worker already
# runs): the last started 20 s late. So a worker handed a run looks for the others nobody
# claimed and starts them too; a run's own message, when it comes, finds it claimed and
# does nothing. The look is a trip to the database thread: made while the consumer waited,
# 200 sends queued 200 looks there, and the consumer took the next message only after
# each (the last 25 s late). Now one look at a time, in the background, and one more
# after it when runs were handed over meanwhile.
_taking: asyncio.Task | None = None
_look_again = False


def take_along_soon() -> None:
    global _taking, _look_again
    if _taking is not None and not _taking.done() and _taking.get_loop().is_running():
        _look_again = True
        return
    _taking = asyncio.get_running_loop().create_task(_take_along(), context=contextvars.Context())


async def _take_along() -> None:
    global _look_again
    _look_again = True
    while _look_again:
        _look_again = False
        for run_id in await database_sync_to_async(transitions.unclaimed_runs)(CLAIM_EXTRA_RUNS):
            start_local(run_id, resume=True)  # resume: only if it waits with a decision


async def taken_along() -> None:
    """Wait for the look for unclaimed runs in progress (tests)."""
    if _taking is not None and not _taking.done():
        await _taking
