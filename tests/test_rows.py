"""Written-out statements (chat/rows.py) give what the ORM gives, on SQLite and PostgreSQL.

The hottest statements of a send and a run's claim are written out; what they return
must be indistinguishable from the ORM's: the same field values with the same types
(UUIDs, aware datetimes, booleans, JSON), related objects cached as ``select_related``
caches them, ids and saved state set as ``create`` and ``bulk_create`` set them.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.http import Http404
from django.test.utils import CaptureQueriesContext

from chat import rows, store
from chat.access import ChatAction, access_chat
from chat.models import Agent, ChatEvent, ChatSession, ChatToolGrant, QueuedInput, RelayLimit, Run
from chat.relay import limits
from chat.runhost import executor, transitions
from chat.runhost.host import take_queued_inputs

pytestmark = [pytest.mark.persistence, pytest.mark.django_db]


def field_values(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def typed(values: dict) -> dict:
    return {name: (type(value), value) for name, value in values.items()}


@pytest.fixture
def chat(alice, agent):
    chat = store.create_chat(alice, title="rows", model="")
    ChatSession.objects.filter(pk=chat.pk).update(agent=agent, pinned_at=chat.created_at)
    return ChatSession.objects.get(pk=chat.pk)


def test_access_chat_reads_what_the_orm_reads_with_its_owner(alice, chat):
    expected = ChatSession.objects.select_related("owner").get(pk=chat.pk)
    got = access_chat(alice, str(chat.pk), ChatAction.WRITE)
    assert typed(field_values(got)) == typed(field_values(expected))
    assert got._state.adding is False and got._state.db == expected._state.db
    with CaptureQueriesContext(connection) as queries:
        owner = got.owner  # cached, as select_related caches it
    assert len(queries) == 0
    assert typed(field_values(owner)) == typed(field_values(expected.owner))


def test_access_chat_answers_404_for_another_user_a_missing_chat_and_a_bad_id(bob, chat):
    for user, chat_id in ((bob, chat.pk), (chat.owner, uuid.uuid4()), (chat.owner, "nonsense")):
        with pytest.raises(Http404):
            access_chat(user, chat_id, ChatAction.VIEW)


def test_the_claim_reads_the_run_chat_and_agent_as_the_orm_does(chat):
    run = transitions.new_run(chat)
    ChatToolGrant.objects.create(chat=chat, tool_name="calculator")
    claimed = executor._claim(str(run.pk))
    expected = Run.objects.select_related("chat", "chat__agent").get(pk=run.pk)
    assert expected.claimed is True and expected.redispatched == 0
    assert typed(field_values(claimed)) == typed(field_values(expected))
    with CaptureQueriesContext(connection) as queries:
        got_chat, got_agent = claimed.chat, claimed.chat.agent
    assert len(queries) == 0
    assert typed(field_values(got_chat)) == typed(field_values(expected.chat))
    assert isinstance(got_agent, Agent)
    assert typed(field_values(got_agent)) == typed(field_values(expected.chat.agent))
    assert executor._grants(chat.pk) == {"calculator"}
    assert executor._claim(str(run.pk)) is None  # claimed once only


def test_the_claim_of_a_chat_without_an_agent_caches_none(alice):
    chat = store.create_chat(alice, title="no agent")
    run = transitions.new_run(chat)
    claimed = executor._claim(str(run.pk))
    with CaptureQueriesContext(connection) as queries:
        assert claimed.chat.agent is None
    assert len(queries) == 0


def test_create_and_update_write_what_the_orm_writes(chat):
    run = transitions.new_run(chat, thinking=False)
    stored = Run.objects.get(pk=run.pk)
    assert run._state.adding is False
    # As after objects.create: the values given (an enum default stays an enum), stored.
    assert field_values(run) == field_values(stored)
    assert stored.thinking is False and stored.speakers == [] and stored.started_at is not None
    entry = rows.create(
        QueuedInput, chat=chat, client_id="c1", content="hi", display_seq=3, images=["v"]
    )
    assert isinstance(entry.pk, int)
    assert field_values(entry) == field_values(QueuedInput.objects.get(pk=entry.pk))
    assert rows.update(Run, run.pk, iteration=4, partial_text="so far") == 1
    stored = Run.objects.get(pk=run.pk)
    assert (stored.iteration, stored.partial_text) == (4, "so far")


def test_taking_inputs_takes_the_waiting_ones_oldest_first(chat):
    run = transitions.new_run(chat)
    other = rows.create(QueuedInput, chat=chat, client_id="x", content="taken", consumed=True)
    for n in (1, 2, 3):
        rows.create(QueuedInput, chat=chat, client_id=f"c{n}", content=f"m{n}", display_seq=n)
    taken = take_queued_inputs(chat.pk, run)
    assert [(t.text, t.display_seq) for t in taken] == [("m1", 1), ("m2", 2), ("m3", 3)]
    assert set(QueuedInput.objects.filter(run=run).values_list("content", flat=True)) == {
        "m1",
        "m2",
        "m3",
    }
    assert not QueuedInput.objects.filter(chat=chat, consumed=False).exists()
    assert QueuedInput.objects.get(pk=other.pk).run_id is None
    assert take_queued_inputs(chat.pk, run) == []


def test_inserted_events_are_saved_with_their_ids(chat):
    written = store.append_to_channels(
        chat.pk,
        {store.DISPLAY: [{"type": "note", "n": n} for n in range(150)], store.SESSION: []},
    )[store.DISPLAY]
    assert len(written) == 150  # more than one statement's batch
    stored = {e.pk: e for e in ChatEvent.objects.filter(chat=chat)}
    assert len(stored) == 150
    for event in written:
        assert event._state.adding is False
        assert field_values(event) == field_values(stored[event.pk])


def test_a_users_limits_are_read_from_their_row(alice):
    assert limits._user_limits(alice.pk) is None
    RelayLimit.objects.create(user=alice, monthly_tokens=77, burst=None)
    row = limits._user_limits(alice.pk)
    assert (row.user_id, row.monthly_tokens, row.burst) == (alice.pk, 77, None)


def test_a_runs_end_writes_what_the_orm_wrote(chat):
    """The run's end (its update, its usage record, the inputs and approvals it closes)."""
    from datetime import timedelta

    from django.utils import timezone

    from chat.agent import events as ev
    from chat.llm.types import Usage
    from chat.models import ToolApproval, UsageRecord
    from chat.runhost import setup
    from chat.runhost.host import DjangoRunHost

    run = transitions.new_run(chat)
    left = rows.create(QueuedInput, chat=chat, client_id="c1", content="late", run=run)
    expires = timezone.now() + timedelta(minutes=5)
    for call, status in (("k1", "pending"), ("k2", "approved")):
        ToolApproval.objects.create(
            chat=chat, run=run, call_id=call, tool_name="shell", arguments="{}",
            status=status, expires_at=expires,
        )  # fmt: skip
    kinds = []
    setup.register_run_finished("test-rows", lambda r, status: kinds.append(status))
    ChatSession.objects.filter(pk=chat.pk).update(kind="test-rows")
    host = DjangoRunHost(run, [])
    end = ev.Error(category="provider_error", message="gone", partial_text="so")
    try:
        assert transitions.finish_run(host, Run.Status.FAILED, end, [], Usage(30, 12, True))
        # Only a live run ends: a second end changes nothing.
        assert not transitions.finish_run(host, Run.Status.COMPLETED, end, [], Usage(1, 1))
    finally:
        setup._finished.pop("test-rows")
    assert kinds == [Run.Status.FAILED]
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.input_tokens, stored.output_tokens) == ("failed", 30, 12)
    assert (stored.usage_estimated, stored.error_category, stored.error_message) == (
        True,
        "provider_error",
        "gone",
    )
    assert stored.partial_text == "so" and stored.finished_at is not None
    assert QueuedInput.objects.get(pk=left.pk).consumed is True
    assert dict(ToolApproval.objects.values_list("call_id", "status")) == {
        "k1": "denied",
        "k2": "approved",
    }
    decided = store.run_events(chat.pk, str(run.pk), {"approval_decided"})
    assert [(e.payload["call_id"], e.payload["name"]) for e in decided] == [("k1", "shell")]
    record = UsageRecord.objects.get(run_id=run.pk)
    assert isinstance(record.pk, int) and record.created_at is not None
    assert (record.user_id, record.source, record.model, record.status) == (
        chat.owner_id,
        "chat",
        run.model,
        "failed",
    )
    assert (record.prompt_tokens, record.completion_tokens, record.estimated) == (30, 12, True)
    assert (record.stream, record.provider, record.http_status) == (True, "", None)
    assert not transitions.start_run_if_idle(chat)
    rows.create(QueuedInput, chat=chat, client_id="c2", content="next")
    assert transitions.start_run_if_idle(chat) is not None


def test_quoted_names_are_kept_per_vendor_and_match_quoting_them(monkeypatch):
    """Column lists and names are built once per database vendor: the same text as quoting
    them at each call, and another vendor's quoting is not reused."""
    quote = connection.ops.quote_name
    expected = ", ".join(f"{quote('r')}.{quote(f.column)}" for f in Run._meta.concrete_fields)
    assert rows.select_list(Run, "r") == expected
    assert rows.select_list(Run, "r") == expected  # kept
    assert rows.select_list(Run, "r", ["chat_id", "status"]) == (
        f"{quote('r')}.{quote('chat_id')}, {quote('r')}.{quote('status')}"
    )
    assert rows.column(Run, "chat") == quote("chat_id") == rows.column(Run, "chat_id")
    assert rows.table(Run) == quote(Run._meta.db_table)
    monkeypatch.setattr(connection, "vendor", "other")
    monkeypatch.setattr(connection.ops, "quote_name", lambda name: f"`{name}`")
    assert rows.column(Run, "chat") == "`chat_id`"
    assert rows.table(Run) == f"`{Run._meta.db_table}`"
    assert rows.select_list(Run, "r", ["status"]) == "`r`.`status`"
