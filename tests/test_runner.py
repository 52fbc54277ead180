"""The in-process runner end to end: a real database, the demo model and the fake OpenAI server.

Runs start the way the views start them (``actions.send_message``, which launches its run)
and every test checks what the database says afterwards: the Run row, the display
events (exactly one terminal event per run, gap-free seqs), the persisted context
(never a tool call without its results) and that nothing is left running.

The helpers here are shared with ``tests/test_runner_faults.py``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connections, transaction
from django.http import Http404
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from chat import actions, catalog, store
from chat.agent.events import TERMINAL_TYPES
from chat.core import eventlog
from chat.models import (
    Artifact,
    ChatEvent,
    ChatSession,
    ChatToolGrant,
    Provider,
    ProviderModel,
    QueuedInput,
    Run,
    ToolApproval,
)
from chat.runhost import executor, transitions, worker
from chat.runhost import host as run_host
from chat.runhost.workspace import ArtifactWorkspace
from tests.fakeopenai import FakeOpenAI, FakeToolCall, Script

pytestmark = [pytest.mark.django_db(transaction=True)]

WAIT = 15.0  # upper bound on any single wait; runs here take well under a second
API_KEY = "sk-test-secret-0123456789abcdef"
TERMINAL_FOR_STATUS = {
    Run.Status.COMPLETED: ("complete", None),
    Run.Status.CANCELLED: ("cancelled", None),
    Run.Status.FAILED: ("error", "failed"),
    Run.Status.INTERRUPTED: ("error", "interrupted"),
}


def adb(fn):
    return database_sync_to_async(fn)


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def runtime(settings, tmp_path):
    """In-process runner, small retry/backoff, a private workspace root."""
    settings.LYCEUM_RUNNER = "inprocess"
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_MAX_RETRIES = 1
    settings.LYCEUM_RETRY_BACKOFF = 0.01
    settings.LYCEUM_FIRST_BYTE_TIMEOUT = 5.0
    settings.LYCEUM_IDLE_TIMEOUT = 5.0
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.05
    settings.LYCEUM_RUN_GUARD_SECONDS = 60.0
    settings.LYCEUM_APPROVAL_TIMEOUT = 900.0
    return settings


@pytest.fixture
async def runner_state(transactional_db):
    """The test starts and ends with no run task and no sweeper (they are module state)."""
    assert not executor._tasks
    yield
    await executor.stop_all()


@pytest.fixture(autouse=True)
def clean_runner(runner_state):
    """Every test of this module (the helpers' other users request ``runner_state``)."""


@pytest.fixture
def fake_model(fake_openai: FakeOpenAI, transactional_db) -> FakeOpenAI:
    """The fake server as an admin-configured provider: alias ``fake-model`` → ``gpt-fake``."""
    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=fake_openai.base_url, api_key=API_KEY
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
    )
    return fake_openai


# --- helpers (also used by test_runner_faults.py) ----------------------------------------------


async def new_chat(user, model: str = "demo-fast") -> ChatSession:
    return await adb(actions.new_chat)(user, model=model)


async def send(user, chat: ChatSession, text: str) -> actions.SendResult:
    """Send like the views do: the action stores the message and launches its run."""
    sent = await adb(actions.send_message)(user, chat.pk, text, uuid.uuid4().hex)
    return sent


async def settle(timeout: float = WAIT) -> None:
    """Wait until no run task is left (runs started by ``_start_next`` included)."""
    async with asyncio.timeout(timeout):
        while executor._tasks:
            await asyncio.gather(*list(executor._tasks.values()), return_exceptions=True)
            await asyncio.sleep(0)


async def until(check, timeout: float = WAIT, every: float = 0.01) -> Any:
    """Poll a sync (database) check until it returns something truthy."""
    async with asyncio.timeout(timeout):
        while True:
            value = await adb(check)()
            if value:
                return value
            await asyncio.sleep(every)


def run_row(run_id) -> Run:
    return Run.objects.get(pk=run_id)


def display(chat) -> list[store.StoredEvent]:
    return store.display_events_after(chat.pk, 0)


def events_of(events: list[store.StoredEvent], run_id, kind: str | None = None) -> list[dict]:
    """Payloads stamped with ``run_id`` (typed events and the run's messages)."""
    out = []
    for event in events:
        payload = event.payload
        owner = payload.get("run_id") or (payload.get("extra") or {}).get("run_id")
        if str(owner) == str(run_id) and (kind is None or event.kind == kind):
            out.append(payload)
    return out


def terminal_of(events: list[store.StoredEvent], run_id) -> dict:
    """The run's one terminal event (asserting there is exactly one)."""
    terminals = [p for p in events_of(events, run_id) if p["type"] in TERMINAL_TYPES]
    assert len(terminals) == 1, [p["type"] for p in terminals]
    return terminals[0]


def partial_messages(events: list[store.StoredEvent]) -> list[dict]:
    return [
        e.payload for e in events if e.kind == "msg" and (e.payload.get("extra") or {}).get("ended")
    ]


def session_messages(chat) -> list[dict]:
    return list(
        ChatEvent.objects.filter(chat_id=chat.pk, channel=ChatEvent.Channel.SESSION)
        .order_by("seq")
        .values_list("payload", flat=True)
    )


def check_chat(chat) -> list[Run]:
    """The invariants every chat keeps, whatever happened to its runs. Returns its runs."""
    events = display(chat)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    chat_runs = list(Run.objects.filter(chat_id=chat.pk).order_by("started_at"))
    for run in chat_runs:
        assert run.status in Run.TERMINAL, (run.pk, run.status)
        assert run.finished_at is not None
        terminal = terminal_of(events, run.pk)
        kind, status = TERMINAL_FOR_STATUS[run.status]
        assert terminal["type"] == kind
        if status is not None:
            assert terminal["status"] == status
        # The terminal event is the run's last word.
        assert events_of(events, run.pk)[-1] is terminal
    # Context: replaying the session log needs no repair (no call without its results).
    payloads = session_messages(chat)
    assert not [p for p in payloads if p["type"] != "msg"]
    assert not eventlog.load(payloads).repaired
    return chat_runs


