"""The worker side of the runner: ``manage.py runworker lyceum-runs`` processes."""

from __future__ import annotations

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
        # A hundred sends at once otherwise waited for the channel layer to hand their
        # runs over one by one (several Redis round trips each, behind every stream this
        # worker already runs): the last started 20 s late. A run's own message, when
        # it comes, finds it claimed and does nothing.
        for run_id in await database_sync_to_async(transitions.unclaimed_runs)(CLAIM_EXTRA_RUNS):
            start_local(run_id, resume=True)  # resume: only if it waits with a decision
