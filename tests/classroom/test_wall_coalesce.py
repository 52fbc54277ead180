"""The wall coalesces stream snapshots: many snapshots of a chat within one push interval
become one frame with the newest tile line only; a written reply's doorbell renders the
tile from its own events (no read of the log) when the tile is up to date."""

from __future__ import annotations

import asyncio

import pytest

from chat.live.doorbell import chat_group
from chat.live.layers import live_layer
from tests.classroom.test_supervision import open_wall, world  # noqa: F401 - a fixture
from tests.runhost.conftest import runner_state  # noqa: F401 - a fixture used by name

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _runtime(settings, tmp_path, runner_state):  # noqa: F811
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.3


async def test_snapshots_within_one_interval_make_one_frame(world):  # noqa: F811
    chat = world["chat"]
    comm, ok, _ = await open_wall(world["teacher"], world["room"].pk)
    assert ok
    await comm.send_json_to({"action": "resync", "seqs": {str(chat.pk): chat.last_display_seq}})
    await asyncio.sleep(0.2)
    while not await comm.receive_nothing(0.1):
        await comm.receive_from()
    layer = live_layer()
    for i in range(20):
        await layer.group_send(
            chat_group(chat.pk),
            {
                "type": "chat.stream",
                "chat_id": str(chat.pk),
                "run_id": "r1",
                "round": 1,
                "text": f"<Ada>word{i} " * 3 + "</Ada>",
                "speakers": ["Ada"],
                "html": "<div>the chat page's own rendering</div>",
            },
        )
    frame = await comm.receive_from(5)
    assert f'id="tile-stream-{chat.pk}"' in frame and "word19" in frame
    assert "word18" not in frame and "the chat page" not in frame
    assert await comm.receive_nothing(0.5)
    await comm.disconnect()
