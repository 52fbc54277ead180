"""The offline demo model: triggers, determinism, tool results, failures, modes, streaming."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from chat.core.compact import build_summary_request
from chat.core.messages import ChatMessage, ToolCall, assistant, tool_result, user
from chat.core.prompts import EXPIRED_TEXT, SUB_AGENT_PROMPT, denied_text
from chat.llm.demo import DemoProvider, split_into_chunks
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    ProviderError,
    ReasoningDelta,
    StreamChunk,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
)

TOOL_PARAMETERS: dict[str, list[str]] = {
    "calculator": ["expression"],
    "current_time": [],
    "write_file": ["path", "content"],
    "edit_file": ["path", "old", "new"],
    "read_file": ["path"],
    "list_files": [],
    "delegate": ["task", "label"],
}


def spec(name: str, params: list[str]) -> dict[str, Any]:
    properties = {p: {"type": "string"} for p in params}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": properties, "required": params},
        },
    }


ALL_TOOLS = [spec(name, params) for name, params in TOOL_PARAMETERS.items()]


def request(
    *messages: ChatMessage,
    tools: list[dict[str, Any]] | None = None,
    system_prompt: str = "",
    thinking: bool = True,
    model: str = "demo",
) -> ChatRequest:
    return ChatRequest(
        model=model,
        messages=list(messages),
        system_prompt=system_prompt,
        tools=ALL_TOOLS if tools is None else tools,
        thinking=thinking,
    )


async def collect(req: ChatRequest, provider: DemoProvider | None = None) -> list[StreamChunk]:
    provider = provider or DemoProvider(token_delay=0)
    return [chunk async for chunk in provider.stream(req)]


async def run(req: ChatRequest, provider: DemoProvider | None = None) -> StreamEnd:
    chunks = await collect(req, provider)
    end = chunks[-1]
    assert isinstance(end, StreamEnd)
    assert all(not isinstance(c, StreamEnd) for c in chunks[:-1])
    return end


def joined(chunks: list[StreamChunk], kind: type[TextDelta] | type[ReasoningDelta]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


def sentences(text: str) -> int:
    return len(re.findall(r"[.!?](?:\s|$)", text.strip()))


def after_tool(
    request_text: str, name: str, arguments: dict[str, Any], result: str
) -> list[ChatMessage]:
    call = ToolCall(id="call_1", name=name, arguments=json.dumps(arguments))
    return [user(request_text), assistant("", tool_calls=[call]), tool_result("call_1", result)]


# --- triggers that call a tool ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "expected"),
    [
        ("calculate 12*7 for me", "calculator", {"expression": "12*7"}),
        ("calc (3+4)/2", "calculator", {"expression": "(3+4)/2"}),
        ("what is 12*7?", "calculator", {"expression": "12*7"}),
        ("Calculate sqrt(16)", "calculator", {"expression": "sqrt(16)"}),
        ("What TIME is it?", "current_time", {}),
        ("edit file report.md", "edit_file", {"path": "report.md", "old": "Status: draft", "new": "Status: final"}),
        ("edit a file", "edit_file", {"path": "notes.md", "old": "Status: draft", "new": "Status: final"}),
        ("read file report.md", "read_file", {"path": "report.md"}),
        ("please list files", "list_files", {}),
        ("delegate: find tide tables", "delegate", {"task": "find tide tables", "label": "find-tide-tables"}),
        ("Ask a sub-agent to summarise Hamlet", "delegate", {"task": "summarise Hamlet", "label": "summarise-hamlet"}),
        ("[User appended] calculate 2+2", "calculator", {"expression": "2+2"}),
        ("what's 2+2+ ?", "calculator", {"expression": "2+2"}),
    ],
)  # fmt: skip
async def test_keyword_calls_the_tool_with_json_arguments(
    text: str, name: str, expected: dict[str, Any]
) -> None:
    chunks = await collect(request(user(text)))
    started = [c for c in chunks if isinstance(c, ToolCallStarted)]
    end = chunks[-1]
    assert isinstance(end, StreamEnd)
    assert len(started) == 1 and started[0].index == 0 and started[0].name == name
    assert re.fullmatch(r"call_demo_[0-9a-f]{8}", started[0].id)
    assert end.finish_reason == "tool_calls"
    assert [(c.id, c.name) for c in end.tool_calls] == [(started[0].id, name)]
    assert json.loads(end.tool_calls[0].arguments) == expected
    # Reasoning first, then the call; no answer text with a tool call.
    assert isinstance(chunks[0], ReasoningDelta)
    assert end.text == "" and joined(chunks, TextDelta) == ""


@pytest.mark.parametrize(
    ("text", "path"),
    [("please write file report.md", "report.md"), ("write a file about cats", "notes.md")],
)
async def test_write_file_sends_a_markdown_draft_mentioning_the_request(
    text: str, path: str
) -> None:
    end = await run(request(user(text)))
    assert end.tool_calls[0].name == "write_file"
    arguments = json.loads(end.tool_calls[0].arguments)
    assert arguments["path"] == path
    assert arguments["content"].startswith("# ")
    assert "Status: draft" in arguments["content"]
    assert text in arguments["content"]


async def test_delegate_without_a_task_uses_a_default_research_task() -> None:
    end = await run(request(user("delegate")))
    arguments = json.loads(end.tool_calls[0].arguments)
    assert arguments["label"] == "research"
    assert "Research" in arguments["task"]


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("calculate 2+2 and tell me the time", "calculator"),
        ("what time should I write a file", "current_time"),
        ("write a file with some code", "write_file"),
        ("read file a.md and delegate", "read_file"),
    ],
)
async def test_the_first_rule_in_the_table_wins(text: str, name: str) -> None:
    end = await run(request(user(text)))
    assert [c.name for c in end.tool_calls] == [name]


async def test_a_tool_that_is_not_offered_is_not_called() -> None:
    offered_elsewhere = [spec("current_time", [])]
    chunks = await collect(request(user("calculate 1+1"), tools=offered_elsewhere))
    end = chunks[-1]
    assert isinstance(end, StreamEnd)
    assert not any(isinstance(c, ToolCallStarted) for c in chunks)
    assert end.finish_reason == "stop" and end.tool_calls == []
    assert "`calculator`" in end.text and "not available" in end.text


async def test_arguments_follow_the_property_names_of_the_offered_spec() -> None:
    edit = spec("edit_file", ["file_path", "old_string", "new_string"])
    end = await run(request(user("edit file a.md"), tools=[edit]))
    assert json.loads(end.tool_calls[0].arguments) == {
        "file_path": "a.md",
        "old_string": "Status: draft",
        "new_string": "Status: final",
    }


# --- triggers that answer in text --------------------------------------------------------


async def test_code_answer_has_a_python_and_a_bash_block() -> None:
    end = await run(request(user("show me some code")))
    python = re.search(r"```python\n(.*?)\n```", end.text, re.S)
    bash = re.search(r"```bash\n(.*?)\n```", end.text, re.S)
    assert python and bash
    assert 8 <= len(python[1].splitlines()) <= 14
    assert "def top_words" in python[1]
    assert end.text.split("```")[0].strip()  # explanatory text before the first block
    assert end.finish_reason == "stop" and end.tool_calls == []


async def test_long_answer_is_long_with_paragraphs_and_a_list() -> None:
    end = await run(request(user("give me a long answer")))
    assert len(end.text.split()) >= 700
    assert end.text.count("\n\n") >= 8
    assert len(re.findall(r"^- ", end.text, re.M)) >= 5


async def test_xss_answer_contains_the_corpus() -> None:
    end = await run(request(user("show me the XSS test")))
    for payload in [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        "[click](javascript:alert(1))",
        "<svg onload=alert(1)>",
        '<iframe src="javascript:alert(1)">',
        "![tracker](http://example.invalid/pixel.png)",
        '<a href="#" onclick="alert(1)">x</a>',
        "<style>",
        'onmouseover="alert(1)")',
    ]:
        assert payload in end.text


async def test_markdown_answer_uses_the_common_constructs() -> None:
    text = (await run(request(user("show markdown please")))).text
    assert re.search(r"^# ", text, re.M) and re.search(r"^## ", text, re.M)
    assert re.search(r"^\| --- \|", text, re.M)  # a table
    assert re.search(r"^- ", text, re.M) and re.search(r"^1\. ", text, re.M)
    assert "**Bold**" in text and "*Italic*" in text
    assert re.search(r"^> ", text, re.M)
    assert re.search(r"`[^`]+`", text)


async def test_default_answer_quotes_the_user_and_suggests_keywords() -> None:
    end = await run(request(user("Tell me about the weather in Lisbon")))
    assert "Tell me about the weather in Lisbon" in end.text
    assert 2 <= sentences(end.text) <= 4
    assert len(re.findall(r"“[^”]+”", end.text)) >= 4  # the quote and three suggestions
    assert end.finish_reason == "stop"


async def test_empty_conversation_gets_a_greeting() -> None:
    end = await run(request())
    assert end.text.startswith("Hello!") and end.finish_reason == "stop"


# --- determinism, thinking, usage --------------------------------------------------------


@pytest.mark.parametrize("text", ["hello there", "calculate 3*3", "write a file", "long", "xss"])
async def test_same_request_gives_the_same_chunks(text: str) -> None:
    first = await collect(request(user(text)), DemoProvider(token_delay=0))
    second = await collect(request(user(text)), DemoProvider(token_delay=0, chunk_words=1))
    assert first == second


async def test_different_requests_get_different_tool_call_ids() -> None:
    one = await run(request(user("calculate 1+1")))
    two = await run(request(user("calculate 1+2")))
    assert one.tool_calls[0].id != two.tool_calls[0].id


async def test_thinking_false_streams_no_reasoning_and_the_same_text() -> None:
    with_thinking = await collect(request(user("hello there")))
    without = await collect(request(user("hello there"), thinking=False))
    assert not any(isinstance(c, ReasoningDelta) for c in without)
    end, thinking_end = without[-1], with_thinking[-1]
    assert isinstance(end, StreamEnd) and isinstance(thinking_end, StreamEnd)
    assert end.reasoning == "" and end.text == thinking_end.text
    assert 2 <= sentences(thinking_end.reasoning) <= 3


async def test_usage_counts_input_chars_and_streamed_words() -> None:
    text = "hello there, how are you today?"
    chunks = await collect(request(user(text), system_prompt="Be nice."))
    end = chunks[-1]
    assert isinstance(end, StreamEnd) and end.usage is not None
    assert end.usage.input_tokens == (len(text) + len("Be nice.")) // 4
    assert end.usage.output_tokens == len(chunks) - 1
    assert end.usage.estimated is False


async def test_chunk_words_groups_words_per_delta() -> None:
    chunks = await collect(request(user("long")), DemoProvider(token_delay=0, chunk_words=3))
    deltas = [c.text for c in chunks if isinstance(c, TextDelta)]
    assert all(len(d.split()) <= 3 for d in deltas)
    assert sum(len(d.split()) == 3 for d in deltas) > len(deltas) // 2


async def test_models_name_and_settings() -> None:
    provider = DemoProvider("offline", token_delay=0.5, chunk_words=2)
    assert provider.name == "offline"
    assert await provider.list_models() == ["demo", "demo-fast"]
    with pytest.raises(ValueError):
        DemoProvider(token_delay=-1)
    with pytest.raises(ValueError):
        DemoProvider(chunk_words=0)


async def test_demo_fast_ignores_the_delay_and_streams_the_same_chunks() -> None:
    slow_provider = DemoProvider(token_delay=30)  # would time the test out if it slept
    fast = await asyncio.wait_for(
        collect(request(user("long"), model="demo-fast"), slow_provider), timeout=10
    )
    assert fast == await collect(request(user("long")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=300), chunk_words=st.integers(min_value=1, max_value=4))
def test_stream_end_equals_the_joined_deltas(text: str, chunk_words: int) -> None:
    assume(not re.search(r"\bfail\b", text, re.I))
    chunks = asyncio.run(
        collect(request(user(text)), DemoProvider(token_delay=0, chunk_words=chunk_words))
    )
    end = chunks[-1]
    assert isinstance(end, StreamEnd)
    assert end.text == joined(chunks, TextDelta)
    assert end.reasoning == joined(chunks, ReasoningDelta)
    assert end.reasoning  # thinking is on by default


@given(text=st.text(max_size=200), words=st.integers(min_value=1, max_value=5))
def test_split_into_chunks_keeps_every_character(text: str, words: int) -> None:
    chunks = split_into_chunks(text, words)
    assert "".join(chunks) == text
    assert all(len(c.split()) <= words for c in chunks)


# --- replies to tool results --------------------------------------------------------------


async def test_denial_reason_is_quoted_verbatim() -> None:
    reason = "I don't want files in my workspace today"
    messages = after_tool(
        "write file a.md",
        "write_file",
        {"path": "a.md", "content": "x"},
        denied_text(reason),
    )
    end = await run(request(*messages))
    assert end.text.startswith(
        f"Understood — I did not write the file because you denied it: {reason}."
    )
    assert end.finish_reason == "stop" and end.tool_calls == []


async def test_denial_without_a_reason() -> None:
    messages = after_tool(
        "calculate 1+1", "calculator", {"expression": "1+1"}, "The user DENIED this tool call."
    )
    end = await run(request(*messages))
    assert end.text.startswith("Understood — I did not run the calculation because you denied it.")


@settings(max_examples=40, deadline=None)
@given(reason=st.text(min_size=1, max_size=120).filter(lambda r: r.strip()))
def test_any_denial_reason_appears_verbatim(reason: str) -> None:
    messages = after_tool(
        "edit file a.md",
        "edit_file",
        {"path": "a.md"},
        denied_text(reason),
    )
    end = asyncio.run(run(request(*messages)))
    assert f"because you denied it: {reason.strip()}" in end.text


async def test_tool_error_is_reported_plainly() -> None:
    messages = after_tool(
        "read file x.md", "read_file", {"path": "x.md"}, "Error: x.md does not exist"
    )
    end = await run(request(*messages))
    assert end.text == (
        "The `read_file` tool reported an error, so that step did not work: x.md does not exist."
    )


async def test_expired_approval_is_not_mistaken_for_success() -> None:
    messages = after_tool("write a file", "write_file", {"path": "notes.md"}, EXPIRED_TEXT)
    end = await run(request(*messages))
    assert end.text.startswith("The approval request expired, so I did not write the file.")


async def test_after_compaction_it_answers_the_newest_user_message() -> None:
    compact = ToolCall(id="compact_9", name="compact", arguments='{"reason": "auto_compact"}')
    summary = "[Context compacted: 9 messages replaced by this summary]\n\n1. Primary Request: …"
    messages = [
        user("hello"),
        user("calculate 6*7"),
        assistant("", tool_calls=[compact]),
        tool_result("compact_9", summary),
    ]
    end = await run(request(*messages))
    assert [c.name for c in end.tool_calls] == ["calculator"]
    assert json.loads(end.tool_calls[0].arguments) == {"expression": "6*7"}


@pytest.mark.parametrize("result", ["84", "12*7 = 84", '{"result": 84}'])
async def test_calculator_result_is_reported(result: str) -> None:
    messages = after_tool("calculate 12*7", "calculator", {"expression": "12*7"}, result)
    end = await run(request(*messages))
    assert end.text == "The result is 84."
    assert end.finish_reason == "stop"


async def test_file_content_that_mentions_denied_is_not_a_denial() -> None:
    messages = after_tool(
        "read file log.txt", "read_file", {"path": "log.txt"}, "line one\naccess denied twice"
    )
    end = await run(request(*messages))
    assert end.text.startswith("Here is `log.txt`:")
    assert "```\nline one\naccess denied twice\n```" in end.text


async def test_write_then_read_chains_a_read_file_call() -> None:
    arguments = {"path": "plan.md", "content": "# Plan"}
    messages = after_tool("write file plan.md then read it", "write_file", arguments, "ok")
    end = await run(request(*messages))
    assert [c.name for c in end.tool_calls] == ["read_file"]
    assert json.loads(end.tool_calls[0].arguments) == {"path": "plan.md"}
    plain = after_tool("write file plan.md", "write_file", arguments, "ok")
    assert (await run(request(*plain))).text.startswith("Done — I wrote `plan.md`")


async def test_sub_agent_result_is_quoted_for_the_user() -> None:
    messages = after_tool(
        "delegate: tides", "delegate", {"task": "tides"}, "Sub-agent report: two tides a day."
    )
    end = await run(request(*messages))
    assert "> Sub-agent report: two tides a day." in end.text


# --- failures -------------------------------------------------------------------------------


async def test_fail_raises_before_any_chunk() -> None:
    received: list[StreamChunk] = []
    with pytest.raises(ProviderError) as raised:
        async for chunk in DemoProvider(token_delay=0).stream(request(user("please fail"))):
            received.append(chunk)
    assert received == []
    assert raised.value.category is ErrorCategory.PROVIDER_ERROR
    assert raised.value.streamed is False
    assert raised.value.message == "The demo model failed on request."


async def test_fail_midway_raises_after_some_text() -> None:
    received: list[StreamChunk] = []
    with pytest.raises(ProviderError) as raised:
        async for chunk in DemoProvider(token_delay=0).stream(request(user("fail midway"))):
            received.append(chunk)
    assert raised.value.category is ErrorCategory.PROVIDER_ERROR
    assert raised.value.streamed is True
    assert not any(isinstance(c, StreamEnd) for c in received)
    assert 15 <= len(joined(received, TextDelta).split()) <= 30


# --- sub-agent, compaction summary and persona modes -----------------------------------------


async def test_sub_agent_reports_in_two_sentences() -> None:
    end = await run(request(user("Find facts about tides"), system_prompt=SUB_AGENT_PROMPT))
    assert end.text.startswith("Sub-agent report:")
    assert "Find facts about tides" in end.text
    assert sentences(end.text) == 2
    assert end.tool_calls == []


async def test_sub_agent_calculates_then_reports() -> None:
    task = "Work out 6*7 for the lesson plan"
    first = await run(request(user(task), system_prompt=SUB_AGENT_PROMPT))
    assert json.loads(first.tool_calls[0].arguments) == {"expression": "6*7"}
    messages = after_tool(task, "calculator", {"expression": "6*7"}, "42")
    final = await run(request(*messages, system_prompt=SUB_AGENT_PROMPT))
    assert final.text == "Sub-agent report: The result is 42."


async def test_compaction_summary_names_the_first_user_messages() -> None:
    transcript = [
        user("Plan a field trip to the tide pools"),
        assistant("Sure, when?"),
        user('[User appended] Next Friday, say "low tide"'),
        assistant("Noted."),
    ]
    (prompt,) = build_summary_request(transcript)  # what the agent loop sends
    provider = DemoProvider(token_delay=30)  # complete() never sleeps
    end = await asyncio.wait_for(provider.complete(request(prompt, tools=[])), timeout=10)
    assert end.finish_reason == "stop" and end.tool_calls == []
    assert "1. Primary Request:" in end.text
    assert "Plan a field trip to the tide pools" in end.text
    assert '“Next Friday, say "low tide"”' in end.text  # without the queue mark
    assert "Messages summarised: 4." in end.text


async def test_complete_returns_what_the_stream_ends_with() -> None:
    for text in ["hello there", "calculate 5-1", "markdown"]:
        req = request(user(text))
        assert await DemoProvider(token_delay=30).complete(req) == await run(req)


@pytest.mark.parametrize(
    ("system_prompt", "name"),
    [
        ("Respond as the persona Ms. Rivera, the class teacher.", "Ms. Rivera"),
        ("Classroom chat. Respond as the persona Sam and keep it short.", "Sam"),
    ],
)
async def test_persona_answers_in_voice_about_the_last_message(
    system_prompt: str, name: str
) -> None:
    said = "Why is the sky blue at noon?"
    end = await run(request(user(said), system_prompt=system_prompt))
    assert name in end.text and said in end.text
    assert 1 <= sentences(end.text) <= 3
    assert end.finish_reason == "stop"


async def test_persona_does_not_call_tools() -> None:
    end = await run(request(user("calculate 2+2"), system_prompt="Respond as the persona Sam."))
    assert end.tool_calls == [] and "Sam" in end.text


# --- cancellation ---------------------------------------------------------------------------


async def test_cancelling_the_consumer_stops_the_stream_promptly() -> None:
    provider = DemoProvider(token_delay=0.05)
    received: list[StreamChunk] = []
    three_received = asyncio.Event()

    async def consume() -> None:
        async for chunk in provider.stream(request(user("long"))):
            received.append(chunk)
            if len(received) == 3:
                three_received.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(three_received.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=1.0)  # generous; it stops at the next await
    count_at_cancel = len(received)
    await asyncio.sleep(0.15)  # three more delays: nothing may arrive any more
    assert len(received) == count_at_cancel
    assert count_at_cancel < 10
    assert not any(isinstance(c, StreamEnd) for c in received)


async def test_a_tool_error_that_says_denied_is_an_error_not_a_denial() -> None:
    messages = after_tool(
        "read file a.md", "read_file", {"path": "a.md"}, "Error: PermissionError: access denied"
    )
    end = await run(request(*messages))
    assert end.text.startswith("The `read_file` tool reported an error")
