"""The fault matrix, through the whole runtime: send → runner → agent loop → OpenAI provider
→ the fake OpenAI HTTP server, and back into the database.

Every case ends in exactly one terminal event with the right category, the Run row
terminal, the partial text kept (on the row, as a display message marked ``ended``
and in context) and nothing left running.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from chat import store
from chat.models import Run
from tests.fakeopenai import FakeOpenAI, FakeToolCall, Script
from tests.runhost.helpers import (
    adb,
    assert_nothing_live,
    check_chat,
    display,
    events_of,
    new_chat,
    partial_messages,
    run_row,
    send,
    settle,
    terminal_of,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]

STREAM_ERROR = {"error": {"message": "upstream exploded", "type": "server_error"}}
SLOW_TOKENS = [f"slow{i} " for i in range(12)]


@dataclass(frozen=True)
class Case:
    scripts: tuple[Script, ...]
    status: str
    category: str = ""
    partial: str = ""  # the partial text a failed run keeps
    text: str = ""  # the reply a completed run gives
    retries: tuple[str, ...] = ()  # categories of the "retrying" events, in order
    overrides: dict[str, Any] = field(default_factory=dict)  # settings for this case
    gave_up: int = 0  # responses the client walked away from (stalls)
    # The client stops reading at a bad line; whether the server was still writing the
    # rest (and so saw it leave) is a race, so up to one disconnect per such response.
    may_abandon: bool = False

    @property
    def requests(self) -> int:
        return len(self.scripts)


FAILED, COMPLETED = Run.Status.FAILED, Run.Status.COMPLETED
CASES = {
    "500 retried then answered": Case(
        (Script(status=500), Script(text="Recovered fine.")),
        COMPLETED,
        text="Recovered fine.",
        retries=("provider_error",),
    ),
    "500 until retries run out": Case(
        (Script(status=500), Script(status=500)),
        FAILED,
        "provider_error",
        retries=("provider_error",),
    ),
    "429 until retries run out": Case(
        (
            Script(status=429, headers={"Retry-After": "0.05"}),
            Script(status=429, headers={"Retry-After": "0.05"}),
        ),
        FAILED,
        "rate_limited",
        retries=("rate_limited",),
    ),
    "error object before any token, retried": Case(
        (Script(stream_error=STREAM_ERROR), Script(text="Second time lucky.")),
        COMPLETED,
        text="Second time lucky.",
        retries=("provider_error",),
    ),
    "error object after some tokens": Case(
        (Script(tokens=["Some ", "text "], stream_error=STREAM_ERROR, fault_after=2),),
        FAILED,
        "provider_error",
        partial="Some text ",
    ),
    "error sent as an SSE error event": Case(
        (Script(tokens=["Before "], stream_error=STREAM_ERROR, error_event=True, fault_after=1),),
        FAILED,
        "provider_error",
        partial="Before ",
    ),
    "malformed line after some tokens": Case(
        (Script(tokens=["Par", "tial "], malformed=True, fault_after=2),),
        FAILED,
        "malformed_stream",
        partial="Partial ",
        may_abandon=True,
    ),
    "malformed line before any token, every time": Case(
        (Script(malformed=True), Script(malformed=True)),
        FAILED,
        "malformed_stream",
        retries=("malformed_stream",),
        may_abandon=True,
    ),
    "connection dropped before the first token, retried": Case(
        (Script(drop=True), Script(text="Reconnected.")),
        COMPLETED,
        text="Reconnected.",
        retries=("unreachable",),
    ),
    "connection dropped after some tokens": Case(
        (Script(tokens=["Half ", "a ", "reply "], drop=True, fault_after=3),),
        FAILED,
        "unreachable",
        partial="Half a reply ",
    ),
    "connection reset after some tokens": Case(
        (Script(tokens=["Cut ", "off "], drop=True, drop_reset=True, fault_after=2),),
        FAILED,
        "unreachable",
        partial="Cut off ",
    ),
    "stall before the first byte": Case(
        (Script(headers_delay=10), Script(headers_delay=10)),
        FAILED,
        "timed_out",
        retries=("timed_out",),
        overrides={"LYCEUM_FIRST_BYTE_TIMEOUT": 0.3},
        gave_up=2,
    ),
    "stall after the headers, before any data": Case(
        (Script(body_delay=10), Script(text="Fine now.")),
        COMPLETED,
        text="Fine now.",
        retries=("timed_out",),
        overrides={"LYCEUM_FIRST_BYTE_TIMEOUT": 0.3},
        gave_up=1,
    ),
    "stall mid-stream": Case(
        (Script(tokens=["Going ", "strong ", "until "], stall=10, fault_after=3),),
        FAILED,
        "timed_out",
        partial="Going strong until ",
        overrides={"LYCEUM_IDLE_TIMEOUT": 0.3},
        gave_up=1,
    ),
    "keep-alive comments do not count as silence": Case(
        (Script(tokens=["Wait ", "for ", "it."], stall=0.6, keepalive=0.1, fault_after=2),),
        COMPLETED,
        text="Wait for it.",
        overrides={"LYCEUM_IDLE_TIMEOUT": 0.3},
    ),
    "slow tokens": Case(
        (Script(tokens=SLOW_TOKENS, token_delay=0.03),),
        COMPLETED,
        text="".join(SLOW_TOKENS),
    ),
    "lines split at random byte boundaries": Case(
        (Script(text="Ünïcödé survives split writes — intact.", split=3, split_seed=7),),
        COMPLETED,
        text="Ünïcödé survives split writes — intact.",
    ),
    "no [DONE] but a finish reason": Case(
        (Script(text="Finished anyway.", done=False),),
        COMPLETED,
        text="Finished anyway.",
    ),
}


async def _run_case(alice, runtime, fake: FakeOpenAI, case: Case):
    for name, value in case.overrides.items():
        setattr(runtime, name, value)
    fake.enqueue(*case.scripts)
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "please answer")
    await settle()
    return chat, await adb(run_row)(sent.run_id)


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_fault_matrix(alice, agent, runtime, fake_model, case: Case):
    chat, run = await _run_case(alice, runtime, fake_model, case)

    assert (run.status, run.error_category) == (case.status, case.category)
    assert run.partial_text == case.partial
    assert len(fake_model.chat_requests()) == case.requests
    # The client closed what it gave up on (the server saw it leave), and nothing else.
    assert await fake_model.wait_for_disconnect_async(case.gave_up, timeout=1.0)
    abandoned = case.requests if case.may_abandon else 0
    assert case.gave_up <= len(fake_model.disconnects) <= case.gave_up + abandoned
    events = await adb(display)(chat)
    terminal = terminal_of(events, run.pk)
    retrying = events_of(events, run.pk, "retrying")
    assert tuple(p["category"] for p in retrying) == case.retries
    if case.status == COMPLETED:
        assert terminal["type"] == "complete"
        assert terminal["text"] == case.text
        assert partial_messages(events) == []
    else:
        assert (terminal["type"], terminal["category"]) == ("error", case.category)
        assert terminal["message"] == run.error_message and run.error_message
        assert terminal["partial_text"] == case.partial
        shown = [(p["content"], p["extra"]["ended"]) for p in partial_messages(events)]
        assert shown == ([(case.partial, "failed")] if case.partial else [])
        context = await adb(store.load_context)(chat.pk)
        if case.partial:
            assert (context[-1].content, context[-1].extra.get("ended")) == (
                case.partial,
                "failed",
            )
        else:
            assert [m.role for m in context] == ["user"]
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_retry_after_is_honoured(alice, agent, runtime, fake_model):
    fake_model.enqueue(
        Script(status=429, headers={"Retry-After": "0.4"}), Script(text="After the wait.")
    )
    chat, run = await _run_case(alice, runtime, fake_model, Case((), COMPLETED))
    assert run.status == COMPLETED
    (retrying,) = events_of(await adb(display)(chat), run.pk, "retrying")
    assert (retrying["category"], retrying["delay"]) == ("rate_limited", 0.4)
    first, second = fake_model.chat_requests()
    assert second.received_at - first.received_at >= 0.4


async def test_an_in_stream_error_message_reaches_the_user(alice, agent, runtime, fake_model):
    case = CASES["error object after some tokens"]
    chat, run = await _run_case(alice, runtime, fake_model, case)
    assert "upstream exploded" in run.error_message


async def test_tool_call_arguments_split_in_pieces_are_reassembled(
    alice, agent, runtime, fake_model
):
    fake_model.enqueue(
        Script(
            text="",
            tool_calls=[
                FakeToolCall("calculator", '{"expression": "12*7"}', pieces=7),
                FakeToolCall("calculator", '{"expression": "(2+3)*4"}', pieces=5, name_pieces=3),
            ],
            interleave_tool_calls=True,
        ),
        Script(text="84 and 20."),
    )
    chat, run = await _run_case(alice, runtime, fake_model, Case((), COMPLETED))
    assert run.status == COMPLETED
    events = await adb(display)(chat)
    assert [(p["call_id"], p["input"]) for p in events_of(events, run.pk, "tool_start")] == [
        ("call_fake_0", {"expression": "12*7"}),
        ("call_fake_1", {"expression": "(2+3)*4"}),
    ]
    assert [(p["output"], p["status"]) for p in events_of(events, run.pk, "tool_end")] == [
        ("84", "done"),
        ("20", "done"),
    ]
    # The model's next request carries the calls whole and their results.
    messages = fake_model.chat_requests()[1].json["messages"]
    (call_message,) = [m for m in messages if m.get("tool_calls")]
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in call_message["tool_calls"]
    ] == [("calculator", {"expression": "12*7"}), ("calculator", {"expression": "(2+3)*4"})]
    assert [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"] == [
        ("call_fake_0", "84"),
        ("call_fake_1", "20"),
    ]
    assert terminal_of(events, run.pk)["text"] == "84 and 20."
    await adb(check_chat)(chat)


@pytest.mark.parametrize("usage", [True, False], ids=["usage sent", "usage missing"])
async def test_usage_from_the_provider_or_estimated(alice, agent, runtime, fake_model, usage):
    fake_model.enqueue(Script(text="A reply of several words to count.", usage=usage))
    chat, run = await _run_case(alice, runtime, fake_model, Case((), COMPLETED))
    assert run.status == COMPLETED
    assert run.usage_estimated is not usage
    if usage:
        assert (run.input_tokens, run.output_tokens) == (11, 7)  # what the fake reported
    else:
        assert run.input_tokens > 0 and run.output_tokens > 0
    complete = terminal_of(await adb(display)(chat), run.pk)
    assert (complete["input_tokens"], complete["output_tokens"], complete["usage_estimated"]) == (
        run.input_tokens,
        run.output_tokens,
        not usage,
    )
