"""The agent loop (chat.agent.loop) as plain Python: an in-memory host, a scripted provider."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chat.agent import events as ev
from chat.agent.builtin_tools import default_registry
from chat.agent.hooks import HookContext, HookEvent, HookRegistry, HookResult
from chat.agent.loop import AgentLoop, Decision, LoopConfig, LoopOutcome
from chat.agent.registry import ToolRegistry
from chat.agent.subagent import DELEGATE
from chat.agent.workspace import Workspace
from chat.core import compact
from chat.core.channels import open_tool_call_ids
from chat.core.messages import ChatMessage, Role, assistant, tool_result, user
from chat.core.prompts import EXPIRED_TEXT, SUB_AGENT_PROMPT, USER_APPENDED_PREFIX, denied_text
from chat.core.tokens import estimate_text_tokens, estimate_tokens
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    ProviderError,
    Retrying,
    TextDelta,
    Usage,
)
from tests.agent.fakes import (
    MemoryHost,
    ScriptedProvider,
    ScriptExhausted,
    call,
    end,
    text_reply,
    tool_reply,
)

AUTO_BUILTINS = ["calculator", "current_time", "read_file", "list_files"]


def make_loop(
    host: MemoryHost,
    provider: ScriptedProvider,
    root: Path,
    *,
    tools: ToolRegistry | None = None,
    policies: dict[str, str] | None = None,
    hooks: HookRegistry | None = None,
    **config: Any,
) -> AgentLoop:
    return AgentLoop(
        host,
        provider,
        tools if tools is not None else default_registry(),
        LoopConfig(model="test-model", **config),
        workspace=Workspace(root),
        chat_id="chat-1",
        hooks=hooks,
        tool_policies=policies,
    )


def brief(messages: list[ChatMessage]) -> list[tuple[Any, ...]]:
    """Messages as short tuples: (role, content[, call names | result id][, sender])."""
    rows: list[tuple[Any, ...]] = []
    for m in messages:
        row: tuple[Any, ...] = (str(m.role), m.content)
        if m.tool_calls is not None:
            row += (tuple(c.name for c in m.tool_calls),)
        if m.tool_call_id is not None:
            row += (m.tool_call_id,)
        if m.sender_name:
            row += (m.sender_name,)
        rows.append(row)
    return rows


def tool_names(request: ChatRequest) -> list[str]:
    return [spec["function"]["name"] for spec in request.tools]


def assert_groups_contiguous(messages: list[ChatMessage], *, allow_open_tail: bool) -> None:
    """Only a tool-call message's own results follow it until each call has exactly one;
    no result without its call. An unfinished group may only be the tail."""
    waiting: list[str] = []
    for message in messages:
        if message.role == Role.TOOL:
            assert message.tool_call_id in waiting, f"orphan or second result {brief([message])}"
            waiting.remove(message.tool_call_id)
            continue
        assert not waiting, f"{brief([message])} sits inside an open tool group"
        if message.is_tool_request:
            waiting = [c.id for c in message.tool_calls or []]
    assert allow_open_tail or not waiting, "a tool group was left open"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


# --- a plain answer -----------------------------------------------------------------------------


async def test_plain_text_answer_streams_and_lands_in_both_channels(root: Path) -> None:
    host = MemoryHost(prompt="Be kind.")
    seq = host.send("Hello")
    provider = ScriptedProvider(
        [
            [Retrying(1, 3, 0.5, ErrorCategory.RATE_LIMITED, "slow down")]
            + text_reply("Hi there, friend!", reasoning="Greet back.", usage=Usage(12, 5))
        ]
    )
    loop = make_loop(host, provider, root)

    outcome = await loop.run()

    assert outcome == LoopOutcome("completed", text="Hi there, friend!", usage=Usage(12, 5))
    assert loop.final_text == "Hi there, friend!"
    assert host.event_types[:4] == ["iteration_start", "input_taken", "context_usage", "retrying"]
    start = host.events_of(ev.IterationStart)
    assert [(e.iteration, e.max_iterations) for e in start] == [(1, 12)]
    assert [e.input_seq for e in host.events_of(ev.InputTaken)] == [seq]
    retry = host.events_of(ev.RetryingEvent)[0]
    assert (retry.attempt, retry.category, retry.message) == (1, "rate_limited", "slow down")
    assert "".join(e.text for e in host.events_of(ev.ThinkingDelta)) == "Greet back."
    assert "".join(e.text for e in host.events_of(ev.Delta)) == "Hi there, friend!"
    assert len(host.events_of(ev.Delta)) > 1  # streamed in pieces, not at the end
    assert host.stream_updates[-1] == ("Hi there, friend!", "Greet back.")

    request = provider.stream_requests[0]
    assert brief(request.messages) == [("user", "Hello")]
    assert request.system_prompt == "Be kind."
    assert request.model == "test-model"
    assert set(AUTO_BUILTINS + ["write_file", "edit_file"]) == set(tool_names(request))
    usage_event = host.events_of(ev.ContextUsage)[0]
    assert usage_event.tokens == estimate_tokens([user("Hello")]) + estimate_text_tokens("Be kind.")
    assert usage_event.context_window == 32_000

    final = assistant("Hi there, friend!", reasoning_content="Greet back.")
    # Context marks the message with its display seq (edits and regenerations find it).
    assert host.channels.context == [user("Hello", extra={"input_seq": 1}), final]
    assert host.channels.display == [user("Hello"), final]
    assert host.persisted == host.channels.context
    assert loop.partial_text == ""  # nothing half-streamed is left once the reply is stored


async def test_usage_is_estimated_and_flagged_when_the_provider_sends_none(root: Path) -> None:
    host = MemoryHost(prompt="Prompt.")
    host.send("Count this")
    provider = ScriptedProvider([text_reply("Counted.", reasoning="Hmm.", usage=None)])

    outcome = await make_loop(host, provider, root).run()

    expected_in = estimate_tokens([user("Count this")]) + estimate_text_tokens("Prompt.")
    expected_out = estimate_text_tokens("Counted.") + estimate_text_tokens("Hmm.")
    assert outcome.usage == Usage(expected_in, expected_out, estimated=True)


async def test_a_stream_without_stream_end_is_a_malformed_stream(root: Path) -> None:
    host = MemoryHost()
    host.send("Hi")
    provider = ScriptedProvider([[TextDelta("Half")]])
    loop = make_loop(host, provider, root)

    with pytest.raises(ProviderError) as caught:
        await loop.run()

    assert caught.value.category is ErrorCategory.MALFORMED_STREAM
    assert caught.value.streamed
    assert loop.partial_text == "Half"


# --- tool rounds --------------------------------------------------------------------------------


async def test_tool_round_then_final_answer(root: Path) -> None:
    host = MemoryHost()
    host.send("What is 6*7?")
    calc = call("calculator", {"expression": "6*7"})
    provider = ScriptedProvider(
        [tool_reply(calc, text="Let me compute.", reasoning="Use the tool."), text_reply("42.")]
    )

    outcome = await make_loop(host, provider, root).run()

    assert outcome.status == "completed" and outcome.text == "42."
    assert outcome.usage == Usage(22, 14)  # both rounds counted
    expected = [
        ("user", "What is 6*7?"),
        ("assistant", "Let me compute.", ("calculator",)),
        ("tool", "42", calc.id),
        ("assistant", "42."),
    ]
    assert brief(host.channels.context) == expected
    assert brief(host.channels.display) == expected
    assert host.channels.context[1].reasoning_content == "Use the tool."
    assert host.channels.context[2].extra == {"status": "done"}
    assert host.persisted == host.channels.context

    [started] = host.events_of(ev.ToolStart)
    assert (started.call_id, started.name, started.input) == (
        calc.id,
        "calculator",
        {"expression": "6*7"},
    )
    [ended] = host.events_of(ev.ToolEnd)
    assert (ended.call_id, ended.output, ended.status) == (calc.id, "42", "done")
    assert [e.iteration for e in host.events_of(ev.IterationStart)] == [1, 2]
    assert host.event_types.index("tool_start") < host.event_types.index("tool_end")

    second = provider.stream_requests[1]
    assert brief(second.messages) == expected[:3]


async def test_bad_tool_arguments_become_an_error_result_and_the_run_continues(root: Path) -> None:
    host = MemoryHost()
    host.send("Compute")
    bad = call("calculator", {"expr": "1+1"})
    provider = ScriptedProvider([tool_reply(bad), text_reply("Sorry, I'll fix that.")])

    outcome = await make_loop(host, provider, root).run()

    assert outcome.text == "Sorry, I'll fix that."
    [ended] = host.events_of(ev.ToolEnd)
    assert ended.status == "failed"
    assert ended.output.startswith("Error: invalid arguments for calculator")
    result = provider.stream_requests[1].messages[-1]
    assert result.role == Role.TOOL and result.tool_call_id == bad.id
    assert result.content == ended.output
    assert host.channels.context[2].extra == {"status": "failed"}


# --- approvals ----------------------------------------------------------------------------------


def write_call(path: str = "notes.md", content: str = "hello") -> Any:
    return call("write_file", {"path": path, "content": content})


async def suspend_on(
    root: Path, *calls: Any, host: MemoryHost | None = None
) -> tuple[MemoryHost, ScriptedProvider]:
    host = host or MemoryHost()
    host.send("Please write")
    provider = ScriptedProvider([tool_reply(*calls)])
    outcome = await make_loop(host, provider, root).run()
    assert outcome.status == "suspended"
    return host, provider


async def test_an_ask_tool_suspends_the_run_without_running_anything(root: Path) -> None:
    write = write_call()
    host, provider = await suspend_on(root, write)

    [suspension] = host.suspensions
    assert suspension.message.tool_calls == [write]
    assert suspension.pending == [write]
    assert suspension.usage == Usage(11, 7)
    assert not (root / "notes.md").exists()
    assert not host.events_of(ev.ToolStart) and not host.events_of(ev.ToolEnd)
    assert provider.remaining == 0
    # The open group is live and shown, but not persisted: the safe cut stops before it.
    assert host.channels.context[-1].tool_calls == [write]
    assert brief(host.persisted) == [("user", "Please write")]
    assert brief(host.channels.display)[-1] == ("assistant", "", ("write_file",))


async def resume(
    host: MemoryHost,
    provider: ScriptedProvider,
    root: Path,
    decisions: dict[str, Decision],
    *replies: Any,
    **kw: Any,
) -> tuple[MemoryHost, LoopOutcome]:
    fresh = host.resumed()
    provider.add(*replies)
    message = host.suspensions[-1].message
    loop = make_loop(fresh, provider, root, **kw)
    outcome = await loop.run(resume=(message, decisions), first_iteration=2)
    return fresh, outcome


async def test_approving_runs_the_tool(root: Path) -> None:
    write = write_call(content="approved text")
    host, provider = await suspend_on(root, write)

    fresh, outcome = await resume(
        host, provider, root, {write.id: Decision(approved=True)}, text_reply("Written.")
    )

    assert outcome.status == "completed" and outcome.text == "Written."
    assert (root / "notes.md").read_text() == "approved text"
    [ended] = fresh.events_of(ev.ToolEnd)
    assert ended.status == "done" and "notes.md" in ended.output
    assert [e.iteration for e in fresh.events_of(ev.IterationStart)] == [2]
    assert brief(fresh.channels.context) == [
        ("user", "Please write"),
        ("assistant", "", ("write_file",)),
        ("tool", ended.output, write.id),
        ("assistant", "Written."),
    ]
    assert fresh.persisted == fresh.channels.context
    # The call was shown once, before the suspension; resuming does not show it again.
    assert [m.display_type for m in fresh.channels.display].count("tool_call_request") == 1


async def test_denying_gives_the_model_the_reason(root: Path) -> None:
    write = write_call()
    host, provider = await suspend_on(root, write)

    fresh, outcome = await resume(
        host,
        provider,
        root,
        {write.id: Decision(approved=False, reason="not in my notes")},
        text_reply("Understood."),
    )

    assert outcome.text == "Understood."
    assert not (root / "notes.md").exists()
    assert not fresh.events_of(ev.ToolStart)
    [ended] = fresh.events_of(ev.ToolEnd)
    assert (ended.status, ended.output) == ("denied", denied_text("not in my notes"))
    last_request = provider.stream_requests[-1]
    assert last_request.messages[-1].content == denied_text("not in my notes")
    assert "Reason: not in my notes" in last_request.messages[-1].content


async def test_an_expired_decision_says_so(root: Path) -> None:
    write = write_call()
    host, provider = await suspend_on(root, write)

    fresh, _ = await resume(
        host,
        provider,
        root,
        {write.id: Decision(approved=False, expired=True)},
        text_reply("It expired."),
    )

    assert fresh.channels.context[2].content == EXPIRED_TEXT
    assert fresh.events_of(ev.ToolEnd)[0].status == "denied"
    assert not (root / "notes.md").exists()


async def test_a_granted_tool_runs_without_asking(root: Path) -> None:
    host = MemoryHost(granted={"write_file"})
    host.send("Write it")
    write = write_call(content="granted")
    provider = ScriptedProvider([tool_reply(write), text_reply("Done.")])

    outcome = await make_loop(host, provider, root).run()

    assert outcome.status == "completed"
    assert not host.suspensions
    assert (root / "notes.md").read_text() == "granted"


def _launch_tools(launched: list[str]) -> ToolRegistry:
    registry = default_registry()

    def launch(target: str) -> str:
        """Launch something.

        Args:
            target: What to launch.
        """
        launched.append(target)
        return "launched"

    registry.register(launch, policy="deny")
    return registry


@pytest.mark.parametrize("where", ["registry", "policies"])
async def test_a_deny_tool_is_refused_and_never_run(root: Path, where: str) -> None:
    launched: list[str] = []
    tools = _launch_tools(launched)
    policies = None
    if where == "policies":  # the registry allows it, the agent's policies forbid it
        tools = tools.with_policies({"launch": "auto"})
        policies = {"launch": "deny"}
    host = MemoryHost()
    host.send("Launch")
    attempt = call("launch", {"target": "rocket"})
    provider = ScriptedProvider([tool_reply(attempt), text_reply("I can't.")])

    outcome = await make_loop(host, provider, root, tools=tools, policies=policies).run()

    assert outcome.text == "I can't."
    assert launched == []
    assert "launch" not in tool_names(provider.stream_requests[0])
    assert not host.events_of(ev.ToolStart) and not host.suspensions
    [ended] = host.events_of(ev.ToolEnd)
    assert ended.status == "failed" and "not available" in ended.output
    assert provider.stream_requests[1].messages[-1].content == ended.output


async def test_a_mixed_batch_suspends_before_running_either_call(root: Path) -> None:
    calc = call("calculator", {"expression": "1+1"})
    write = write_call(content="mixed")
    host, provider = await suspend_on(root, calc, write)

    [suspension] = host.suspensions
    assert suspension.pending == [write]
    assert suspension.message.tool_calls == [calc, write]
    assert host.channels.context[-1].tool_calls == [calc, write]  # no result for either yet
    assert not host.events_of(ev.ToolStart) and not host.events_of(ev.ToolEnd)
    assert not (root / "notes.md").exists()

    fresh, outcome = await resume(
        host, provider, root, {write.id: Decision(approved=True)}, text_reply("Both done.")
    )

    assert outcome.text == "Both done."
    assert [(e.call_id, e.status) for e in fresh.events_of(ev.ToolEnd)] == [
        (calc.id, "done"),
        (write.id, "done"),
    ]
    assert brief(fresh.channels.context)[2] == ("tool", "2", calc.id)
    assert (root / "notes.md").read_text() == "mixed"


# --- queued messages --------------------------------------------------------------------------


async def test_a_message_queued_mid_run_is_prefixed_for_the_model_only(root: Path) -> None:
    host = MemoryHost()
    first_seq = host.send("Compute 2+2")
    calc = call("calculator", {"expression": "2+2"})
    later: list[int] = []
    provider = ScriptedProvider(
        [
            [TextDelta("Checking."), lambda: later.append(host.send("and then 3+3"))]
            + tool_reply(calc, text="Checking."),
            text_reply("4, and 3+3 is 6."),
        ]
    )

    outcome = await make_loop(host, provider, root).run()

    assert outcome.text == "4, and 3+3 is 6."
    assert brief(provider.stream_requests[0].messages) == [("user", "Compute 2+2")]
    assert brief(provider.stream_requests[1].messages)[-1] == (
        "user",
        USER_APPENDED_PREFIX + "and then 3+3",
    )
    assert brief(host.channels.context) == [
        ("user", "Compute 2+2"),
        ("assistant", "Checking.", ("calculator",)),
        ("tool", "4", calc.id),
        ("user", "and then 3+3"),
        ("assistant", "4, and 3+3 is 6."),
    ]
    assert all(USER_APPENDED_PREFIX not in m.content for m in host.channels.display)
    assert [e.input_seq for e in host.events_of(ev.InputTaken)] == [first_seq, later[0]]
    assert host.persisted == host.channels.context


async def test_a_message_queued_during_the_final_answer_causes_another_round(root: Path) -> None:
    host = MemoryHost()
    host.send("Tell me a fact")
    provider = ScriptedProvider(
        [
            [TextDelta("Owls "), lambda: host.send("about cats"), end("Owls hoot.")],
            text_reply("Cats purr."),
        ]
    )

    outcome = await make_loop(host, provider, root).run()

    assert outcome.text == "Cats purr."
    assert [e.iteration for e in host.events_of(ev.IterationStart)] == [1, 2]
    assert provider.stream_requests[1].messages[-1].content == USER_APPENDED_PREFIX + "about cats"
    assert brief(host.channels.context) == [
        ("user", "Tell me a fact"),
        ("assistant", "Owls hoot."),
        ("user", "about cats"),
        ("assistant", "Cats purr."),
    ]


async def test_a_message_queued_on_the_last_round_stays_queued(root: Path) -> None:
    host = MemoryHost()
    host.send("Hi")
    provider = ScriptedProvider([[TextDelta("Hello"), lambda: host.send("more"), end("Hello")]])

    outcome = await make_loop(host, provider, root, max_rounds=1).run()

    # No round is left to answer it: the reply stands and the message waits for the next run.
    assert outcome == LoopOutcome("completed", text="Hello", usage=Usage(11, 7))
    assert [q.text for q in host.queue] == ["more"]
    assert brief(host.channels.context) == [("user", "Hi"), ("assistant", "Hello")]


# --- how a run ends ---------------------------------------------------------------------------


async def test_running_out_of_rounds_ends_with_a_note(root: Path) -> None:
    host = MemoryHost()
    host.send("Loop forever")
    provider = ScriptedProvider(
        [tool_reply(call("calculator", {"expression": "1"})) for _ in range(2)]
    )

    outcome = await make_loop(host, provider, root, max_rounds=2).run()

    note = "Stopped after 2 steps without a final answer."
    assert outcome.status == "completed" and outcome.text == note
    assert brief(host.channels.context)[-1] == ("assistant", note)
    assert provider.remaining == 0
    assert [e.iteration for e in host.events_of(ev.IterationStart)] == [1, 2]
    assert_groups_contiguous(host.channels.context, allow_open_tail=False)


async def test_a_reply_cut_at_the_length_limit_gets_a_note(root: Path) -> None:
    host = MemoryHost()
    host.send("Write a lot")
    provider = ScriptedProvider([text_reply("Once upon a", finish_reason="length")])

    outcome = await make_loop(host, provider, root).run()

    expected = "Once upon a\n\n[The reply was cut off at the model's output limit.]"
    assert outcome.text == expected
    assert host.channels.context[-1].content == expected


async def test_cancelling_stops_at_once_and_keeps_the_partial_text(root: Path) -> None:
    host = MemoryHost()
    host.send("Tell a long story")
    streamed, never = asyncio.Event(), asyncio.Event()

    async def hang() -> None:
        streamed.set()
        await never.wait()

    provider = ScriptedProvider([[TextDelta("Once "), TextDelta("upon"), hang, end("x")]])
    loop = make_loop(host, provider, root)
    task = asyncio.create_task(loop.run())
    await streamed.wait()

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert loop.partial_text == "Once upon"
    assert brief(host.channels.context) == [("user", "Tell a long story")]


async def test_a_provider_error_propagates_with_the_partial_text(root: Path) -> None:
    host = MemoryHost()
    host.send("Go")
    failure = ProviderError(ErrorCategory.PROVIDER_ERROR, streamed=True)
    provider = ScriptedProvider([[TextDelta("Part "), TextDelta("one"), failure]])
    loop = make_loop(host, provider, root)

    with pytest.raises(ProviderError) as caught:
        await loop.run()

    assert caught.value is failure
    assert loop.partial_text == "Part one"
    assert brief(host.persisted) == [("user", "Go")]  # the drained message was kept


async def test_orphans_in_the_history_are_not_sent(root: Path) -> None:
    abandoned = call("read_file", {"path": "x"})
    history = [
        user("q1"),
        assistant("Let me check.", tool_calls=[abandoned]),  # an interrupted run's call
        tool_result("ghost", "a result without its call"),
    ]
    host = MemoryHost(history)
    host.send("q2")
    provider = ScriptedProvider([text_reply("a2")])

    await make_loop(host, provider, root).run()

    assert brief(provider.stream_requests[0].messages) == [
        ("user", "q1"),
        ("assistant", "Let me check."),
        ("user", "q2"),
    ]


# --- compaction -------------------------------------------------------------------------------


async def test_micro_compact_shrinks_old_results_in_the_request_only(root: Path) -> None:
    old, new = call("read_file", {"path": "a"}), call("read_file", {"path": "b"})
    big_old, big_new = "A" * 2000, "B" * 2000
    history = [
        user("q1"),
        assistant("", tool_calls=[old]),
        tool_result(old.id, big_old),
        assistant("a1"),
        user("q2"),
        assistant("", tool_calls=[new]),
        tool_result(new.id, big_new),
        assistant("a2"),
    ]
    host = MemoryHost(history)
    host.send("q3")
    provider = ScriptedProvider([text_reply("a3")])

    await make_loop(host, provider, root, keep_recent=1).run()

    sent = provider.stream_requests[0].messages
    assert sent[2].content == "[Previous: used read_file]"
    assert sent[6].content == big_new
    assert host.channels.context[2].content == big_old
    assert host.persisted[2].content == big_old


def long_history(pairs: int = 6, size: int = 400) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for n in range(1, pairs + 1):
        messages += [user(f"q{n} " + "y" * size), assistant(f"a{n} " + "z" * size)]
    return messages


SMALL_WINDOW = 2000  # history budget 1,350 tokens; auto compaction past 1,080


async def test_auto_compaction_replaces_context_with_a_summary(root: Path) -> None:
    history = long_history()
    host = MemoryHost(history)
    host.send("q7")
    provider = ScriptedProvider([[end("SUMMARY OF EVERYTHING", usage=Usage(100, 20))]])
    provider.add(text_reply("a7"))

    outcome = await make_loop(host, provider, root, context_window=SMALL_WINDOW).run()

    kind, summary_request = provider.calls[0]
    assert kind == "complete"
    [prompt] = summary_request.messages
    assert prompt.role == Role.USER and prompt.content.startswith(compact.SUMMARY_INSTRUCTIONS)
    assert "q1 yyy" in prompt.content
    assert summary_request.tools == [] and summary_request.thinking is False
    assert summary_request.max_tokens == compact.SUMMARY_MAX_OUTPUT_TOKENS

    [restored] = host.restores
    before = len(history) + 1
    q7 = user("q7", extra={"input_seq": 13})
    assert restored == compact.compacted_context(history + [q7], "SUMMARY OF EVERYTHING")
    assert [m.content for m in restored[:5]] == [m.content for m in (history + [user("q7")])[-9::2]]
    assert host.channels.context == restored + [assistant("a7")]
    assert host.persisted == host.channels.context
    assert provider.stream_requests[0].messages == restored
    assert len(host.channels.display) == before + 1  # people still see every message

    types = host.event_types
    assert types.index("compacting") < types.index("compacted") < types.index("context_usage")
    [compacted] = host.events_of(ev.Compacted)
    assert (compacted.messages_before, compacted.summary) == (before, "SUMMARY OF EVERYTHING")
    assert outcome.usage == Usage(111, 27)  # the summary request counts too


async def test_a_pre_auto_compact_stop_skips_compaction(root: Path) -> None:
    hooks = HookRegistry()
    hooks.register(HookEvent.PRE_AUTO_COMPACT, lambda ctx: HookResult(action="stop"))
    host = MemoryHost(long_history())
    host.send("q7")
    provider = ScriptedProvider([text_reply("a7")])

    await make_loop(host, provider, root, context_window=SMALL_WINDOW, hooks=hooks).run()

    assert [kind for kind, _ in provider.calls] == ["stream"]
    assert not host.restores and not host.events_of(ev.Compacting)
    assert len(provider.stream_requests[0].messages) == 13


async def test_protected_context_from_the_pre_hook_reaches_the_summary_prompt(root: Path) -> None:
    hooks = HookRegistry()
    hooks.register(
        HookEvent.PRE_AUTO_COMPACT, lambda ctx: HookResult(additional_context="KEEP: the API key")
    )
    host = MemoryHost(long_history())
    host.send("q7")
    provider = ScriptedProvider([[end("summary")], text_reply("a7")])

    await make_loop(host, provider, root, context_window=SMALL_WINDOW, hooks=hooks).run()

    prompt = provider.complete_requests[0].messages[0].content
    assert prompt.endswith(f"{compact.PROTECTED_CONTEXT_HEADER}\nKEEP: the API key")


async def test_a_post_auto_compact_hook_can_replace_the_result(root: Path) -> None:
    replacement = [user("replaced history")]

    async def replace(ctx: HookContext) -> HookResult:
        assert ctx.messages is not None and ctx.messages[-1].content.endswith("summary")
        return HookResult(messages=replacement)

    hooks = HookRegistry()
    hooks.register(HookEvent.POST_AUTO_COMPACT, replace)
    host = MemoryHost(long_history())
    host.send("q7")
    provider = ScriptedProvider([[end("summary")], text_reply("a7")])

    await make_loop(host, provider, root, context_window=SMALL_WINDOW, hooks=hooks).run()

    assert host.restores == [replacement]
    assert brief(host.channels.context) == [("user", "replaced history"), ("assistant", "a7")]
    assert provider.stream_requests[0].messages == replacement


async def test_a_failed_summary_leaves_the_list_uncompacted(root: Path) -> None:
    history = long_history()
    host = MemoryHost(history)
    host.send("q7")
    provider = ScriptedProvider([ProviderError(ErrorCategory.UNREACHABLE), text_reply("a7")])

    outcome = await make_loop(host, provider, root, context_window=SMALL_WINDOW).run()

    assert outcome.text == "a7"
    assert not host.restores and not host.events_of(ev.Compacted)
    assert provider.stream_requests[0].messages == history + [user("q7", extra={"input_seq": 13})]
    assert host.channels.context == history + [user("q7", extra={"input_seq": 13}), assistant("a7")]


async def test_compact_now_takes_the_same_path(root: Path) -> None:
    history = [user("hello"), assistant("hi"), user("bye"), assistant("ciao")]
    host = MemoryHost(history)
    provider = ScriptedProvider([[end("manual summary")]])
    loop = make_loop(host, provider, root)

    assert await loop.compact_now() is True

    expected = compact.compacted_context(history, "manual summary")
    assert host.restores == [expected]
    assert host.channels.context == expected
    assert host.persisted == expected
    assert [e.type for e in host.events] == ["compacting", "compacted"]
    assert host.events_of(ev.Compacted)[0].messages_before == 4
    assert await make_loop(MemoryHost(), provider, root).compact_now() is False


# --- hooks ------------------------------------------------------------------------------------


async def test_pre_llm_request_can_replace_the_prompt_and_inject_for_the_whole_run(
    root: Path,
) -> None:
    seen_prompts: list[str | None] = []

    def remind(ctx: HookContext) -> HookResult:
        seen_prompts.append(ctx.system_prompt)
        if len(seen_prompts) > 1:  # inject once; it must stay for later rounds
            return HookResult(system_prompt="Be brief.")
        return HookResult(system_prompt="Be brief.", inject_messages=[user("<reminder/>")])

    hooks = HookRegistry()
    hooks.register(HookEvent.PRE_LLM_REQUEST, remind)
    host = MemoryHost(prompt="Original.")
    host.send("Add 1+1")
    calc = call("calculator", {"expression": "1+1"})
    provider = ScriptedProvider([tool_reply(calc), text_reply("2")])

    await make_loop(host, provider, root, hooks=hooks).run()

    assert seen_prompts == ["Original.", "Original."]
    first, second = provider.stream_requests
    assert first.system_prompt == second.system_prompt == "Be brief."
    assert brief(first.messages) == [("user", "Add 1+1"), ("user", "<reminder/>")]
    assert ("user", "<reminder/>") in brief(second.messages)
    assert all(m.content != "<reminder/>" for m in host.channels.context + host.channels.display)


async def test_pre_llm_request_stop_fails_the_run(root: Path) -> None:
    hooks = HookRegistry()
    hooks.register(HookEvent.PRE_LLM_REQUEST, lambda ctx: HookResult(action="stop"))
    host = MemoryHost()
    host.send("Hi")
    provider = ScriptedProvider([text_reply("never")])

    with pytest.raises(ProviderError) as caught:
        await make_loop(host, provider, root, hooks=hooks).run()

    assert caught.value.category is ErrorCategory.BAD_REQUEST
    assert provider.calls == []


async def test_post_tool_execution_can_rewrite_a_result(root: Path) -> None:
    hooks = HookRegistry()
    seen: list[tuple[str | None, str | None]] = []

    def redact(ctx: HookContext) -> HookResult:
        seen.append((ctx.tool_name, ctx.tool_result))
        return HookResult(tool_result="[redacted]")

    hooks.register(HookEvent.POST_TOOL_EXECUTION, redact)
    host = MemoryHost()
    host.send("Compute")
    calc = call("calculator", {"expression": "6*7"})
    provider = ScriptedProvider([tool_reply(calc), text_reply("Done.")])

    await make_loop(host, provider, root, hooks=hooks).run()

    assert seen == [("calculator", "42")]
    assert host.channels.context[2].content == "[redacted]"
    assert host.channels.display[2].content == "[redacted]"
    assert host.events_of(ev.ToolEnd)[0].output == "[redacted]"
    assert provider.stream_requests[1].messages[-1].content == "[redacted]"


# --- delegate ---------------------------------------------------------------------------------


def delegate_call(task: str = "compute 2+2", label: str = "math") -> Any:
    return call(DELEGATE, {"task": task, "label": label})


async def test_delegate_runs_a_sub_agent_and_holds_its_messages_back(root: Path) -> None:
    host = MemoryHost()
    host.on_commit.append(
        lambda h: assert_groups_contiguous(h.channels.context, allow_open_tail=True)
    )
    host.send("Ask a helper")
    hand = delegate_call()
    sub_calc = call("calculator", {"expression": "2+2"})
    provider = ScriptedProvider(
        [
            tool_reply(hand),
            [end("Working on it.", finish_reason="tool_calls", calls=[sub_calc])],
            [end("The answer is 4.")],
            text_reply("The helper says 4."),
        ]
    )

    outcome = await make_loop(host, provider, root, policies={DELEGATE: "auto"}).run()

    assert outcome.text == "The helper says 4."
    assert [kind for kind, _ in provider.calls] == ["stream", "complete", "complete", "stream"]
    assert DELEGATE in tool_names(provider.stream_requests[0])
    first_sub, second_sub = provider.complete_requests
    assert first_sub.system_prompt == SUB_AGENT_PROMPT
    assert brief(first_sub.messages) == [("user", "compute 2+2")]
    assert sorted(tool_names(first_sub)) == sorted(AUTO_BUILTINS)
    assert brief(second_sub.messages)[1:] == [
        ("assistant", "Working on it.", ("calculator",)),
        ("tool", "4", sub_calc.id),
    ]

    sender = "SubAgent@math"
    assert brief(host.channels.context) == [
        ("user", "Ask a helper"),
        ("assistant", "", (DELEGATE,)),
        ("tool", "The answer is 4.", hand.id),
        ("assistant", f"<{sender}>Working on it.</{sender}>", sender),
        ("assistant", f"<{sender}>[called tool calculator]</{sender}>", sender),
        ("assistant", f"<{sender}>The answer is 4.</{sender}>", sender),
        ("assistant", "The helper says 4."),
    ]
    # Display shows the sub-agent's work as it happens, before the delegate result.
    assert brief(host.channels.display) == [
        ("user", "Ask a helper"),
        ("assistant", "", (DELEGATE,)),
        ("assistant", "Working on it.", sender),
        ("assistant", "", ("calculator",), sender),
        ("tool", "4", sub_calc.id, sender),
        ("assistant", "The answer is 4.", sender),
        ("tool", "The answer is 4.", hand.id),
        ("assistant", "The helper says 4."),
    ]
    assert host.persisted == host.channels.context
    # The sub-agent's text was on screen while the delegate call was still open.
    shown_early = next(
        c for c in host.commits if ("assistant", "Working on it.", sender) in brief(c.display)
    )
    assert open_tool_call_ids(shown_early.context) == {hand.id}

    types = host.event_types
    assert (
        types.index("tool_start")
        < types.index("hand_start")
        < types.index("subtask_status")
        < types.index("hand_end")
        < types.index("tool_end")
    )
    [hand_start] = host.events_of(ev.HandStart)
    assert (hand_start.name, hand_start.label, hand_start.params) == (
        DELEGATE,
        "math",
        {"task": "compute 2+2"},
    )
    assert [(s.task_id, s.status) for s in host.events_of(ev.SubtaskStatus)] == [
        (hand.id, "running"),
        (hand.id, "completed"),
    ]
    assert host.events_of(ev.HandEnd)[0].result == "The answer is 4."
    assert host.events_of(ev.ToolEnd)[0].status == "done"
    assert outcome.usage == Usage(44, 28)  # the sub-agent's requests count for the run


async def test_a_sub_agent_cannot_use_a_tool_that_needs_approval(root: Path) -> None:
    host = MemoryHost()
    host.send("Delegate a write")
    hand = delegate_call("write notes", "writer")
    sub_write = write_call(content="sneaky")
    provider = ScriptedProvider(
        [
            tool_reply(hand),
            [end("", finish_reason="tool_calls", calls=[sub_write])],
            [end("I could not write it.")],
            text_reply("I'll write it myself then."),
        ]
    )

    await make_loop(host, provider, root, policies={DELEGATE: "auto"}).run()

    assert not (root / "notes.md").exists()
    assert not host.suspensions
    refusal = provider.complete_requests[1].messages[-1]
    assert refusal.role == Role.TOOL and "needs the user's approval" in refusal.content
    assert host.channels.context[2].content == "I could not write it."


async def test_a_sub_agent_failure_is_an_error_result_and_the_parent_goes_on(root: Path) -> None:
    host = MemoryHost()
    host.send("Delegate")
    hand = delegate_call()
    provider = ScriptedProvider(
        [
            tool_reply(hand),
            ProviderError(ErrorCategory.UNREACHABLE, "no route"),
            text_reply("The helper failed, so here is my own answer."),
        ]
    )

    outcome = await make_loop(host, provider, root, policies={DELEGATE: "auto"}).run()

    assert outcome.text == "The helper failed, so here is my own answer."
    [ended] = host.events_of(ev.ToolEnd)
    assert (ended.status, ended.output) == ("failed", "Sub-agent failed: no route")
    assert host.events_of(ev.SubtaskStatus)[-1].status == "failed"
    assert provider.stream_requests[1].messages[-1].content == "Sub-agent failed: no route"


async def test_delegate_is_not_offered_without_a_policy(root: Path) -> None:
    host = MemoryHost()
    host.send("Delegate")
    hand = delegate_call()
    provider = ScriptedProvider([tool_reply(hand), text_reply("OK.")])

    await make_loop(host, provider, root).run()

    assert DELEGATE not in tool_names(provider.stream_requests[0])
    assert not host.events_of(ev.HandStart)
    assert "not available" in host.events_of(ev.ToolEnd)[0].output


# --- property: tool groups stay whole -----------------------------------------------------------

DECISIONS = {
    "approve": Decision(approved=True),
    "deny": Decision(approved=False, reason="no"),
    "expire": Decision(approved=False, expired=True),
}
steps = st.lists(
    st.one_of(
        st.just(("text",)),
        st.just(("text_queue",)),
        st.just(("calc",)),
        st.just(("delegate",)),
        st.tuples(st.sampled_from(["write", "mixed"]), st.sampled_from(sorted(DECISIONS))),
        st.tuples(st.just("error"), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=8,
)


class Session:
    """Plays a script of steps through as many runs as it takes (turns, resumes, retries)."""

    def __init__(self, script: list[tuple[Any, ...]], root: Path) -> None:
        self.root = root
        self.host = MemoryHost()
        self.host.on_commit.append(self.check_commit)
        self.hosts: list[MemoryHost] = []
        self.sent: list[str] = []
        self.decisions: dict[str, Decision] = {}
        self.partials: dict[ProviderError, str] = {}  # the text streamed before each error
        self.provider = ScriptedProvider()
        for step in script:
            self.provider.add(*self.responses(step))
        self.provider.add(text_reply("bye"))

    def send(self, text: str) -> None:
        self.sent.append(text)
        self.host.send(text)

    def responses(self, step: tuple[Any, ...]) -> list[Any]:
        kind = step[0]
        if kind == "text":
            return [text_reply("plain answer")]
        if kind == "text_queue":
            return [[TextDelta("first"), lambda: self.send(f"late {len(self.sent)}"), end("first")]]
        if kind == "calc":
            return [tool_reply(call("calculator", {"expression": "3*3"}))]
        if kind in ("write", "mixed"):
            write = write_call(content="prop")
            self.decisions[write.id] = DECISIONS[step[1]]
            if kind == "mixed":  # an AUTO call and an ASK call in one batch
                return [tool_reply(call("calculator", {"expression": "5"}), write)]
            return [tool_reply(write)]
        if kind == "delegate":
            sub_calc = call("calculator", {"expression": "1+2"})
            return [
                tool_reply(delegate_call()),
                [end("sub working", finish_reason="tool_calls", calls=[sub_calc])],
                [end("sub done")],
            ]
        chunks: list[Any] = [TextDelta("ab") for _ in range(step[1])]
        error = ProviderError(ErrorCategory.PROVIDER_ERROR, streamed=bool(chunks))
        self.partials[error] = "ab" * step[1]
        return [chunks + [error]]

    @staticmethod
    def check_commit(host: MemoryHost) -> None:
        assert_groups_contiguous(host.channels.context, allow_open_tail=True)
        assert_groups_contiguous(host.persisted, allow_open_tail=False)

    async def play(self) -> None:
        self.send("start")
        resume = None
        first_iteration = 1
        while self.provider.remaining:
            host = self.host
            self.hosts.append(host)
            loop = make_loop(
                host, self.provider, self.root, max_rounds=4, policies={"delegate": "auto"}
            )
            try:
                outcome = await loop.run(resume, first_iteration=first_iteration)
            except ProviderError as error:
                assert loop.partial_text == self.partials[error]
                self.host, resume, first_iteration = host.resumed(), None, 1
                self.send("again")
                continue
            if outcome.status == "suspended":
                suspension = host.suspensions[-1]
                # Nothing ran: the whole group is open, live only, and not persisted.
                assert host.channels.context[-1] == suspension.message
                all_calls = {c.id for c in suspension.message.tool_calls or []}
                assert open_tool_call_ids(host.channels.context) == all_calls
                assert suspension.message not in host.persisted
                decisions = {c.id: self.decisions[c.id] for c in suspension.pending}
                resume = (suspension.message, decisions)
                first_iteration = host.events_of(ev.IterationStart)[-1].iteration + 1
                self.host = host.resumed()
                continue
            assert host.persisted == host.channels.context
            assert_groups_contiguous(host.channels.context, allow_open_tail=False)
            self.host, resume, first_iteration = host.resumed(), None, 1
            self.send("next")
        # Every ASK call was answered: run only when approved, else refused.
        ended = {e.call_id: e.status for h in self.hosts for e in h.events_of(ev.ToolEnd)}
        for call_id, decision in self.decisions.items():
            assert ended[call_id] == ("done" if decision.approved else "denied")
        # Every message the user sent reached context once, or still waits in the queue.
        users = [m.content for m in self.host.persisted if m.role == Role.USER]
        assert sorted(users + [q.text for q in self.host.queue]) == sorted(self.sent)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=steps)
def test_tool_groups_are_never_split_and_always_answered_once(script) -> None:
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(Session(script, Path(folder)).play())


async def test_the_fake_provider_records_copies_of_what_was_sent() -> None:
    provider = ScriptedProvider([text_reply("x")])
    messages = [user("a")]
    async for _ in provider.stream(ChatRequest(model="m", messages=messages)):
        pass
    messages.append(user("b"))  # the loop keeps appending to the list it sent
    assert provider.requests[0].messages == [user("a")]
    with pytest.raises(ScriptExhausted):
        await provider.complete(ChatRequest(model="m", messages=messages))


async def test_compaction_keeps_a_mid_run_message_as_the_user_wrote_it(root: Path) -> None:
    host = MemoryHost()
    host.send("add 1+1")
    big = "please also consider this " + "x" * 6000
    provider = ScriptedProvider(
        [
            [lambda: host.send(big), *tool_reply(call("calculator", {"expression": "1+1"}))],
            [end("SUMMARY")],
            text_reply("done"),
        ]
    )

    await make_loop(host, provider, root, context_window=SMALL_WINDOW).run()

    # The model saw the appended message marked as such, before compaction...
    assert [kind for kind, _ in provider.calls] == ["stream", "complete", "stream"]
    [restored] = host.restores
    kept = [m.content for m in restored if m.role == Role.USER]
    # ...but the stored context keeps what the user wrote, unprefixed.
    assert kept == ["add 1+1", big]
