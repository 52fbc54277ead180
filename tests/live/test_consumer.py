"""The chat socket end to end, without a browser.

WebsocketCommunicator talks to ``chatsite.asgi.application`` (the real stack: the
Origin check, session authentication, the URL router, ``ChatConsumer``) with a
session cookie from a logged-in test client. Runs execute in this process on the
offline demo model. The protocol basics (send and reply, idempotent send, resync,
two subscribers) run over both channel layers, in-memory and Redis; the rest over
the in-memory layer (a Redis-core disconnect costs about a second).

What a test checks is what the page would show: the items appended to
``#messages`` (their ``data-seq``), the ``#stream`` slot, ``#notice`` and the
``#seq-marker`` cursor, and what the database holds afterwards.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client

from chat import access, actions, store
from chat.core.messages import ChatMessage
from chat.live import subscription
from chat.live.layers import live_layer
from chat.models import Artifact, ChatSession, ChatToolGrant, QueuedInput, Run, ToolApproval
from chat.presentation import display, fragments
from chat.presentation.fragments import REPLAY_BATCH
from chat.runhost import executor
from chatsite.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)

WAIT = 15.0  # upper bound on any one wait; nothing here normally takes a second
REDIS_URL = "redis://127.0.0.1:6379"
ORIGIN = b"http://localhost"
MEMORY_LAYER = {"default": {"BACKEND": "chat.live.layers.LeanInMemoryChannelLayer"}}
LAYERS = ["memory", "redis"]


def adb(fn: Callable) -> Callable:
    return database_sync_to_async(fn)


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def layer_kind(request) -> str:
    """Which channel layer a test uses; parametrize indirectly to change it."""
    return getattr(request, "param", "memory")


@pytest.fixture(autouse=True)
async def socket_env(settings, tmp_path, layer_kind, transactional_db):
    """In-process runner on a fast demo model, the chosen channel layer, and no run
    task or sweeper left behind (they are module state of ``chat.runhost.executor``)."""
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.002
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.02
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.02
    settings.LYCEUM_RUN_GUARD_SECONDS = 60.0
    settings.LYCEUM_APPROVAL_TIMEOUT = 900.0
    if layer_kind == "redis":
        # channels drops its cached layers when CHANNEL_LAYERS changes.
        prefix = f"lyceum-test-{uuid.uuid4().hex[:12]}"
        hosts = [{"address": REDIS_URL, "socket_timeout": 30.0}]
        settings.CHANNEL_LAYERS = {  # as the settings make them from REDIS_URL
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {"hosts": hosts, "prefix": prefix},
            },
            "live": {
                "BACKEND": "chat.live.layers.PipelinedPubSubChannelLayer",
                "CONFIG": {"hosts": hosts, "prefix": prefix},
            },
        }
    else:
        settings.CHANNEL_LAYERS = MEMORY_LAYER
    layer = get_channel_layer()
    assert not executor._tasks
    yield layer
    await executor.stop_all()
    await layer.flush()
    await live_layer().flush()
    if layer_kind == "redis":
        await layer.close_pools()


@pytest.fixture
def temporary_policy():
    """Register chat policies for one test and remove them afterwards."""
    added: list[access.ChatPolicy] = []

    def register(policy: access.ChatPolicy) -> access.ChatPolicy:
        access.register_chat_policy(policy)
        added.append(policy)
        return policy

    yield register
    for policy in added:
        if policy in access._policies:
            access._policies.remove(policy)


def grant(user, chat: ChatSession, *allowed: access.ChatAction) -> access.ChatPolicy:
    """A policy giving ``user`` the ``allowed`` actions on ``chat`` (a watching teacher)."""

    def policy(who, target, action) -> bool:
        return who.pk == user.pk and target.pk == chat.pk and action in allowed

    return policy


# --- reading frames ---------------------------------------------------------------------------


@dataclass
class Piece:
    """One thing a frame does to the page, in frame order."""

    kind: str  # item | marker | stream | notice | composer
    seq: int = 0
    css: str = ""
    run: str = ""
    text: str = ""


class _FrameParser(HTMLParser):
    VOID = {"input", "br", "img", "hr", "meta", "link", "source", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[Piece] = []
        self.open: Piece | None = None
        self.depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.open is not None:
            if tag not in self.VOID:
                self.depth += 1
            return
        a = {name: value or "" for name, value in attrs}
        dom_id = a.get("id", "")
        if dom_id == "seq-marker":
            self.pieces.append(Piece("marker", seq=int(a["data-seq"])))
            return
        if dom_id.startswith("ev-") and "data-seq" in a:
            piece = Piece("item", seq=int(a["data-seq"]), css=a.get("class", ""))
        elif dom_id == "stream":
            piece = Piece("stream", css=a.get("class", ""), run=a.get("data-run", ""))
        elif dom_id == "notice":
            piece = Piece("notice")
        elif dom_id == "composer":
            piece = Piece("composer")
        else:
            return
        self.pieces.append(piece)
        if tag not in self.VOID:
            self.open, self.depth = piece, 1

    def handle_endtag(self, tag: str) -> None:
        if self.open is None or tag in self.VOID:
            return
        self.depth -= 1
        if self.depth == 0:
            self.open.text = " ".join(self.open.text.split())
            self.open = None

    def handle_data(self, data: str) -> None:
        if self.open is not None:
            self.open.text += data


def parse(frame: str) -> list[Piece]:
    parser = _FrameParser()
    parser.feed(frame)
    parser.close()
    return parser.pieces


def items(pieces: list[Piece]) -> list[Piece]:
    return [p for p in pieces if p.kind == "item"]


def item_seqs(pieces: list[Piece]) -> list[int]:
    return [p.seq for p in pieces if p.kind == "item"]


def markers(pieces: list[Piece]) -> list[int]:
    return [p.seq for p in pieces if p.kind == "marker"]


def is_usage(piece: Piece) -> bool:
    return piece.kind == "item" and "usage" in piece.css.split()


def is_assistant(piece: Piece) -> bool:
    return piece.kind == "item" and "assistant" in piece.css.split()


def is_live_stream(piece: Piece) -> bool:
    return piece.kind == "stream" and bool(piece.run)


class Socket:
    """A communicator plus everything it has received, parsed."""

    def __init__(self, communicator: WebsocketCommunicator) -> None:
        self.comm = communicator
        self.frames: list[str] = []
        self.pieces: list[Piece] = []

    async def send(self, **frame: Any) -> None:
        await self.comm.send_to(text_data=json.dumps(frame))

    async def send_raw(self, text: str) -> None:
        await self.comm.send_to(text_data=text)

    async def resync(self, last_seq: int = 0) -> None:
        await self.send(action="resync", last_seq=last_seq)

    async def receive(self, timeout: float = WAIT) -> list[Piece]:
        """The next frame. A timeout here is a failure (and ends the consumer)."""
        frame = await self.comm.receive_from(timeout=timeout)
        self.frames.append(frame)
        pieces = parse(frame)
        self.pieces += pieces
        return pieces

    async def until(self, done: Callable[[Piece], bool], timeout: float = WAIT) -> list[Piece]:
        """Frames until one has a piece matching ``done``; the pieces received meanwhile."""
        start = len(self.pieces)
        async with asyncio.timeout(timeout):
            while not any(done(p) for p in self.pieces[start:]):
                await self.receive(timeout)
        return self.pieces[start:]

    async def until_frame(self, done: Callable[[str], bool], timeout: float = WAIT) -> str:
        """Frames until one whose raw HTML matches ``done``; returns that frame."""
        async with asyncio.timeout(timeout):
            while True:
                await self.receive(timeout)
                if done(self.frames[-1]):
                    return self.frames[-1]

    async def until_marker(self, seq: int) -> None:
        """Frames until the page's cursor has reached ``seq``."""
        if max(markers(self.pieces), default=-1) < seq:
            await self.until(lambda p: p.kind == "marker" and p.seq >= seq)

    async def closed_with(self) -> int:
        """The close code of a socket the server is closing (frames before it are kept)."""
        async with asyncio.timeout(WAIT):
            while True:
                message = await self.comm.receive_output(WAIT)
                if message["type"] == "websocket.close":
                    return message.get("code", 1000)
                self.frames.append(message["text"])
                self.pieces += parse(message["text"])

    async def drain(self, quiet: float = 0.2) -> None:
        """Read frames until none has come for ``quiet`` seconds."""
        while not await self.nothing(quiet):
            await self.receive()

    async def nothing(self, wait: float = 0.2) -> bool:
        return await self.comm.receive_nothing(timeout=wait)

    async def close(self) -> None:
        await self.comm.disconnect()


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[django_settings.SESSION_COOKIE_NAME].value