def assert_nothing_live() -> None:
    assert not executor._tasks
    assert not Run.objects.filter(status__in=transitions.LIVE).exists()


def pending_approvals(chat) -> list[ToolApproval]:
    return list(
        ToolApproval.objects.filter(chat_id=chat.pk, status=ToolApproval.Status.PENDING).order_by(
            "pk"
        )
    )


class _WorkspaceFile:
    """A file of the chat's workspace, which is its artifacts (read from another thread:
    the tests calling ``exists()`` run on the event loop)."""

    def __init__(self, chat_id, name: str) -> None:
        self.chat_id, self.name = chat_id, name

    def exists(self) -> bool:
        query = Artifact.objects.filter(chat_id=self.chat_id, path=self.name).exists
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(query).result()

    def read_text(self) -> str:
        workspace = ArtifactWorkspace(self.chat_id)
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(workspace.read, self.name).result()


def workspace_file(settings, chat, name: str) -> _WorkspaceFile:
    return _WorkspaceFile(chat.pk, name)


# --- a run's record --------------------------------------------------------------------------------


async def test_a_completed_run_has_its_record_and_one_complete_event(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(Script(text="Hello there, Alice.", reasoning="Say hello."))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hi")
    assert sent.run_id and not sent.queued
    await settle()

    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.COMPLETED
    assert run.model == "fake-model"
    assert run.started_at <= run.finished_at
    assert (run.input_tokens, run.usage_estimated) == (11, False)  # the fake's prompt_tokens
    assert run.output_tokens > 0
    assert (run.error_category, run.error_message, run.partial_text) == ("", "", "")
    events = await adb(display)(chat)
    complete = terminal_of(events, run.pk)
    assert complete["text"] == "Hello there, Alice."
    assert (complete["input_tokens"], complete["output_tokens"]) == (11, run.output_tokens)
    replies = [p for p in events_of(events, run.pk, "msg") if p["role"] == "assistant"]
    assert [(p["content"], p["reasoning_content"]) for p in replies] == [
        ("Hello there, Alice.", "Say hello.")
    ]
    assert [m.content for m in await adb(store.load_context)(chat.pk)] == [
        "hi",
        "Hello there, Alice.",
    ]
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_the_partial_reply_is_checkpointed_while_streaming(alice, agent, runtime, fake_model):
    tokens = [f"word{i} " for i in range(30)]
    fake_model.enqueue(Script(tokens=tokens, token_delay=0.03))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "stream slowly")
    seen: list[str] = []

    def checkpoint() -> bool:
        run = run_row(sent.run_id)
        if run.status == Run.Status.RUNNING and run.partial_text:
            assert run.checkpoint_at is not None
            if not seen or seen[-1] != run.partial_text:
                seen.append(run.partial_text)
        return run.status != Run.Status.RUNNING

    await until(checkpoint)
    await settle()
    # Several growing checkpoints of the same reply were written before it completed.
    assert len(seen) >= 2
    assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:], strict=False))
    assert "".join(tokens).startswith(seen[-1])
    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.COMPLETED and run.partial_text == ""
    await adb(check_chat)(chat)


@pytest.mark.persistence
async def test_a_cancel_whose_doorbell_was_lost_still_stops_the_run(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(Script(tokens=[f"tok{i} " for i in range(400)], token_delay=0.02))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "a long one please")
    await until(lambda: run_row(sent.run_id).partial_text)

    # The flag alone, as when the run.cancel message never reached this process.
    await adb(Run.objects.filter(pk=sent.run_id).update)(cancel_requested=True)
    await settle(timeout=3.0)

    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.CANCELLED
    assert terminal_of(await adb(display)(chat), run.pk)["partial_text"] == run.partial_text
    await adb(check_chat)(chat)


@pytest.mark.persistence
def test_the_bookkeeping_of_many_runs_is_one_transaction_of_three_statements(alice, agent):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.runhost.keeper import Checkpoint, keep_runs

    chats = [actions.new_chat(alice) for _ in range(30)]
    running = [_running_run(chat, partial="", heartbeat_age=600) for chat in chats[:28]]
    waiting = _running_run(chats[28], partial="Kept", heartbeat_age=600)
    Run.objects.filter(pk=waiting.pk).update(status=Run.Status.WAITING)
    cancelled = _running_run(chats[29], partial="", heartbeat_age=600)
    Run.objects.filter(pk=cancelled.pk).update(cancel_requested=True)
    everyone = [*running, waiting, cancelled]
    checkpoints = [
        Checkpoint(str(run.pk), f"Reply {i}", f"Thought {i}") for i, run in enumerate(everyone)
    ]

    with CaptureQueriesContext(connection) as queries:
        asked_to_cancel = keep_runs([str(run.pk) for run in everyone], checkpoints)

    assert asked_to_cancel == {str(cancelled.pk)}
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")
    statements = [q["sql"] for q in queries if not q["sql"].startswith(control)]
    assert len(statements) == 3, statements  # checkpoints (one executemany), beats, cancels
    for i, run in enumerate(running):
        run.refresh_from_db()
        assert (run.partial_text, run.partial_reasoning) == (f"Reply {i}", f"Thought {i}")
        assert timezone.now() - run.heartbeat_at < timedelta(seconds=5)
        assert run.checkpoint_at is not None
    # A run that stopped running (waiting for approval here) is neither refilled nor beaten.
    waiting.refresh_from_db()
    assert waiting.partial_text == "Kept"
    assert timezone.now() - waiting.heartbeat_at > timedelta(seconds=500)


def test_the_default_checkpoint_interval_is_at_most_a_second():
    from django.conf import settings

    assert settings.LYCEUM_CHECKPOINT_INTERVAL <= 1.0


# --- cancel ---------------------------------------------------------------------------------------


