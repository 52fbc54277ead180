"""The event store on a real database (CI runs this file on SQLite and PostgreSQL)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from chat import store
from chat.core import eventlog
from chat.core.messages import ToolCall, assistant, tool_result, user
from chat.models import ChatEvent

pytestmark = [pytest.mark.persistence]


@pytest.fixture
def chat(alice):
    return store.create_chat(alice, title="store test")


def session_payloads(chat):
    return list(
        ChatEvent.objects.filter(chat=chat, channel="session")
        .order_by("seq")
        .values_list("payload", flat=True)
    )


@pytest.mark.django_db
def test_persist_context_stops_at_the_safe_cut(chat):
    call = ToolCall("c1", "calculator", '{"expression": "1+1"}')
    context = [user("hi"), assistant("", tool_calls=[call])]
    persisted = store.persist_context(chat.pk, context, 0)
    assert persisted == 1  # the open tool group waits
    assert [p["role"] for p in session_payloads(chat)] == ["user"]

    context.append(tool_result("c1", "2"))
    persisted = store.persist_context(chat.pk, context, persisted)
    assert persisted == 3
    assert [p["role"] for p in session_payloads(chat)] == ["user", "assistant", "tool"]
    assert store.load_context(chat.pk) == context


@pytest.mark.django_db
def test_load_repairs_orphans_once_and_records_a_restore(chat):
    # A log written by an older version: a result whose call is missing.
    store.append_events(
        chat.pk,
        "session",
        [eventlog.msg_event(user("hi")), eventlog.msg_event(tool_result("ghost", "boo"))],
    )
    loaded = store.load_context(chat.pk)
    assert [m.role for m in loaded] == ["user"]
    kinds = [p["type"] for p in session_payloads(chat)]
    assert kinds == ["msg", "msg", "restore"]
    # The next load starts from the restore and needs no repair.
    assert store.load_context(chat.pk) == loaded
    assert len(session_payloads(chat)) == 3


@pytest.mark.django_db
def test_restore_replaces_context_but_keeps_the_history(chat):
    store.persist_context(chat.pk, [user("one"), assistant("two")], 0)
    store.restore_context(chat.pk, [user("summary")])
    assert [m.content for m in store.load_context(chat.pk)] == ["summary"]
    assert len(session_payloads(chat)) == 3


@pytest.mark.django_db
def test_display_seq_is_strictly_increasing_and_readable_after_any_seq(chat):
    store.append_display_messages(chat.pk, [user("a"), assistant("b")])
    store.append_display_messages(chat.pk, [user("c")])
    seqs = [e.seq for e in store.display_events_after(chat.pk, 0)]
    assert seqs == [1, 2, 3]
    assert [e.payload["content"] for e in store.display_events_after(chat.pk, 1)] == ["b", "c"]
    assert store.display_events_after(chat.pk, 3) == []
    assert [e.seq for e in store.display_events_before(chat.pk, None, 2)] == [2, 3]
    assert [e.seq for e in store.display_events_before(chat.pk, 2, 5)] == [1]
    chat.refresh_from_db()
    assert chat.last_display_seq == 3


@pytest.mark.django_db
def test_display_and_session_channels_number_independently(chat):
    store.append_display_messages(chat.pk, [user("a")])
    store.persist_context(chat.pk, [user("a")], 0)
    rows = ChatEvent.objects.filter(chat=chat).values_list("channel", "seq")
    assert sorted(rows) == [("display", 1), ("session", 1)]


@pytest.mark.django_db
def test_images_are_never_persisted(chat):
    from chat.core.messages import Image

    message = user("look", images=[Image("aGVsbG8=", "image/png")])
    store.persist_context(chat.pk, [message], 0)
    store.append_display_messages(chat.pk, [message])
    for payload in ChatEvent.objects.filter(chat=chat).values_list("payload", flat=True):
        assert "images" not in payload
        assert "aGVsbG8=" not in str(payload)


@pytest.mark.django_db
def test_deleting_the_chat_deletes_its_events(chat):
    store.append_display_messages(chat.pk, [user("a")])
    chat.delete()
    assert ChatEvent.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_writers_get_gap_free_seqs(chat):
    """Two threads (two connections) append display events at the same time."""
    writers, per_writer, batch = 2, 15, 2
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(name: str) -> None:
        try:
            start.wait()
            for i in range(per_writer):
                store.append_display_messages(
                    chat.pk, [user(f"{name}-{i}-{j}") for j in range(batch)]
                )
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(f"w{n}",)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    events = store.display_events_after(chat.pk, 0)
    total = writers * per_writer * batch
    assert [e.seq for e in events] == list(range(1, total + 1))
    # Each writer's batches stay contiguous: a batch is one transaction.
    contents = [e.payload["content"] for e in events]
    for k in range(0, total, batch):
        names = {c.rsplit("-", 1)[0] for c in contents[k : k + batch]}
        assert len(names) == 1, contents[k : k + batch]


def test_database_vendor_matches_the_environment():
    import os

    expected = "postgresql" if os.environ.get("DATABASE_URL") else "sqlite"
    assert connection.vendor == expected