async def open_socket(
    user, chat_id, *, origin: bytes | None = ORIGIN, resync: int | None = 0, language: str = ""
) -> tuple[Socket, bool, Any]:
    """A communicator on the chat's socket; returns it, whether it was accepted, and
    the close code (when refused). ``resync`` is what the page sends once open;
    ``language``, the language picker's cookie of the page."""
    headers = []
    if origin is not None:
        headers.append((b"origin", origin))
    if user is not None:
        sid = await adb(session_cookie)(user)
        cookie = f"{django_settings.SESSION_COOKIE_NAME}={sid}"
        if language:
            cookie += f"; {django_settings.LANGUAGE_COOKIE_NAME}={language}"
        headers.append((b"cookie", cookie.encode()))
    comm = WebsocketCommunicator(application, f"/ws/chat/{chat_id}/", headers=headers)
    connected, code = await comm.connect(timeout=WAIT)
    socket = Socket(comm)
    if connected and resync is not None:
        await socket.resync(resync)
    return socket, connected, code


async def connected(user, chat_id, *, resync: int | None = 0) -> Socket:
    socket, ok, code = await open_socket(user, chat_id, resync=resync)
    assert ok, f"socket refused ({code})"
    return socket


async def close_all(*sockets: Socket) -> None:
    # Disconnects in parallel: each takes about a second on the Redis core layer.
    await asyncio.gather(*(s.close() for s in sockets))