@pytest.mark.persistence
async def test_cancel_closes_the_upstream_request_and_keeps_the_partial_text(
    alice, bob, agent, runtime, fake_model
):
    tokens = [f"tok{i} " for i in range(400)]
    fake_model.enqueue(Script(tokens=tokens, token_delay=0.02))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "a long one please")
    await until(lambda: run_row(sent.run_id).partial_text)

    with pytest.raises(Http404):  # another user's chat looks like no chat at all
        await adb(actions.cancel_run)(bob, chat.pk)
    assert await adb(actions.cancel_run)(alice, chat.pk) == sent.run_id
    # The upstream HTTP request is closed within a second of the cancel.
    assert await fake_model.wait_for_disconnect_async(1, timeout=1.0)
    assert await adb(actions.cancel_run)(alice, chat.pk) in (sent.run_id, None)  # idempotent
    await settle()
    assert await adb(actions.cancel_run)(alice, chat.pk) is None  # idle: nothing to cancel

    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.CANCELLED
    assert run.partial_text and "".join(tokens).startswith(run.partial_text)
    events = await adb(display)(chat)
    cancelled = terminal_of(events, run.pk)
    assert cancelled["partial_text"] == run.partial_text
    (partial,) = partial_messages(events)
    assert partial["content"] == run.partial_text
    assert partial["extra"]["ended"] == "cancelled"
    context = await adb(store.load_context)(chat.pk)
    assert context[-1].content == run.partial_text
    assert context[-1].extra.get("ended") == "cancelled"
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_the_hang_guard_ends_a_run_that_does_not_complete(alice, agent, runtime, fake_model):
    runtime.LYCEUM_RUN_GUARD_SECONDS = 1.0
    runtime.LYCEUM_IDLE_TIMEOUT = 30.0
    fake_model.enqueue(
        Script(tokens=["Still ", "thinking ", "about ", "it"], fault_after=2, stall=30)
    )
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hang please")
    await settle()

    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "timed_out")
    assert run.partial_text == "Still thinking "
    events = await adb(display)(chat)
    error = terminal_of(events, run.pk)
    assert (error["category"], error["partial_text"]) == ("timed_out", "Still thinking ")
    assert [p["content"] for p in partial_messages(events)] == ["Still thinking "]
    assert await fake_model.wait_for_disconnect_async(1, timeout=1.0)
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


# --- recovery after a restart ---------------------------------------------------------------------


def _running_run(chat, *, partial: str, heartbeat_age: float | None) -> Run:
    run = Run.objects.create(chat=chat, model="demo-fast")
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        partial_text=partial,
        checkpoint_at=now,
        heartbeat_at=None if heartbeat_age is None else now - timedelta(seconds=heartbeat_age),
        started_at=now - timedelta(minutes=5),
    )
    return run


@pytest.mark.persistence
def test_start_up_recovery_interrupts_every_running_run_with_its_checkpoint(alice, agent):
    chat = actions.new_chat(alice, model="demo-fast")
    actions.send_message(alice, chat.pk, "hello", "c1")  # creates the live run
    run = Run.objects.get(chat=chat)
    Run.objects.filter(pk=run.pk).update(
        partial_text="Half a rep", partial_reasoning="Thinking", heartbeat_at=timezone.now()
    )

    assert transitions.recover_stale_runs(everything=True) == [str(run.pk)]
    assert transitions.recover_stale_runs(everything=True) == []  # once only

    run.refresh_from_db()
    assert (run.status, run.partial_text) == (Run.Status.INTERRUPTED, "Half a rep")
    events = display(chat)
    error = terminal_of(events, run.pk)
    assert (error["category"], error["status"], error["partial_text"]) == (
        "interrupted",
        "interrupted",
        "Half a rep",
    )
    (partial,) = partial_messages(events)
    assert (partial["content"], partial["reasoning_content"]) == ("Half a rep", "Thinking")
    assert partial["extra"]["ended"] == "interrupted"
    assert [m.content for m in store.load_context(chat.pk)][-1] == "Half a rep"
    check_chat(chat)


@pytest.mark.persistence
def test_only_runs_with_a_stale_heartbeat_are_recovered_while_running(alice, agent):
    stale_chat = actions.new_chat(alice, model="demo-fast")
    silent_chat = actions.new_chat(alice, model="demo-fast")
    alive_chat = actions.new_chat(alice, model="demo-fast")
    stale = _running_run(stale_chat, partial="Old text", heartbeat_age=600)
    silent = _running_run(silent_chat, partial="", heartbeat_age=None)  # never beat, old
    alive = _running_run(alive_chat, partial="Fresh text", heartbeat_age=0.5)

    assert sorted(transitions.recover_stale_runs()) == sorted([str(stale.pk), str(silent.pk)])
    assert Run.objects.get(pk=alive.pk).status == Run.Status.RUNNING
    assert Run.objects.get(pk=stale.pk).status == Run.Status.INTERRUPTED
    assert Run.objects.get(pk=silent.pk).status == Run.Status.INTERRUPTED
    assert [p["content"] for p in partial_messages(display(stale_chat))] == ["Old text"]
    assert partial_messages(display(silent_chat)) == []  # nothing was written: no message
    check_chat(stale_chat)
    check_chat(silent_chat)


@pytest.mark.persistence
async def test_a_run_whose_process_died_is_interrupted_with_its_last_checkpoint(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(Script(tokens=[f"t{i} " for i in range(300)], token_delay=0.02))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "go on")
    await until(lambda: len(run_row(sent.run_id).partial_text) > 10)
    # The process goes away: its task dies without writing a terminal state.
    task = executor.local_task(sent.run_id)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.RUNNING
    checkpoint = run.partial_text

    assert await adb(transitions.recover_stale_runs)(everything=True) == [sent.run_id]
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.partial_text) == (Run.Status.INTERRUPTED, checkpoint)
    events = await adb(display)(chat)
    assert terminal_of(events, run.pk)["partial_text"] == checkpoint
    assert [p["content"] for p in partial_messages(events)] == [checkpoint]
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


# --- one run per chat: queued messages ------------------------------------------------------------


