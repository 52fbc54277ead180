"""Approvals: a run waits for the user's answer, survives a restart while waiting, and
answers, expiries and cancels that race it end it cleanly.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from chat import actions, store
from chat.models import ChatToolGrant, Provider, ProviderModel, Run, ToolApproval
from chat.runhost import executor, transitions
from chat.runhost import host as run_host
from tests.fakeopenai import FakeToolCall, Script
from tests.runhost.helpers import (
    WAIT,
    adb,
    assert_nothing_live,
    check_chat,
    display,
    events_of,
    new_chat,
    pending_approvals,
    run_row,
    send,
    settle,
    terminal_of,
    until,
    wait_for_approval,
    workspace_file,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]


async def test_deny_with_a_reason_survives_a_restart_and_the_model_sees_the_reason(
    alice, bob, agent, runtime
):
    chat = await new_chat(alice)
    run_id, approval = await wait_for_approval(alice, chat, "write file notes.md")
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
    run_id, approval = await wait_for_approval(alice, chat, "write file notes.md")
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    await settle()
    assert workspace_file(runtime, chat, "notes.md").exists()
    assert (await adb(run_row)(run_id)).status == Run.Status.COMPLETED

    # Approved once only: the next write asks again; this time "always".
    run_id, approval = await wait_for_approval(alice, chat, "write file plan.md")
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
    await wait_for_approval(alice, other_chat, "write file todo.md")
    await adb(actions.cancel_run)(alice, other_chat.pk)
    await adb(check_chat)(chat)
    await adb(check_chat)(other_chat)
    await adb(assert_nothing_live)()


async def test_an_unanswered_approval_expires_and_counts_as_denied(alice, agent, runtime):
    runtime.LYCEUM_APPROVAL_TIMEOUT = 0.2
    chat = await new_chat(alice)
    run_id, approval = await wait_for_approval(alice, chat, "write file notes.md")
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
    run_id, approval = await wait_for_approval(alice, chat, "write file notes.md")
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
    alice, agent, runtime, guard_clock
):
    runtime.LYCEUM_RUN_GUARD_SECONDS = 20.0
    chat = await new_chat(alice)
    run_id, approval = await wait_for_approval(alice, chat, "write file notes.md")
    guard_clock.advance(21.0)  # the answer comes after longer than the guard
    await adb(actions.decide_approval)(alice, chat.pk, approval.call_id, approve=True)
    await settle()
    assert (await adb(run_row)(run_id)).status == Run.Status.COMPLETED
    assert workspace_file(runtime, chat, "notes.md").exists()


async def test_a_message_queued_behind_a_cancelled_waiting_run_gets_its_own_run(
    alice, agent, runtime
):
    chat = await new_chat(alice)
    run_id, _approval = await wait_for_approval(alice, chat, "write file notes.md")
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


def disable_model(alias: str) -> None:
    """As the admin does (a save): every process keeps the whitelist for a few seconds
    (``catalog.resolve_model``), this one forgets it at a save."""
    row = ProviderModel.objects.get(alias=alias)
    row.enabled = False
    row.save()


async def test_the_sweeper_starts_runs_for_messages_nothing_else_would_start(
    alice, agent, runtime, fake_model
):
    waiting_chat = await new_chat(alice)
    await wait_for_approval(alice, waiting_chat, "write file notes.md")
    queued = await send(alice, waiting_chat, "hello again")
    await adb(actions.cancel_run)(alice, waiting_chat.pk)  # a caller that does not start the next
    # A run that failed before taking its own message must not be retried forever.
    broken_chat = await new_chat(alice, "fake-model")
    await adb(disable_model)("fake-model")
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
