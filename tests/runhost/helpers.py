"""Plain helpers for the run tests: start runs the way the views do, wait for them, and
read back what the database says (the invariants every chat keeps included).

Used by the tests under tests/runhost/ and by tests/api/test_events_contract.py; the
fixtures they go with (``runtime``, ``runner_state``, ``fake_model``) are in
tests/runhost/conftest.py.
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.utils import timezone

from chat import actions, store
from chat.agent.events import TERMINAL_TYPES
from chat.core import eventlog
from chat.models import Artifact, ChatEvent, ChatSession, Run, ToolApproval
from chat.runhost import executor, transitions
from chat.runhost.workspace import ArtifactWorkspace

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


def running_run(chat, *, partial: str, heartbeat_age: float | None) -> Run:
    run = Run.objects.create(chat=chat, model="demo-fast")
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        partial_text=partial,
        checkpoint_at=now,
        heartbeat_at=None if heartbeat_age is None else now - timedelta(seconds=heartbeat_age),
        started_at=now - timedelta(minutes=5),
    )
    return run


async def wait_for_approval(alice, chat, text: str) -> tuple[str, ToolApproval]:
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