async def test_a_message_sent_while_busy_is_queued_then_drained_into_the_run(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(
        Script(tokens=[f"a{i} " for i in range(60)], token_delay=0.02),
        Script(text="Second answer."),
    )
    chat = await new_chat(alice, "fake-model")
    first = await send(alice, chat, "first question")
    await until(lambda: run_row(first.run_id).partial_text)
    second = await send(alice, chat, "second question")
    assert second.queued and second.run_id is None
    events = await adb(display)(chat)
    shown = next(e for e in events if e.seq == second.display_seq)
    assert shown.payload["content"] == "second question"
    assert shown.payload["extra"]["queued"] is True
    await settle()

    assert await adb(Run.objects.filter(chat=chat).count)() == 1
    run = await adb(run_row)(first.run_id)
    assert run.status == Run.Status.COMPLETED
    events = await adb(display)(chat)
    taken = [p["input_seq"] for p in events_of(events, run.pk, "input_taken")]
    assert taken == [first.display_seq, second.display_seq]
    # The second request carried the queued message, marked as appended mid-run.
    last_user = [m for m in fake_model.chat_requests()[1].json["messages"] if m["role"] == "user"]
    assert last_user[-1]["content"].endswith("second question")
    assert terminal_of(events, run.pk)["text"] == "Second answer."
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_a_message_left_queued_starts_the_next_run_when_the_current_one_ends(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(
        Script(tokens=[f"b{i} " for i in range(300)], token_delay=0.02),
        Script(text="Answer to the queued one."),
    )
    chat = await new_chat(alice, "fake-model")
    first = await send(alice, chat, "first")
    await until(lambda: run_row(first.run_id).partial_text)
    second = await send(alice, chat, "queued while busy")
    assert second.queued
    await adb(actions.cancel_run)(alice, chat.pk)
    await settle()

    chat_runs = await adb(check_chat)(chat)
    assert [r.status for r in chat_runs] == [Run.Status.CANCELLED, Run.Status.COMPLETED]
    events = await adb(display)(chat)
    next_run = chat_runs[1]
    assert [p["input_seq"] for p in events_of(events, next_run.pk, "input_taken")] == [
        second.display_seq
    ]
    assert terminal_of(events, next_run.pk)["text"] == "Answer to the queued one."
    await adb(assert_nothing_live)()


# --- approvals -------------------------------------------------------------------------------------


async def _wait_for_approval(alice, chat, text: str) -> tuple[str, ToolApproval]:
    sent = await send(alice, chat, text)
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.WAITING
    assert run.pending_message is not None
    (approval,) = await adb(pending_approvals)(chat)
    events = await adb(display)(chat)
    (required,) = events_of(events, run.pk, "approval_required")
    assert (required["call_id"], required["name"]) == (approval.call_id, "write_file")
    return sent.run_id, approval


@pytest.mark.persistence
async def test_deny_with_a_reason_survives_a_restart_and_the_model_sees_the_reason(
    alice, bob, agent, runtime
):
    chat = await new_chat(alice)
    run_id, approval = await _wait_for_approval(alice, chat, "write file notes.md")
    notes = workspace_file(runtime, chat, "notes.md")
    assert not notes.exists()  # never executed without an answer

    # "Restart": nothing is in memory, start-up recovery leaves a waiting run alone.
    assert not executor._tasks
    assert await adb(transitions.recover_stale_runs)(everything=True) == []
    assert (await adb(run_row)(run_id)).status == Run.Status.WAITING

    with pytest.raises(Http404):
        await adb(actions.decide_approval)(bob, chat.pk, approval.call_id, approve=True)
    with pytest.raises(actions.ActionError) as wrong_call:
        await adb(actions.decide_approval)(alice, chat.pk, "call_other", approve=True)
    assert wrong_call.value.code == "not_found"
    decided = await adb(actions.decide_approval)(
        alice, chat.pk, approval.call_id, approve=False, reason="keep the folder clean"
    )
    assert decided == actions.DecideResult(run_id, "denied")
    await settle()
    # Deciding again changes nothing and resumes nothing.
    again = await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    assert again == actions.DecideResult(None, "denied")

    assert not notes.exists()
    run = await adb(run_row)(run_id)
    assert run.status == Run.Status.COMPLETED
    events = await adb(display)(chat)
    (tool_end,) = events_of(events, run_id, "tool_end")
    assert tool_end["status"] == "denied"
    assert "keep the folder clean" in tool_end["output"]
    assert "keep the folder clean" in terminal_of(events, run_id)["text"]
    (decided_event,) = events_of(events, run_id, "approval_decided")
    assert (decided_event["decision"], decided_event["reason"]) == (
        "denied",
        "keep the folder clean",
    )
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_approve_once_then_allow_for_the_rest_of_the_chat(alice, agent, runtime):
    chat = await new_chat(alice)
    run_id, approval = await _wait_for_approval(alice, chat, "write file notes.md")
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    await settle()
    assert workspace_file(runtime, chat, "notes.md").exists()
    assert (await adb(run_row)(run_id)).status == Run.Status.COMPLETED

    # Approved once only: the next write asks again; this time "always".
    run_id, approval = await _wait_for_approval(alice, chat, "write file plan.md")
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True, always=True)
    await settle()
    assert workspace_file(runtime, chat, "plan.md").exists()
    assert await adb(ChatToolGrant.objects.filter(chat=chat, tool_name="write_file").exists)()

    # Now write_file runs without asking, in this chat only.
    third = await send(alice, chat, "write file todo.md")
    await settle()
    assert (await adb(run_row)(third.run_id)).status == Run.Status.COMPLETED
    events = await adb(display)(chat)
    assert events_of(events, third.run_id, "approval_required") == []
    assert [p["status"] for p in events_of(events, third.run_id, "tool_end")] == ["done"]
    assert workspace_file(runtime, chat, "todo.md").exists()
    other_chat = await new_chat(alice)
    await _wait_for_approval(alice, other_chat, "write file todo.md")
    await adb(actions.cancel_run)(alice, other_chat.pk)
    await adb(check_chat)(chat)
    await adb(check_chat)(other_chat)
    await adb(assert_nothing_live)()


async def test_an_unanswered_approval_expires_and_counts_as_denied(alice, agent, runtime):
    runtime.LYCEUM_APPROVAL_TIMEOUT = 0.2
    chat = await new_chat(alice)
    run_id, approval = await _wait_for_approval(alice, chat, "write file notes.md")
    await until(lambda: timezone.now() > ToolApproval.objects.get(pk=approval.pk).expires_at)
    await executor.sweep_once()
    await settle()

    approval = await adb(ToolApproval.objects.get)(pk=approval.pk)
    assert approval.status == ToolApproval.Status.EXPIRED
    assert not workspace_file(runtime, chat, "notes.md").exists()
    run = await adb(run_row)(run_id)
    assert run.status == Run.Status.COMPLETED
    events = await adb(display)(chat)
    (decided,) = events_of(events, run_id, "approval_decided")
    assert decided["decision"] == "expired"
    (tool_end,) = events_of(events, run_id, "tool_end")
    assert tool_end["status"] == "denied" and "expired" in tool_end["output"]
    assert "expired" in terminal_of(events, run_id)["text"]
    # A late answer is idempotent.
    late = await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    assert late == actions.DecideResult(None, "expired")
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_cancelling_a_waiting_run_ends_it_and_its_approvals(alice, agent, runtime):
    chat = await new_chat(alice)
    run_id, approval = await _wait_for_approval(alice, chat, "write file notes.md")
    assert await adb(actions.cancel_run)(alice, chat.pk) == run_id
    assert await adb(actions.cancel_run)(alice, chat.pk) is None
    late = await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    assert late == actions.DecideResult(None, "denied")
    await settle()
    assert (await adb(run_row)(run_id)).status == Run.Status.CANCELLED
    assert not workspace_file(runtime, chat, "notes.md").exists()
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()
    # The log says the approval was closed, so a reloaded page shows no Approve or Deny.
    events = await adb(display)(chat)
    decided = events_of(events, run_id, "approval_decided")
    assert [(d["call_id"], d["decision"]) for d in decided] == [(approval.call_id, "denied")]
    html = await adb(page_html)(chat, events)
    assert "Approve" not in html and "Deny" not in html
    assert "Denied" in html


def page_html(chat, events) -> str:
    from chat.presentation import display as presentation

    return presentation.render_items(chat.pk, presentation.build_items(events))


@pytest.mark.parametrize(
    ("status", "call_status"),
    [
        (Run.Status.CANCELLED, "cancelled"),
        (Run.Status.FAILED, "failed"),
        (Run.Status.INTERRUPTED, "failed"),
    ],
)
async def test_a_tool_call_open_when_the_run_ends_is_ended_with_it(
    alice, agent, runtime, status, call_status
):
    """A run that stops while a tool runs leaves no card "running" forever."""
    from chat.agent import events as ev
    from chat.llm.types import Usage

    chat = await new_chat(alice)

    def run_with_open_call() -> Run:
        run = Run.objects.create(chat=chat, model="demo-fast", claimed=True)
        with transaction.atomic():
            store.append_display(
                chat.pk,
                [
                    run_host.stamp(ev.ToolStart(call_id="c1", name="calculator", input={}), run),
                    run_host.stamp(ev.ToolStart(call_id="c2", name="calculator", input={}), run),
                    run_host.stamp(
                        ev.ToolEnd(call_id="c2", name="calculator", output="4", status="done"),
                        run,
                    ),
                ],
            )
        return run

    run = await adb(run_with_open_call)()
    host = run_host.DjangoRunHost(run, [])
    end = (
        ev.Cancelled(partial_text="")
        if status == Run.Status.CANCELLED
        else ev.Error(category="provider_error", message="gone")
    )
    assert await adb(transitions.finish_run)(host, status, end, [], Usage())
    events = await adb(display)(chat)
    ends = events_of(events, run.pk, "tool_end")
    assert [(e["call_id"], e["status"]) for e in ends] == [("c2", "done"), ("c1", call_status)]
    html = await adb(page_html)(chat, events)
    assert "running" not in html


async def test_each_approval_is_bound_to_its_own_call(alice, agent, runtime, fake_model):
    provider = await adb(Provider.objects.get)(name="fake")
    await adb(ProviderModel.objects.create)(
        provider=provider, alias="fake-other", model_id="gpt-other", context_window=8000
    )
    fake_model.enqueue(
        Script(
            text="Writing two files.",
            tool_calls=[
                FakeToolCall("write_file", '{"path": "a.md", "content": "A"}', id="call_a"),
                FakeToolCall("write_file", '{"path": "b.md", "content": "B"}', id="call_b"),
            ],
            interleave_tool_calls=True,
        ),
        Script(text="Wrote a.md; b.md was refused."),
    )
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "write two files")
    await settle()
    assert (await adb(run_row)(sent.run_id)).status == Run.Status.WAITING
    assert [a.call_id for a in await adb(pending_approvals)(chat)] == ["call_a", "call_b"]

    first = await adb(actions.decide_approval)(alice, chat.pk, "call_b", approve=False, reason="no")
    assert first == actions.DecideResult(None, "denied")  # call_a still waits: no resume yet
    assert (await adb(run_row)(sent.run_id)).status == Run.Status.WAITING
    # A model switched while waiting applies to the resumed leg's next request.
    await adb(actions.switch_model)(alice, chat.pk, "fake-other")
    second = await adb(actions.decide_approval)(alice, chat.pk, "call_a", approve=True)
    assert second == actions.DecideResult(sent.run_id, "approved")
    await settle()

    assert workspace_file(runtime, chat, "a.md").read_text() == "A"
    assert not workspace_file(runtime, chat, "b.md").exists()
    events = await adb(display)(chat)
    assert [(p["call_id"], p["status"]) for p in events_of(events, sent.run_id, "tool_end")] == [
        ("call_a", "done"),
        ("call_b", "denied"),
    ]
    assert [r.json["model"] for r in fake_model.chat_requests()] == ["gpt-fake", "gpt-other"]
    tool_messages = [
        m for m in fake_model.chat_requests()[1].json["messages"] if m["role"] == "tool"
    ]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_a", "call_b"]
    assert "Reason: no" in tool_messages[1]["content"]
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_time_spent_waiting_for_an_answer_does_not_count_for_the_hang_guard(
    alice, agent, runtime
):
    runtime.LYCEUM_RUN_GUARD_SECONDS = 1.0
    chat = await new_chat(alice)
    run_id, approval = await _wait_for_approval(alice, chat, "write file notes.md")
    await asyncio.sleep(1.2)
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    await settle()
    assert (await adb(run_row)(run_id)).status == Run.Status.COMPLETED
    assert workspace_file(runtime, chat, "notes.md").exists()