# --- database views -----------------------------------------------------------------------------


async def new_chat(user, model: str = "demo-fast") -> ChatSession:
    return await adb(actions.new_chat)(user, model=model)


def expected_item_seqs(chat_id, after: int = 0) -> list[int]:
    """The display events after ``after`` that the page shows as items."""
    return [
        e.seq
        for e in store.display_events_after(chat_id, after)
        if display.item_from_event(e) is not None
    ]


def last_seq(chat_id) -> int:
    return ChatSession.objects.get(pk=chat_id).last_display_seq


def counts(chat_id) -> dict[str, int]:
    events = store.display_events_after(chat_id, 0)
    return {
        "events": len(events),
        "user_messages": sum(1 for e in events if e.kind == "msg" and e.payload["role"] == "user"),
        "inputs": QueuedInput.objects.filter(chat_id=chat_id).count(),
        "runs": Run.objects.filter(chat_id=chat_id).count(),
    }


async def settle(timeout: float = WAIT) -> None:
    """Wait until no run task is left (including runs started after another ended)."""
    async with asyncio.timeout(timeout):
        while executor._tasks:
            await asyncio.gather(*list(executor._tasks.values()), return_exceptions=True)
            await asyncio.sleep(0)


async def until(check: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Poll a database check until it returns something truthy."""
    async with asyncio.timeout(timeout):
        while not (value := await adb(check)()):
            await asyncio.sleep(0.01)
    return value


async def exchange(user, chat: ChatSession, text: str) -> None:
    """One finished exchange, started the way the socket starts it."""
    await adb(actions.send_message)(user, chat.pk, text, uuid.uuid4().hex)
    await settle()


def assert_strictly_increasing(values: list[int]) -> None:
    assert values, "no #seq-marker arrived"
    assert all(a < b for a, b in zip(values, values[1:], strict=False)), values


# --- connecting -----------------------------------------------------------------------------


async def test_anonymous_socket_is_refused(alice, agent):
    chat = await new_chat(alice)
    _socket, ok, code = await open_socket(None, chat.pk)
    assert (ok, code) == (False, 4401)


async def test_another_users_chat_and_a_missing_chat_are_refused(alice, bob, agent):
    chat = await new_chat(alice)
    for chat_id in (chat.pk, uuid.uuid4()):
        _socket, ok, code = await open_socket(bob, chat_id)
        assert (ok, code) == (False, 4404)


@pytest.mark.parametrize("origin", [b"http://evil.example", b"null", None])
async def test_a_bad_or_missing_origin_is_refused(alice, agent, origin):
    chat = await new_chat(alice)
    _socket, ok, _code = await open_socket(alice, chat.pk, origin=origin)
    assert not ok


# --- send and reply ---------------------------------------------------------------------------


@pytest.mark.parametrize("layer_kind", LAYERS, indirect=True)
async def test_a_reply_arrives_as_fragments_in_order(alice, agent, layer_kind):
    chat = await new_chat(alice, model="demo")
    socket = await connected(alice, chat.pk)
    await socket.send(action="send", message="hello there", client_id="c-1")
    pieces = await socket.until(is_usage)
    await settle()

    kinds = [(p.kind, p.css.split()[1] if p.kind == "item" else "") for p in pieces]
    user_at = kinds.index(("item", "user"))
    assistant_at = next(i for i, p in enumerate(pieces) if is_assistant(p))
    usage_at = next(i for i, p in enumerate(pieces) if is_usage(p))
    streams = [i for i, p in enumerate(pieces) if is_live_stream(p)]
    assert user_at < streams[0] and streams[-1] < assistant_at < usage_at
    assert "hello there" in pieces[user_at].text
    # The snapshots grow into the reply; the slot is emptied once the reply is written.
    run = await Run.objects.aget(chat_id=chat.pk)
    assert {pieces[i].run for i in streams} == {str(run.pk)}
    sizes = [len(pieces[i].text) for i in streams]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    assert any(p.kind == "stream" and not p.run for p in pieces[assistant_at:])
    assert "composer" in [p.kind for p in pieces]
    assert_strictly_increasing(markers(pieces))
    # Exactly the stored items, each once, and the cursor ends at the last event.
    assert item_seqs(pieces) == await adb(expected_item_seqs)(chat.pk)
    assert markers(pieces)[-1] == await adb(last_seq)(chat.pk)
    assert run.status == Run.Status.COMPLETED
    assert "hello there" in pieces[assistant_at].text  # the demo model quotes the user
    await socket.close()


async def test_the_owner_writing_from_a_chinese_page_moves_an_english_chat_to_chinese(alice, agent):
    chat = await new_chat(alice, model="demo")
    assert chat.language != "zh-hans"
    socket, ok, _code = await open_socket(alice, chat.pk, language="zh-hans")
    assert ok
    await socket.send(action="send", message="hello there", client_id="c-zh")
    pieces = await socket.until(is_usage)
    await settle()
    assert (await ChatSession.objects.aget(pk=chat.pk)).language == "zh-hans"
    reply = next(p for p in pieces if is_assistant(p))
    assert "我是 Lyceum 的离线演示模型" in reply.text  # the model asked to answer in Chinese
    controls = [p for p in pieces if "重新生成" in p.text]
    assert controls, "the run's live fragments are rendered in Chinese"
    await socket.close()

    # Sending from an English page moves it back (the page is up to date: a resync
    # from 0 would read the first reply's end back before this send's).
    socket = await connected(alice, chat.pk, resync=await adb(last_seq)(chat.pk))
    await socket.send(action="send", message="hello again", client_id="c-en")
    await socket.until(is_usage)
    await settle()
    assert (await ChatSession.objects.aget(pk=chat.pk)).language == "en"
    await socket.close()


def count_log_reads(monkeypatch) -> list[int]:
    """How many events each read of the log by a socket returned."""
    reads: list[int] = []
    original = fragments.next_batch

    def counting(chat_id, after_seq):
        events, html = original(chat_id, after_seq)
        reads.append(len(events))
        return events, html

    monkeypatch.setattr(fragments, "next_batch", counting)
    return reads


@pytest.mark.parametrize("layer_kind", LAYERS, indirect=True)
async def test_an_up_to_date_page_gets_written_events_from_the_doorbell_alone(
    alice, agent, layer_kind, monkeypatch
):
    chat = await new_chat(alice, model="demo")
    socket = await connected(alice, chat.pk)
    await socket.drain()
    reads = count_log_reads(monkeypatch)

    await socket.send(action="send", message="hello there", client_id="c-1")
    pieces = await socket.until(is_usage)
    await settle()

    assert [n for n in reads if n] == []  # every written event came with its doorbell
    assert item_seqs(pieces) == await adb(expected_item_seqs)(chat.pk)
    assert markers(pieces)[-1] == await adb(last_seq)(chat.pk)
    assert not [
        p for p in pieces[pieces.index(next(filter(is_assistant, pieces))) :] if is_live_stream(p)
    ]  # no snapshot after the written reply
    await socket.close()


@pytest.mark.parametrize("layer_kind", LAYERS, indirect=True)
async def test_a_page_that_missed_a_doorbell_reads_the_gap_from_the_log(
    alice, agent, layer_kind, monkeypatch
):
    chat = await new_chat(alice, model="demo")
    socket = await connected(alice, chat.pk)
    await socket.drain()
    reads = count_log_reads(monkeypatch)
    layer = live_layer()
    original = layer.group_send
    dropped: list[int] = []

    async def dropping_the_first_doorbell(group: str, message: dict) -> None:
        if message.get("type") == "chat.events" and not dropped:
            dropped.append(message["seq"])  # the user's message, lost on the way
            return
        await original(group, message)

    monkeypatch.setattr(layer, "group_send", dropping_the_first_doorbell)
    await socket.send(action="send", message="hello there", client_id="c-1")
    pieces = await socket.until(is_usage)
    await settle()

    assert dropped and sum(reads) >= 1  # the next doorbell showed the gap
    assert item_seqs(pieces) == await adb(expected_item_seqs)(chat.pk)
    assert_strictly_increasing(markers(pieces))
    assert markers(pieces)[-1] == await adb(last_seq)(chat.pk)
    await socket.close()


@pytest.mark.parametrize("layer_kind", LAYERS, indirect=True)
async def test_the_same_client_id_twice_stores_one_message_and_one_run(alice, agent, layer_kind):
    chat = await new_chat(alice)
    one, two = await connected(alice, chat.pk), await connected(alice, chat.pk)
    # A resend on one socket (what a page does when it is unsure the first one arrived).
    await one.send(action="send", message="only once", client_id="dup-1")
    await one.send(action="send", message="only once", client_id="dup-1")
    await one.until(is_usage)
    await settle()
    stored = await adb(counts)(chat.pk)
    assert (stored["user_messages"], stored["inputs"], stored["runs"]) == (1, 1, 1)
    # Two sockets racing with the same id.
    await asyncio.gather(
        one.send(action="send", message="a race", client_id="dup-2"),
        two.send(action="send", message="a race", client_id="dup-2"),
    )
    first_reply_end = max(p.seq for p in one.pieces if is_usage(p))
    await one.until(lambda p: is_usage(p) and p.seq > first_reply_end)
    await settle()
    final = await adb(last_seq)(chat.pk)
    await one.until_marker(final)
    await two.until_marker(final)

    stored = await adb(counts)(chat.pk)
    assert (stored["user_messages"], stored["inputs"], stored["runs"]) == (2, 2, 2)
    expected = await adb(expected_item_seqs)(chat.pk)
    assert item_seqs(one.pieces) == expected
    assert item_seqs(two.pieces) == expected
    for socket in (one, two):
        users = [p for p in items(socket.pieces) if "user" in p.css.split()]
        assert ["only once" in users[0].text, "a race" in users[1].text] == [True, True]
        assert len(users) == 2
        assert len([p for p in items(socket.pieces) if is_usage(p)]) == 2
        assert [p.text for p in socket.pieces if p.kind == "notice" and p.text] == []
    await close_all(one, two)


# --- resync ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layer_kind", LAYERS, indirect=True)
async def test_resync_from_any_seq_gives_exactly_the_events_after_it(alice, agent, layer_kind):
    chat = await new_chat(alice)
    await exchange(alice, chat, "calculate 12*7")  # a tool call, its result and a reply
    last = await adb(last_seq)(chat.pk)
    cursors = [0, 1, last // 2, last - 1, last]
    sockets = [await connected(alice, chat.pk, resync=k) for k in cursors]
    for k, socket in zip(cursors, sockets, strict=True):
        if k == last:
            assert await socket.nothing(), "an up-to-date page gets nothing"
            continue
        await socket.until_marker(last)
        assert item_seqs(socket.pieces) == await adb(expected_item_seqs)(chat.pk, k), k
        assert markers(socket.pieces)[-1] == last
        assert all(k < seq <= last for seq in markers(socket.pieces))
    # The cursor moved: a second resync from the same point repeats nothing twice.
    first = sockets[0]
    first.pieces.clear()
    await first.resync(last)
    assert await first.nothing()
    await close_all(*sockets)


async def test_a_client_a_thousand_events_behind_gets_them_all_in_batches(alice, agent):
    chat = await new_chat(alice)
    notes = [ChatMessage(role="system", content=f"note {i}") for i in range(1, 1001)]
    await adb(store.append_display_messages)(chat.pk, notes)
    socket = await connected(alice, chat.pk, resync=0)
    await socket.until_marker(1000)
    assert item_seqs(socket.pieces) == list(range(1, 1001))
    assert [p.text for p in items(socket.pieces)][-1] == "note 1000"
    assert len(socket.frames) == 1000 // REPLAY_BATCH  # batched, one frame per batch
    assert_strictly_increasing(markers(socket.pieces))
    assert await socket.nothing()
    await socket.close()


@pytest.mark.parametrize("layer_kind", LAYERS, indirect=True)
async def test_two_sockets_on_one_chat_see_the_same_items_in_the_same_order(
    alice, agent, layer_kind
):
    chat = await new_chat(alice)
    one, two = await connected(alice, chat.pk), await connected(alice, chat.pk)
    await one.send(action="send", message="what is 6*7", client_id="tab-1")
    await one.until(is_usage)
    await two.until(is_usage)
    await settle()
    expected = await adb(expected_item_seqs)(chat.pk)
    assert len(expected) >= 4  # user, tool call, tool result, reply, usage
    assert item_seqs(one.pieces) == item_seqs(two.pieces) == expected
    assert [(p.css, p.text) for p in items(one.pieces)] == [
        (p.css, p.text) for p in items(two.pieces)
    ]
    # Only the sender's composer is reset.
    assert [p.kind for p in one.pieces].count("composer") == 1
    assert "composer" not in [p.kind for p in two.pieces]
    await close_all(one, two)


async def test_a_page_reconnecting_during_a_run_gets_the_partial_then_the_rest(alice, agent):
    chat = await new_chat(alice, model="demo")
    first = await connected(alice, chat.pk)
    await first.send(action="send", message="give me a long answer", client_id="long-1")
    run = await until(
        lambda: next(
            (r for r in Run.objects.filter(chat_id=chat.pk) if len(r.partial_text.split()) >= 8),
            None,
        )
    )
    await first.close()  # the tab goes away; the run does not

    seen = await adb(last_seq)(chat.pk)
    again = await connected(alice, chat.pk, resync=seen)
    opening = await again.until(is_live_stream)
    partial = next(p for p in opening if is_live_stream(p))
    assert partial.run == str(run.pk) and partial.text
    await again.until(is_usage, timeout=30)
    await settle()

    replies = [p for p in items(again.pieces) if is_assistant(p)]
    assert len(replies) == 1, "the final reply appears once"
    opening_words = "You asked for something long, so here"
    assert opening_words in partial.text
    assert replies[0].text.count(opening_words) == 1
    assert "thank you for your patience" in replies[0].text  # the whole reply
    # No snapshot of that reply after the reply itself.
    after_reply = again.pieces[again.pieces.index(replies[0]) :]
    assert not [p for p in after_reply if is_live_stream(p)]
    assert item_seqs(again.pieces) == await adb(expected_item_seqs)(chat.pk, seen)
    assert (await Run.objects.aget(pk=run.pk)).status == Run.Status.COMPLETED
    await again.close()


# --- bad frames -------------------------------------------------------------------------------


def notices(pieces: list[Piece]) -> list[str]:
    return [p.text for p in pieces if p.kind == "notice" and p.text]


async def test_bad_frames_get_an_error_notice_and_the_socket_stays_usable(alice, bob, agent):
    chat = await new_chat(alice)
    other_chat = await new_chat(bob)
    socket = await connected(alice, chat.pk)
    bystander = await connected(bob, other_chat.pk)
    before = await adb(counts)(chat.pk)
    too_big = json.dumps(
        {
            "action": "send",
            "message": "x" * django_settings.LYCEUM_MAX_FRAME_BYTES,
            "client_id": "b",
        }
    )
    bad_frames = {
        "malformed JSON": '{"action": "send", "message": ',
        "a JSON array": '["send", "hello"]',
        "a JSON string": '"send"',
        "too large": too_big,
        "unknown action": json.dumps({"action": "format_disk"}),
        "no action": json.dumps({"message": "hello"}),
        "a private method": json.dumps({"action": "_allowed"}),
        "send without message": json.dumps({"action": "send", "client_id": "no-text"}),
        "send without client id": json.dumps({"action": "send", "message": "hello"}),
        "approve without call": json.dumps({"action": "approve"}),
        "nesting deeper than the parser": "[" * 20_000 + "]" * 20_000,
    }
    for name, raw in bad_frames.items():
        await socket.send_raw(raw)
        pieces = await socket.until(lambda p: p.kind == "notice")
        assert notices(pieces), name
    assert await socket.nothing()
    assert await adb(counts)(chat.pk) == before  # nothing stored

    # Same socket, still open and working; the other chat's socket is unaffected.
    await socket.send(action="send", message="still here?", client_id="after-1")
    await socket.until(is_usage)
    await bystander.send(action="send", message="and me?", client_id="other-1")
    await bystander.until(is_usage)
    await settle()
    assert (await adb(counts)(chat.pk))["runs"] == 1
    assert (await adb(counts)(other_chat.pk))["runs"] == 1
    assert not notices(bystander.pieces)
    # A cursor no integer can hold (1e999 parses as infinity) counts as "from the start".
    socket.pieces.clear()
    await socket.send_raw('{"action": "resync", "last_seq": 1e999}')
    await socket.until_marker(await adb(last_seq)(chat.pk))
    assert item_seqs(socket.pieces) == await adb(expected_item_seqs)(chat.pk)
    await close_all(socket, bystander)


# --- access, checked per action -------------------------------------------------------------------


async def test_access_lost_mid_socket_refuses_the_next_action_and_closes(
    alice, bob, agent, temporary_policy
):
    chat = await new_chat(alice)
    policy = temporary_policy(grant(bob, chat, access.ChatAction.VIEW, access.ChatAction.WRITE))
    socket = await connected(bob, chat.pk)
    await socket.send(action="send", message="hello from bob", client_id="bob-1")
    await socket.until(is_usage)
    await settle()
    before = await adb(counts)(chat.pk)

    access._policies.remove(policy)  # e.g. bob left the class
    await socket.send(action="send", message="one more", client_id="bob-2")
    assert await socket.closed_with() == 4403
    assert notices(socket.pieces)
    assert await adb(counts)(chat.pk) == before


async def test_a_deactivated_user_is_refused_on_the_next_action(alice, agent):
    chat = await new_chat(alice)
    socket = await connected(alice, chat.pk)
    before = await adb(counts)(chat.pk)
    alice.is_active = False
    await adb(alice.save)(update_fields=["is_active"])
    await socket.send(action="send", message="am I still here?", client_id="gone-1")
    assert await socket.closed_with() == 4403
    assert await adb(counts)(chat.pk) == before


async def test_a_view_only_user_watches_but_cannot_send_cancel_or_approve(
    alice, bob, agent, temporary_policy
):
    chat = await new_chat(alice)
    temporary_policy(grant(bob, chat, access.ChatAction.VIEW))
    owner = await connected(alice, chat.pk)
    watcher = await connected(bob, chat.pk)
    await owner.send(action="send", message="write file notes.md", client_id="own-1")
    await watcher.until_frame(lambda f: 'name="call_id"' in f)
    approval = await ToolApproval.objects.aget(chat_id=chat.pk)
    before = await adb(counts)(chat.pk)

    refused = [
        {"action": "send", "message": "let me in", "client_id": "bob-1"},
        {"action": "cancel"},
        {"action": "approve", "call_id": approval.call_id},
        {"action": "always", "call_id": approval.call_id},
        {"action": "deny", "call_id": approval.call_id, "reason": "no"},
        {"action": "switch_model", "model": "demo"},
    ]
    for frame in refused:
        await watcher.send(**frame)
        assert notices(await watcher.until(lambda p: p.kind == "notice")), frame
    assert await adb(counts)(chat.pk) == before
    approval = await ToolApproval.objects.aget(pk=approval.pk)
    assert approval.status == ToolApproval.Status.PENDING
    assert (await Run.objects.aget(chat_id=chat.pk)).status == Run.Status.WAITING
    assert (await ChatSession.objects.aget(pk=chat.pk)).model == "demo-fast"
    assert not await ChatToolGrant.objects.filter(chat_id=chat.pk).aexists()

    # Still watching: the owner's answer reaches the watcher live.
    await owner.send(action="deny", call_id=approval.call_id, reason="not now")
    await watcher.until(is_usage)
    await settle()
    assert item_seqs(watcher.pieces) == await adb(expected_item_seqs)(chat.pk)
    await close_all(owner, watcher)


async def test_a_watcher_whose_access_is_taken_away_stops_receiving_the_chat(
    alice, bob, agent, temporary_policy, settings, monkeypatch
):
    monkeypatch.setattr(subscription, "ACCESS_RECHECK_SECONDS", 0.05)
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.02
    chat = await new_chat(alice, model="demo")
    policy = temporary_policy(grant(bob, chat, access.ChatAction.VIEW))
    owner = await connected(alice, chat.pk)
    watcher = await connected(bob, chat.pk)
    await owner.send(action="send", message="long", client_id="own-1")
    await watcher.until(is_live_stream)  # watching the reply being written

    access._policies.remove(policy)  # say, the student left the teacher's class
    assert await watcher.closed_with() == 4403
    for _ in range(3):  # the reply goes on for its owner ...
        await owner.until(is_live_stream)
    assert await watcher.nothing(0.1)  # ... and nothing more reaches the watcher
    await owner.send(action="cancel")
    await owner.until(lambda p: p.kind == "item" and "stopped" in p.text)
    await settle()
    await close_all(owner)


async def test_a_deactivated_user_watching_is_closed_out(alice, agent, settings, monkeypatch):
    monkeypatch.setattr(subscription, "ACCESS_RECHECK_SECONDS", 0.05)
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.02
    chat = await new_chat(alice, model="demo")
    socket = await connected(alice, chat.pk)
    other = await connected(alice, chat.pk)  # a second tab, still logged in
    await socket.send(action="send", message="long", client_id="own-1")
    await other.until(is_live_stream)

    alice.is_active = False
    await adb(alice.save)(update_fields=["is_active"])
    assert await other.closed_with() == 4403
    assert await socket.closed_with() == 4403


# --- stop, approvals, model switch ----------------------------------------------------------------


async def test_cancel_stops_a_long_reply_and_keeps_the_partial(alice, agent):
    chat = await new_chat(alice, model="demo")
    socket = await connected(alice, chat.pk)
    await socket.send(action="send", message="a long answer please", client_id="long-1")
    await socket.until(lambda p: is_live_stream(p) and "You asked for something long" in p.text)
    await socket.send(action="cancel")
    pieces = await socket.until(lambda p: p.kind == "item" and "stopped" in p.css.split())
    await settle()

    (reply,) = [p for p in items(socket.pieces) if is_assistant(p)]
    assert "ended-cancelled" in reply.css.split()
    assert "stopped" in reply.text  # the badge
    assert "You asked for something long" in reply.text
    assert "That is the end of the long answer" not in reply.text
    assert any("Stopped" in p.text for p in items(pieces))
    run = await Run.objects.aget(chat_id=chat.pk)
    assert run.status == Run.Status.CANCELLED
    kept = [
        e.payload
        for e in await adb(store.display_events_after)(chat.pk, 0)
        if e.kind == "msg" and e.payload.get("extra", {}).get("ended") == "cancelled"
    ]
    assert len(kept) == 1 and kept[0]["content"].startswith("You asked for something long")
    # A second Stop is harmless.
    await socket.send(action="cancel")
    assert await socket.nothing()
    assert item_seqs(socket.pieces) == await adb(expected_item_seqs)(chat.pk)
    await socket.close()


async def _pending_call(socket: Socket) -> str:
    frame = await socket.until_frame(lambda f: 'name="call_id"' in f)
    start = frame.index('name="call_id" value="') + len('name="call_id" value="')
    return frame[start : frame.index('"', start)]


@pytest.mark.parametrize("decision", ["approve", "always", "deny"])
async def test_approval_answers_over_the_socket_resume_the_run(alice, agent, settings, decision):
    chat = await new_chat(alice)
    socket = await connected(alice, chat.pk)
    await socket.send(action="send", message="write file notes.md", client_id="w-1")
    call_id = await _pending_call(socket)
    assert (await Run.objects.aget(chat_id=chat.pk)).status == Run.Status.WAITING
    # A page reconnecting now is not shown a reply being typed: the run waits for the user.
    late = await connected(alice, chat.pk)
    await late.until_marker(await adb(last_seq)(chat.pk))
    await late.drain()
    assert not [p for p in late.pieces if is_live_stream(p)]
    await late.close()

    frame = {"action": decision, "call_id": call_id}
    if decision == "deny":
        frame["reason"] = "keep my folder tidy"
    await socket.send(**frame)
    pieces = await socket.until(is_usage)
    await settle()

    (reply,) = [p for p in items(pieces) if is_assistant(p)]
    written = Artifact.objects.filter(chat_id=chat.pk, path="notes.md")  # the chat's files
    approval = await ToolApproval.objects.aget(call_id=call_id)
    grants = [g.tool_name async for g in ChatToolGrant.objects.filter(chat_id=chat.pk)]
    if decision == "deny":
        assert "keep my folder tidy" in reply.text
        assert approval.status == ToolApproval.Status.DENIED
        assert "Denied: “keep my folder tidy”" in "".join(socket.frames)
        assert not await written.aexists() and grants == []
    else:
        assert approval.status == ToolApproval.Status.APPROVED
        assert await written.aexists()
        assert grants == (["write_file"] if decision == "always" else [])
    assert (await Run.objects.aget(chat_id=chat.pk)).status == Run.Status.COMPLETED
    # Answering again changes nothing.
    await socket.send(**frame)
    assert await socket.nothing()

    if decision == "always":
        # Remembered for this chat: the next write runs without asking.
        seen = len(socket.frames)
        await socket.send(action="send", message="write file draft.md", client_id="w-2")
        await socket.until(is_usage)
        await settle()
        assert "Approve" not in "".join(socket.frames[seen:])
        assert await ToolApproval.objects.filter(chat_id=chat.pk).acount() == 1
        assert await Artifact.objects.filter(chat_id=chat.pk, path="draft.md").aexists()
    assert item_seqs(socket.pieces) == await adb(expected_item_seqs)(chat.pk)
    await socket.close()


async def test_switching_model_reaches_every_subscriber_and_unknown_models_change_nothing(
    alice, agent
):
    chat = await new_chat(alice, model="demo")
    one, two = await connected(alice, chat.pk), await connected(alice, chat.pk)
    await one.send(action="switch_model", model="demo-fast")
    for socket in (one, two):
        (item,) = items(await socket.until(lambda p: p.kind == "item"))
        assert "Model switched to demo-fast" in item.text
        assert '<option value="demo-fast" selected>' in socket.frames[-1]
    assert (await ChatSession.objects.aget(pk=chat.pk)).model == "demo-fast"

    before = await adb(counts)(chat.pk)
    await one.send(action="switch_model", model="gpt-imaginary")
    assert notices(await one.until(lambda p: p.kind == "notice"))
    assert await two.nothing()
    assert await adb(counts)(chat.pk) == before
    assert (await ChatSession.objects.aget(pk=chat.pk)).model == "demo-fast"
    # The next reply uses the new model.
    await one.send(action="send", message="hi", client_id="m-1")
    await one.until(is_usage)
    await settle()
    assert (await Run.objects.aget(chat_id=chat.pk)).model == "demo-fast"
    await close_all(one, two)


# --- the send's doorbell -----------------------------------------------------------------------


@pytest.mark.parametrize("language", ["en", "zh-hans"])
async def test_a_sends_doorbell_carries_its_events_rendered_in_the_senders_language(
    alice, agent, language
):
    """The send's doorbell carries the message and title as a render of the log's
    events in the sender's language shows them (wherever the doorbell is rendered: a
    render moved to the event loop once lost the language, see bench/README)."""
    from django.utils import translation

    from chat.live.doorbell import chat_group, events_doorbell
    from chat.models import ChatEvent

    chat = await new_chat(alice, model="demo")
    layer = live_layer()
    channel = await layer.new_channel()
    await layer.group_add(chat_group(chat.pk), channel)

    def send() -> actions.SendResult:
        with translation.override(language):
            return actions.send_message(alice, chat.pk, "hello <b>loop</b>", "c-loop")

    sent = await adb(send)()
    doorbell = await asyncio.wait_for(layer.receive(channel), WAIT)
    await settle()

    def in_place() -> dict:
        rows = list(
            ChatEvent.objects.filter(
                chat_id=chat.pk, channel=ChatEvent.Channel.DISPLAY, seq__lte=doorbell["seq"]
            ).order_by("seq")
        )
        with translation.override(language):
            return events_doorbell(chat.pk, rows)

    assert doorbell == await adb(in_place)()
    assert doorbell["after"] == sent.display_seq - 1
    assert [kind for _seq, kind, _short in doorbell["events"]] == ["msg", "title"]
    assert "hello &lt;b&gt;loop&lt;/b&gt;" in doorbell["html"]


def test_frames_go_to_the_servers_send_under_the_session_wrappers():
    from channels.sessions import InstanceSessionWrapper

    from chat.live.direct import frame_send

    async def server_send(message):
        pass

    scope = {"type": "websocket", "cookies": {}}
    outer = InstanceSessionWrapper(scope, server_send)
    inner = InstanceSessionWrapper(outer.scope, outer.send)  # not the outermost: passes through
    assert frame_send(inner.send) is server_send
    assert frame_send(server_send) is server_send
