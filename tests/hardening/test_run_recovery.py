"""§6: runs that were stored but not dispatched are dispatched again; recovery reports what
was stored; every process that dispatches runs also sweeps them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import AsyncClient
from django.utils import timezone

from chat import actions, store
from chat.agent.events import TERMINAL_TYPES
from chat.apikeys import create_api_key
from chat.core.messages import ToolCall, assistant
from chat.models import Run
from chat.runhost import executor, transitions

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker_mode(settings):
    settings.LYCEUM_RUNNER = "worker"
    settings.LYCEUM_WORKER_CHANNEL = "lyceum-runs-test"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "chat.live.layers.LeanInMemoryChannelLayer"}}
    return settings


@pytest.fixture
async def no_sweeper():
    await executor.stop_all()
    yield
    await executor.stop_all()


def _live_run(user) -> Run:
    chat = actions.new_chat(user, model="demo-fast")
    actions.send_message(user, chat.pk, "hello", "c1")  # no event loop: nothing launches it
    return Run.objects.get(chat=chat)


def _terminal(run: Run) -> dict:
    terminals = [
        e.payload
        for e in store.display_events_after(run.chat_id, 0)
        if e.payload.get("type") in TERMINAL_TYPES and e.payload.get("run_id") == str(run.pk)
    ]
    assert len(terminals) == 1, terminals
    return terminals[0]


def _write_reply(run: Run, text: str, *, tool_calls=None) -> None:
    """What the run host writes when a streamed reply is done (then the checkpoint empties)."""
    message = assistant(text, tool_calls=tool_calls, extra={"run_id": str(run.pk), "round": 0})
    store.append_display_messages(run.chat_id, [message])
    Run.objects.filter(pk=run.pk).update(
        claimed=True,
        partial_text="",
        partial_reasoning="",
        heartbeat_at=timezone.now() - timedelta(minutes=5),
    )


# --- recovery sees what was stored ------------------------------------------------------------


def test_a_run_whose_worker_died_after_writing_the_whole_reply_is_completed(alice, default_agent):
    run = _live_run(alice)
    _write_reply(run, "The whole reply, written before the worker died.")

    assert transitions.recover_stale_runs() == [str(run.pk)]

    run.refresh_from_db()
    assert run.status == Run.Status.COMPLETED
    terminal = _terminal(run)
    assert terminal["type"] == "complete"
    assert terminal["text"] == "The whole reply, written before the worker died."
    assert terminal["output_tokens"] > 0 and terminal["usage_estimated"] is True
    # No second copy of the reply as a partial message.
    messages = [
        e.payload
        for e in store.display_events_after(run.chat_id, 0)
        if e.kind == "msg" and e.payload.get("role") == "assistant"
    ]
    assert len(messages) == 1


def test_an_interrupted_run_reports_the_reply_it_had_written(alice, default_agent):
    run = _live_run(alice)
    call = ToolCall(id="call-1", name="calculator", arguments='{"expression": "1+1"}')
    _write_reply(run, "Let me compute that first.", tool_calls=[call])

    transitions.recover_stale_runs()

    run.refresh_from_db()
    assert run.status == Run.Status.INTERRUPTED
    terminal = _terminal(run)
    assert terminal["status"] == "interrupted"
    assert terminal["partial_text"] == "Let me compute that first."
    assert "process running it stopped" in terminal["message"]


def test_a_checkpoint_streamed_after_the_written_reply_still_wins(alice, default_agent):
    run = _live_run(alice)
    _write_reply(run, "First part.", tool_calls=[ToolCall(id="c", name="x", arguments="{}")])
    Run.objects.filter(pk=run.pk).update(partial_text="Second part, streaming")

    transitions.recover_stale_runs()

    assert _terminal(run)["partial_text"] == "Second part, streaming"


# --- stored but undispatched runs are dispatched again ------------------------------------------


def test_an_unclaimed_run_past_its_deadline_is_redispatched_once_then_interrupted(
    alice, default_agent
):
    run = _live_run(alice)
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))

    assert transitions.redispatch_undispatched() == [str(run.pk)]
    assert transitions.redispatch_undispatched() == []  # once
    assert transitions.recover_stale_runs() == []  # its stale window starts again
    run.refresh_from_db()
    assert (run.status, run.redispatched) == (Run.Status.RUNNING, 1)

    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    assert transitions.redispatch_undispatched() == []
    assert transitions.recover_stale_runs() == [str(run.pk)]
    terminal = _terminal(run)
    assert terminal["status"] == "interrupted"
    assert "never started" in terminal["message"]


async def test_the_sweeper_hands_a_lost_dispatch_to_the_workers_again(
    alice, default_agent, worker_mode, no_sweeper
):
    run = await database_sync_to_async(_live_run)(alice)
    await database_sync_to_async(Run.objects.filter(pk=run.pk).update)(
        heartbeat_at=timezone.now() - timedelta(minutes=5)
    )

    await executor.sweep_once()

    message = await get_channel_layer().receive("lyceum-runs-test")
    assert (message["type"], message["run_id"]) == ("run.execute", str(run.pk))
    run = await database_sync_to_async(Run.objects.get)(pk=run.pk)
    assert run.status == Run.Status.RUNNING  # not interrupted blindly


def test_a_claim_resets_the_redispatch_count(alice, default_agent, settings):
    run = _live_run(alice)
    Run.objects.filter(pk=run.pk).update(redispatched=1)
    prepared = executor._prepare(str(run.pk), False)
    assert prepared is not None
    run.refresh_from_db()
    assert (run.claimed, run.redispatched) == (True, 0)


# --- every process that dispatches sweeps -------------------------------------------------------


async def test_an_api_only_process_starts_the_sweeper(alice, worker_mode, no_sweeper):
    _key, raw = await database_sync_to_async(create_api_key)(alice, "t")
    assert executor._sweeper is None

    response = await AsyncClient().get(
        "/api/v1/chat/00000000-0000-0000-0000-000000000000/runs/x",
        headers={"Authorization": f"Bearer {raw}"},
    )

    assert response.status_code in (404, 405)
    assert executor._sweeper is not None and not executor._sweeper.done()