async def test_a_message_queued_behind_a_cancelled_waiting_run_gets_its_own_run(
    alice, agent, runtime
):
    chat = await new_chat(alice)
    run_id, _approval = await _wait_for_approval(alice, chat, "write file notes.md")
    queued = await send(alice, chat, "calculate 2*21")
    assert queued.queued
    await adb(actions.cancel_run)(alice, chat.pk)
    await settle()
    chat_runs = await adb(check_chat)(chat)
    assert [r.status for r in chat_runs] == [Run.Status.CANCELLED, Run.Status.COMPLETED]
    events = await adb(display)(chat)
    assert [p["input_seq"] for p in events_of(events, chat_runs[1].pk, "input_taken")] == [
        queued.display_seq
    ]
    assert "42" in terminal_of(events, chat_runs[1].pk)["text"]
    await adb(assert_nothing_live)()


async def test_the_sweeper_starts_runs_for_messages_nothing_else_would_start(
    alice, agent, runtime, fake_model
):
    waiting_chat = await new_chat(alice)
    await _wait_for_approval(alice, waiting_chat, "write file notes.md")
    queued = await send(alice, waiting_chat, "hello again")
    await adb(actions.cancel_run)(alice, waiting_chat.pk)  # a caller that does not start the next
    # A run that failed before taking its own message must not be retried forever.
    broken_chat = await new_chat(alice, "fake-model")
    await adb(ProviderModel.objects.filter(alias="fake-model").update)(enabled=False)
    failed = await send(alice, broken_chat, "hello?")
    await settle()
    assert (await adb(run_row)(failed.run_id)).status == Run.Status.FAILED

    await executor.sweep_once()
    await settle()
    await executor.sweep_once()
    await settle()
    chat_runs = await adb(check_chat)(waiting_chat)
    assert [r.status for r in chat_runs] == [Run.Status.CANCELLED, Run.Status.COMPLETED]
    events = await adb(display)(waiting_chat)
    assert [p["input_seq"] for p in events_of(events, chat_runs[1].pk, "input_taken")] == [
        queued.display_seq
    ]
    assert [r.pk for r in await adb(check_chat)(broken_chat)] == [uuid.UUID(failed.run_id)]
    await adb(assert_nothing_live)()


