"""``runworker`` with the run sweeper: expires approvals and recovers runs of dead workers."""

import asyncio

from channels.management.commands.runworker import Command as ChannelsRunworker
from channels.worker import Worker

from chat.catalog import close_providers
from chat.runhost import executor


class RunWorker(Worker):
    async def handle(self):
        sweeper = asyncio.ensure_future(executor.sweep_forever())
        try:
            await super().handle()
        finally:
            sweeper.cancel()
            await close_providers()  # the kept providers' connection pools


class Command(ChannelsRunworker):
    worker_class = RunWorker
