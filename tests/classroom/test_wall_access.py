"""The wall re-checks the teacher's access to its tiles in the background, every followed
chat in one check: a push never waits for the database, a chat the teacher may no
longer see stops being pushed while the others go on, and a teacher who loses the class
loses the socket without the page doing anything."""

from __future__ import annotations

import pytest

from chat.live import subscription
from chat.live.doorbell import chat_group
from chat.live.layers import live_layer
from classroom import actions
from classroom.consumers import WallConsumer
from classroom.models import Classroom, ClassroomChat
from tests.classroom.test_supervision import WAIT, open_wall, world  # noqa: F401 - a fixture
from tests.runhost.conftest import runner_state  # noqa: F401 - a fixture used by name
from tests.runhost.helpers import adb, until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _runtime(settings, tmp_path, runner_state, monkeypatch):  # noqa: F811
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.05
    monkeypatch.setattr(subscription, "ACCESS_RECHECK_SECONDS", 0.2)


@pytest.fixture
def trips(monkeypatch) -> list[list[str]]:
    """The chats each trip of the wall's access check asked about."""
    asked: list[list[str]] = []
    check = WallConsumer._may_view_many

    def counted(self, chat_ids):
        asked.append(list(chat_ids))
        return check(self, chat_ids)

    monkeypatch.setattr(WallConsumer, "_may_view_many", counted)
    return asked


async def two_tiles(world):  # noqa: F811
    second = await adb(actions.open_class_chat)(world["classmate"], world["room"].pk)
    comm, ok, _ = await open_wall(world["teacher"], world["room"].pk)
    assert ok
    await comm.send_json_to({"action": "resync", "seqs": {}})
    sam, cleo = str(world["chat"].pk), str(second.chat_id)
    frames = ""
    while f'id="tile-seq-{sam}"' not in frames or f'id="tile-seq-{cleo}"' not in frames:
        frames += await comm.receive_from(WAIT)  # both tiles are followed from here on
    return comm, sam, cleo


async def snapshot(chat_id: str, word: str) -> None:
    await live_layer().group_send(
        chat_group(chat_id),
        {
            "type": "chat.stream",
            "chat_id": chat_id,
            "run_id": f"run-{chat_id}",
            "round": 1,
            "text": f"<Ada>{word}</Ada>",
            "speakers": ["Ada"],
            "html": "",
        },
    )


async def tile_lines(comm, *chat_ids: str, word: str) -> str:
    """Push a snapshot to each chat and return the frames until one shows the first's."""
    for chat_id in chat_ids:
        await snapshot(chat_id, word)
    seen = ""
    while word not in seen or f'id="tile-stream-{chat_ids[0]}"' not in seen:
        seen += await comm.receive_from(WAIT)
    return seen


async def test_every_tile_is_rechecked_in_one_check(world, trips):  # noqa: F811
    comm, sam, cleo = await two_tiles(world)
    await until(lambda: len(trips) >= 3)
    for round_ in range(5):  # the tiles' own re-checks fall due meanwhile
        frames = await tile_lines(comm, sam, cleo, word=f"word{round_}")
        assert sam in frames
    assert trips and all(sorted(chats) == sorted([sam, cleo]) for chats in trips), trips
    await comm.disconnect()


async def test_a_chat_no_longer_visible_stops_while_the_others_go_on(world):  # noqa: F811
    comm, sam, cleo = await two_tiles(world)
    frames = await tile_lines(comm, sam, cleo, word="before")
    while f'id="tile-stream-{cleo}"' not in frames:  # both tiles are pushed
        frames += await comm.receive_from(WAIT)
    # cleo's class chat leaves the class: no longer one this teacher may watch
    other_room = await adb(Classroom.objects.filter(owner=world["other_teacher"]).get)()
    await adb(ClassroomChat.objects.filter(chat_id=cleo).update)(classroom=other_room)
    for round_ in range(200):
        frames = await tile_lines(comm, sam, cleo, word=f"after{round_}")
        if f'id="tile-stream-{cleo}"' not in frames:
            break
    for round_ in range(5):  # from then on, only sam's tile is pushed
        frames = await tile_lines(comm, sam, cleo, word=f"later{round_}")
        assert f'id="tile-stream-{sam}"' in frames
        assert f'id="tile-stream-{cleo}"' not in frames
    await comm.disconnect()


async def test_a_teacher_who_loses_the_class_loses_the_wall_unasked(world):  # noqa: F811
    comm, _sam, _cleo = await two_tiles(world)
    room = world["room"]
    room.owner = world["other_teacher"]
    await adb(room.save)()
    output = await comm.receive_output(WAIT)
    while output["type"] != "websocket.close":  # the resync's frames first
        output = await comm.receive_output(WAIT)
    assert output["code"] == 4403