@pytest.mark.persistence
async def test_a_cancel_before_the_run_takes_its_message_is_not_answered_by_a_new_run(
    alice, agent, runtime, monkeypatch
):
    original = run_host.DjangoRunHost.take_queued
    reached = asyncio.Event()

    async def take_queued_after_a_pause(host):
        if not reached.is_set():
            reached.set()
            await asyncio.sleep(WAIT)  # the cancel lands here, before anything is taken
        return await original(host)

    monkeypatch.setattr(run_host.DjangoRunHost, "take_queued", take_queued_after_a_pause)
    chat = await new_chat(alice)
    sent = await send(alice, chat, "hello")
    await asyncio.wait_for(reached.wait(), WAIT)
    assert await adb(actions.cancel_run)(alice, chat.pk) == sent.run_id
    await settle()
    chat_runs = await adb(check_chat)(chat)
    assert [r.status for r in chat_runs] == [Run.Status.CANCELLED]
    await adb(assert_nothing_live)()


async def test_a_cancel_that_races_the_approval_request_is_not_lost(alice, agent, runtime):
    chat = await new_chat(alice)
    sent = await send(alice, chat, "write file notes.md")
    await adb(actions.cancel_run)(alice, chat.pk)  # before the run reaches its approval request
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.CANCELLED
    assert await adb(pending_approvals)(chat) == []
    assert not workspace_file(runtime, chat, "notes.md").exists()
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


@pytest.mark.persistence
async def test_a_cancel_delivered_while_the_approval_request_is_stored(
    alice, agent, runtime, monkeypatch
):
    original = run_host.DjangoRunHost._suspend

    def cancel_then_suspend(host, message, pending):
        actions.cancel_run(alice, host.chat_id)  # rings the watcher while this commit runs
        original(host, message, pending)

    monkeypatch.setattr(run_host.DjangoRunHost, "_suspend", cancel_then_suspend)
    chat = await new_chat(alice)
    sent = await send(alice, chat, "write file notes.md")
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert run.status == Run.Status.CANCELLED
    # Nothing is left to answer, and a late answer changes nothing.
    assert await adb(pending_approvals)(chat) == []
    approval = await adb(ToolApproval.objects.get)(run_id=run.pk)
    late = await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    assert late.run_id is None
    await executor.sweep_once()
    await settle()
    assert not workspace_file(runtime, chat, "notes.md").exists()
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_the_hang_guard_is_reported_even_when_leaving_the_group_takes_time(
    alice, agent, runtime, fake_model, monkeypatch
):
    """With Redis, leaving the control group is a network round trip."""
    runtime.LYCEUM_RUN_GUARD_SECONDS = 1.0
    runtime.LYCEUM_IDLE_TIMEOUT = 30.0
    layer = get_channel_layer()
    original = layer.group_discard

    async def slow_group_discard(group: str, channel: str) -> None:
        await asyncio.sleep(0.05)
        await original(group, channel)

    monkeypatch.setattr(layer, "group_discard", slow_group_discard)
    fake_model.enqueue(Script(tokens=["Half ", "way ", "there"], fault_after=2, stall=30))
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hang please")
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "timed_out")
    assert terminal_of(await adb(display)(chat), run.pk)["category"] == "timed_out"


# --- events are published after the commit ---------------------------------------------------------


