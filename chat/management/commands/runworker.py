"""``runworker`` with the run sweeper: expires approvals and recovers runs of dead workers.

A worker outlives a Redis outage: when the channel layer's receive raises (Redis gone,
a connection closed by the server), the listener logs it, waits with a growing backoff
and receives again, instead of letting the exception end the process.
"""

import asyncio
import logging

from channels.management.commands.runworker import Command as ChannelsRunworker
from channels.worker import Worker

from chat.catalog import close_providers
from chat.runhost import executor

logger = logging.getLogger(__name__)

BACKOFF_FIRST = 0.5  # seconds before the first retry after a failed receive
BACKOFF_MAX = 10.0


class RunWorker(Worker):
    async def handle(self):
        executor.ensure_sweeper()  # the one sweeper of this process (launch ensures it too)
        try:
            await super().handle()
        finally:
            await executor.stop_all()  # the sweeper, the runs left, the kept providers
            await close_providers()  # the kept providers' connection pools

    async def listener(self, channel):
        """Channels' listener, surviving a failing channel layer."""
        backoff = BACKOFF_FIRST
        failing = False
        while True:
            try:
                message = await self.channel_layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis gone: wait and receive again
                logger.warning(
                    "receiving on %s failed (%s: %s); retrying in %.1f s",
                    channel,
                    type(exc).__name__,
                    exc,
                    backoff,
                )
                failing = True
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            if failing:
                logger.warning("receiving on %s works again", channel)
                failing = False
            backoff = BACKOFF_FIRST
            if not message.get("type", None):
                logger.warning("worker received a message with no type on %s", channel)
                continue
            scope = {"type": "channel", "channel": channel}
            instance_queue = self.get_or_create_application_instance(channel, scope)
            await instance_queue.put(message)


class Command(ChannelsRunworker):
    worker_class = RunWorker
