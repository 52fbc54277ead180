"""Random user actions (hypothesis) keep every invariant; a run delivered twice executes
once.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from chat import actions
from chat.agent.events import TERMINAL_TYPES
from chat.models import QueuedInput, Run
from chat.runhost import executor, transitions
from tests.fakeopenai import Script
from tests.runhost.helpers import (
    WAIT,
    adb,
    assert_nothing_live,
    check_chat,
    display,
    new_chat,
    pending_approvals,
    send,
    settle,
    terminal_of,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]


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