@pytest.mark.persistence
async def test_every_doorbell_rings_after_its_events_are_committed(
    alice, agent, runtime, monkeypatch
):
    layer = get_channel_layer()
    original = layer.group_send
    rung: list[int] = []
    missing: list[int] = []

    def committed_seq(chat_id) -> int:
        # A new thread has its own database connection: it sees committed rows only.
        try:
            return ChatSession.objects.get(pk=chat_id).last_display_seq
        finally:
            connections.close_all()

    async def checking_group_send(group: str, message: dict) -> None:
        if message.get("type") == "chat.events":
            chat_id = group.removeprefix("chat.")
            seq = message["seq"]
            rung.append(seq)
            if await asyncio.to_thread(committed_seq, chat_id) < seq:
                missing.append(seq)
        await original(group, message)

    monkeypatch.setattr(layer, "group_send", checking_group_send)
    chat = await new_chat(alice)
    await send(alice, chat, "calculate 12*7")
    await settle()
    _run_id, approval = await _wait_for_approval(alice, chat, "write file notes.md")
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    await settle()

    assert rung and not missing
    assert max(rung) == len(await adb(display)(chat))
    await adb(check_chat)(chat)


# --- providers and models -----------------------------------------------------------------------------


async def test_the_provider_sees_the_model_id_never_the_alias(alice, agent, runtime, fake_model):
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hello")
    await settle()
    (request,) = fake_model.chat_requests()
    assert request.json["model"] == "gpt-fake"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.model) == (Run.Status.COMPLETED, "fake-model")
    assert events_of(await adb(display)(chat), run.pk, "run_start")[0]["model"] == "fake-model"


async def test_switching_model_mid_chat_applies_to_the_next_request(
    alice, bob, agent, runtime, fake_model
):
    provider = await adb(Provider.objects.get)(name="fake")
    await adb(ProviderModel.objects.create)(
        provider=provider, alias="fake-other", model_id="gpt-other", context_window=8000
    )
    chat = await new_chat(alice, "fake-model")
    await send(alice, chat, "one")
    await settle()
    assert await adb(actions.switch_model)(alice, chat.pk, "fake-other") == "fake-other"
    sent = await send(alice, chat, "two")
    await settle()
    assert [r.json["model"] for r in fake_model.chat_requests()] == ["gpt-fake", "gpt-other"]
    assert (await adb(run_row)(sent.run_id)).model == "fake-other"
    with pytest.raises(Http404):
        await adb(actions.switch_model)(bob, chat.pk, "fake-model")
    await adb(check_chat)(chat)


def test_disabled_models_and_providers_are_rejected(alice, agent, fake_model):
    provider = Provider.objects.get(name="fake")
    ProviderModel.objects.create(provider=provider, alias="off", model_id="m", enabled=False)
    aliases = {c.alias for c in catalog.available_models()}
    assert "fake-model" in aliases and "off" not in aliases
    chat = actions.new_chat(alice, model="fake-model")
    for alias in ("off", "no-such-model"):
        with pytest.raises(actions.ActionError) as error:
            actions.new_chat(alice, model=alias)
        assert error.value.code == "unknown_model"
        with pytest.raises(actions.ActionError) as error:
            actions.switch_model(alice, chat.pk, alias)
        assert error.value.code == "unknown_model"
    Provider.objects.filter(pk=provider.pk).update(enabled=False)
    with pytest.raises(actions.ActionError) as error:
        actions.new_chat(alice, model="fake-model")
    assert error.value.code == "unknown_model"


async def test_a_chat_whose_model_was_disabled_fails_its_next_run_cleanly(
    alice, agent, runtime, fake_model
):
    chat = await new_chat(alice, "fake-model")
    await adb(ProviderModel.objects.filter(alias="fake-model").update)(enabled=False)
    sent = await send(alice, chat, "hello?")
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "bad_request")
    assert "fake-model" in run.error_message
    assert fake_model.chat_requests() == []
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


def test_environment_bootstrap_lists_the_configured_models(settings, fake_openai, transactional_db):
    catalog._env_models.cache_clear()
    settings.LYCEUM_OPENAI_BASE_URL = fake_openai.base_url
    settings.LYCEUM_OPENAI_API_KEY = "sk-env-key-0123456789"
    settings.LYCEUM_OPENAI_MODELS = ["env-a", "env-b"]
    choices = {c.alias: c for c in catalog.available_models()}
    assert {"env-a", "env-b", "demo", "demo-fast"} <= set(choices)
    assert choices["env-a"].provider_name == catalog.ENV_PROVIDER
    assert fake_openai.requests == []  # a configured list needs no request

    settings.LYCEUM_OPENAI_MODELS = []
    aliases = [c.alias for c in catalog.available_models()]
    assert aliases[:2] == ["fake-model", "fake-reasoner"]  # the server's /models list
    (listing,) = fake_openai.requests
    assert listing.path.endswith("/models")
    assert listing.headers["authorization"] == "Bearer sk-env-key-0123456789"
    catalog._env_models.cache_clear()


async def test_a_run_on_an_environment_model_reaches_the_server(alice, agent, runtime, fake_openai):
    catalog._env_models.cache_clear()
    runtime.LYCEUM_OPENAI_BASE_URL = fake_openai.base_url
    runtime.LYCEUM_OPENAI_API_KEY = "sk-env-key-0123456789"
    runtime.LYCEUM_OPENAI_MODELS = []
    try:
        chat = await new_chat(alice, "fake-reasoner")
        sent = await send(alice, chat, "hello")
        await settle()
    finally:
        catalog._env_models.cache_clear()
    (request,) = fake_openai.chat_requests()
    assert request.json["model"] == "fake-reasoner"
    assert request.headers["authorization"] == "Bearer sk-env-key-0123456789"
    assert (await adb(run_row)(sent.run_id)).status == Run.Status.COMPLETED


async def test_the_api_key_never_reaches_the_run_record_or_the_events(
    alice, agent, runtime, fake_model
):
    echo = {"error": {"message": f"Incorrect API key provided: {API_KEY}", "code": "bad_key"}}
    fake_model.enqueue(
        Script(status=400, error_body=echo),
        Script(
            tokens=["Part ", "one "],
            stream_error={"error": {"message": f"bad {API_KEY}"}},
            fault_after=2,
        ),
    )
    chat = await new_chat(alice, "fake-model")
    first = await send(alice, chat, "one")
    await settle()
    second = await send(alice, chat, "two")
    await settle()
    for run_id in (first.run_id, second.run_id):
        run = await adb(run_row)(run_id)
        assert run.status == Run.Status.FAILED
        assert run.error_message and API_KEY[:8] not in run.error_message
        assert "[redacted]" in run.error_message
    everything = json.dumps([e.payload for e in await adb(display)(chat)])
    assert API_KEY not in everything and API_KEY[-12:] not in everything
    await adb(check_chat)(chat)


# --- random user actions (hypothesis) ----------------------------------------------------------------

TRIGGERS = [
    "hello there",
    "calculate 12*7",
    "write file notes.md",
    "fail",
    "fail midway",
    "give me a long answer",
]
SEND = st.tuples(st.just("send"), st.sampled_from(TRIGGERS), st.booleans())
ACTIONS = st.tuples(
    SEND,
    st.lists(
        st.one_of(
            SEND,
            st.tuples(st.just("approve"), st.booleans()),
            st.tuples(st.just("deny"), st.sampled_from(["", "not now"])),
            st.tuples(st.just("cancel"), st.sampled_from([0.0, 0.01, 0.05, 0.2])),
            st.tuples(st.just("wait")),
        ),
        max_size=7,
    ),
).map(lambda first_and_rest: [first_and_rest[0], *first_and_rest[1]])


async def _act(user, chat, action: tuple) -> None:
    kind = action[0]
    if kind == "send":
        await send(user, chat, action[1])
        if action[2]:
            await settle()
    elif kind in ("approve", "deny"):
        waiting = await adb(pending_approvals)(chat)
        if waiting:
            approve = kind == "approve"
            await adb(actions.decide_approval)(
                user,
                chat.pk,
                waiting[0].call_id,
                approve=approve,
                reason="" if approve else action[1],
                always=approve and action[1],
            )
    elif kind == "cancel":
        await asyncio.sleep(action[1])
        await cancel(user, chat)
    else:
        await settle()


async def cancel(user, chat) -> None:
    """Cancel like the API does (a cancelled waiting run hands over to what was queued)."""
    await adb(actions.cancel_run)(user, chat.pk)


async def _wind_down(user, chat) -> None:
    """End whatever is still live: cancel what waits, let runs finish."""
    for _ in range(20):
        await settle()
        if not await adb(Run.objects.filter(chat=chat, status__in=transitions.LIVE).exists)():
            return
        await cancel(user, chat)
    raise AssertionError("the chat did not wind down")


@hypothesis_settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(model=st.sampled_from(["demo-fast", "demo"]), actions=ACTIONS)
async def test_random_user_actions_keep_every_invariant(alice, agent, runtime, model, actions):
    # "demo" streams with a tiny delay per word, so cancels also land mid-stream.
    runtime.LYCEUM_DEMO_TOKEN_DELAY = 0.0005
    chat = await new_chat(alice, model)
    for action in actions:
        await _act(alice, chat, action)
    await _wind_down(alice, chat)
    chat_runs = await adb(check_chat)(chat)
    assert chat_runs  # the first action always sends
    # Every message was taken by a run (answered, or ended with its run): none is stranded.
    assert not await adb(QueuedInput.objects.filter(chat=chat, consumed=False).exists)()
    await adb(assert_nothing_live)()


async def test_a_run_delivered_twice_executes_once(alice, agent, runtime, fake_model):
    """A channel layer may hand one dispatch to two workers; the claim lets one run it."""
    fake_model.enqueue(Script(text="Only once."), Script(text="A second execution!"))
    chat = await new_chat(alice, "fake-model")
    sent = await adb(actions.send_message)(alice, chat.pk, "hi", uuid.uuid4().hex)

    await asyncio.wait_for(
        asyncio.gather(executor.execute_run(sent.run_id), executor.execute_run(sent.run_id)), WAIT
    )
    await settle()

    assert len(fake_model.chat_requests()) == 1
    events = await adb(display)(chat)
    assert terminal_of(events, sent.run_id)["text"] == "Only once."
    assert len([e for e in events if e.kind in TERMINAL_TYPES]) == 1
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


# --- a worker taking runs along ----------------------------------------------------------------


async def test_a_worker_handed_one_run_starts_the_others_nobody_claimed(alice, agent, runtime):
    chats = [await new_chat(alice) for _ in range(3)]
    sent = [
        await adb(actions.send_message)(alice, chat.pk, "hello", uuid.uuid4().hex) for chat in chats
    ]
    consumer = worker.RunWorkerConsumer()

    await consumer.run_execute({"type": "run.execute", "run_id": sent[0].run_id})
    await settle()
    statuses = [(await Run.objects.aget(pk=result.run_id)).status for result in sent]
    assert statuses == [Run.Status.COMPLETED] * 3
    # The other runs' own messages come late: each finds its run claimed and does nothing.
    for result in sent[1:]:
        await consumer.run_execute({"type": "run.execute", "run_id": result.run_id})
    await settle()

    for chat in chats:
        (run,) = await adb(check_chat)(chat)  # one run each, answered once
        assert run.status == Run.Status.COMPLETED
    assert await adb(transitions.unclaimed_runs)(10) == []
    await adb(assert_nothing_live)()


async def test_a_run_waiting_for_approval_is_not_taken_along(alice, agent, runtime):
    runtime.LYCEUM_RUNNER = "worker"  # sends hand runs to workers; none listens here
    waiting_chat, other_chat = await new_chat(alice), await new_chat(alice)
    waiting = await adb(actions.send_message)(alice, waiting_chat.pk, "x", uuid.uuid4().hex)
    await Run.objects.filter(pk=waiting.run_id).aupdate(status=Run.Status.WAITING)
    other = await adb(actions.send_message)(alice, other_chat.pk, "hello", uuid.uuid4().hex)

    await worker.RunWorkerConsumer().run_execute({"type": "run.execute", "run_id": other.run_id})
    await settle()

    run = await Run.objects.aget(pk=waiting.run_id)
    assert run.status == Run.Status.WAITING and not run.claimed
