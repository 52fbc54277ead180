"""OpenAIProvider against a real HTTP server (tests/fakeopenai.py), plus its pure helpers."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from chat.core.messages import ToolCall, user
from chat.llm import httpclient, netbackend
from chat.llm.openai import OpenAIProvider, scrub_secret
from chat.llm.retry import (
    RETRY_AFTER_CAP,
    backoff_delay,
    classify_http_error,
    parse_retry_after,
)
from chat.llm.sse import encode_event
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    ProviderError,
    ReasoningDelta,
    Retrying,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)
from chat.llm.wire import ChunkEncoder
from tests.fakeopenai import FakeOpenAI, FakeToolCall, Script
from tests.llm.test_netbackend import certificate  # noqa: F401 - the fixture

API_KEY = "sk-lyceum-TESTKEY-7f3a9c2e1b4d8f60aa"
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


class FixedRandom:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


def request(text: str = "hi", **kw: Any) -> ChatRequest:
    return ChatRequest(model="fake-model", messages=[user(text)], **kw)


@pytest.fixture
async def provider(fake_openai: FakeOpenAI) -> AsyncIterator[OpenAIProvider]:
    made = make_provider(fake_openai)
    yield made
    await made.aclose()


def make_provider(server: FakeOpenAI | None, **kw: Any) -> OpenAIProvider:
    options: dict[str, Any] = {
        "connect_timeout": 2.0,
        "first_byte_timeout": 3.0,
        "idle_timeout": 3.0,
        "max_retries": 2,
        "backoff_base": 0.01,
        "backoff_cap": 0.05,
    }
    options.update(kw)
    base_url = options.pop("base_url", server.base_url if server else "")
    api_key = options.pop("api_key", API_KEY)
    return OpenAIProvider("fake", base_url, api_key, **options)


async def collect(
    provider: OpenAIProvider, req: ChatRequest | None = None
) -> tuple[list[Any], ProviderError | None]:
    chunks: list[Any] = []
    try:
        async for item in provider.stream(req or request()):
            chunks.append(item)
    except ProviderError as error:
        return chunks, error
    return chunks, None


def text_of(chunks: list[Any]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, TextDelta))


def retries(chunks: list[Any]) -> list[Retrying]:
    return [c for c in chunks if isinstance(c, Retrying)]


def assert_no_key(*texts: str) -> None:
    for text in texts:
        assert API_KEY not in text


# --- pure: retry policy and error classification -------------------------------------------


def test_backoff_grows_exponentially_up_to_the_cap_with_jitter_on_top():
    low, high = FixedRandom(0.0), FixedRandom(0.999)
    assert [backoff_delay(n, 1.0, 30.0, low) for n in (1, 2, 3, 4, 6, 50)] == [
        1.0,
        2.0,
        4.0,
        8.0,
        30.0,
        30.0,
    ]
    assert backoff_delay(2, 1.0, 30.0, high) == pytest.approx(2.0 * 1.1998)
    assert 30.0 < backoff_delay(9, 1.0, 30.0, high) <= 36.0


def test_retry_after_seconds_date_ms_and_cap():
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_retry_after({"Retry-After": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "0.25"}) == 0.25
    assert parse_retry_after({"Retry-After": "100000"}) == RETRY_AFTER_CAP
    assert parse_retry_after({"retry-after-ms": "1500", "Retry-After": "9"}) == 1.5
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=now) == 30.0
    past = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"Retry-After": past}, now=now) == 0.0
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None


@pytest.mark.parametrize(
    ("status", "body", "category", "phrase"),
    [
        (400, '{"error": {"message": "Invalid tools"}}', "bad_request", "Invalid tools"),
        (
            400,
            '{"error": {"message": "This model\'s maximum context length is 8192 tokens"}}',
            "context_too_long",
            "maximum context length",
        ),
        (400, '{"error": {"code": "context_length_exceeded"}}', "context_too_long", ""),
        (422, '{"detail": "prompt is too long"}', "context_too_long", ""),
        (413, "too big", "context_too_long", ""),
        (401, '{"error": {"message": "bad key sk-abc"}}', "bad_request", "API key"),
        (403, "", "bad_request", "API key"),
        (404, '{"error": {"message": "model gpt-9 not found"}}', "bad_request", "model may not"),
        (429, '{"error": {"message": "slow down"}}', "rate_limited", "slow down"),
        (429, '{"error": {"code": "insufficient_quota"}}', "bad_request", ""),
        (500, "<html><body>oops</body></html>", "provider_error", "HTTP 500"),
        (503, '{"error": {"message": "overloaded"}}', "provider_error", "overloaded"),
    ],
)
def test_classify_http_error(status: int, body: str, category: str, phrase: str):
    error = classify_http_error(status, body.encode(), {})
    assert (error.category, error.status) == (category, status)
    assert phrase in error.message
    assert "<html>" not in error.message


def test_auth_errors_never_quote_the_body():
    error = classify_http_error(401, b'{"error": {"message": "Incorrect key sk-abc...wxyz"}}', {})
    assert "sk-abc" not in error.message


def test_rate_limit_error_carries_retry_after():
    error = classify_http_error(429, b"", {"Retry-After": "7"})
    assert error.retry_after == 7.0


def test_scrub_secret_hides_the_key_and_long_pieces_of_it():
    assert scrub_secret(f"key {API_KEY}!", API_KEY) == "key [redacted]!"
    masked = f"Incorrect API key provided: {API_KEY[:14]}****{API_KEY[-4:]}"
    assert API_KEY[:14] not in scrub_secret(masked, API_KEY)
    assert scrub_secret("nothing here", API_KEY) == "nothing here"
    assert scrub_secret("ab ab", "ab") == "ab ab"  # too short to search for


# --- streaming against the fake server ----------------------------------------------------


async def test_happy_path_text_reasoning_and_usage(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(text="Hello there, world", reasoning="Thinking it over"))
    req = request("Hi!", system_prompt="Be brief.", max_tokens=50, temperature=0.5)
    chunks, error = await collect(provider, req)
    assert error is None
    # A read's deltas come merged (wire.merge_deltas): where the text splits depends on
    # the reads, the order and the whole text do not.
    deltas = [c for c in chunks if isinstance(c, (ReasoningDelta, TextDelta))]
    first_text = next(i for i, c in enumerate(deltas) if isinstance(c, TextDelta))
    assert all(isinstance(c, ReasoningDelta) for c in deltas[:first_text])
    assert all(isinstance(c, TextDelta) for c in deltas[first_text:])
    assert "".join(c.text for c in deltas[:first_text]) == "Thinking it over"
    assert "".join(c.text for c in deltas[first_text:]) == "Hello there, world"
    assert chunks[-1] == StreamEnd(
        finish_reason="stop",
        tool_calls=[],
        usage=Usage(input_tokens=11, output_tokens=6),
        text="Hello there, world",
        reasoning="Thinking it over",
    )
    [sent] = fake_openai.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {API_KEY}"
    assert sent.json == {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi!"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 50,
        "temperature": 0.5,
    }


async def test_reasoning_under_the_openrouter_field_name(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(text="ok", reasoning="hmm", reasoning_field="reasoning"))
    chunks, _ = await collect(provider)
    assert chunks[-1].reasoning == "hmm"


async def test_tool_calls_split_in_pieces_and_across_index(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(
        Script(
            text="Let me look.",
            tool_calls=[
                FakeToolCall("read_file", '{"path": "notes/ü.md", "lines": [1, 2]}', pieces=5),
                FakeToolCall("search", '{"q": "sse"}', id="", pieces=4, name_pieces=2),
            ],
            interleave_tool_calls=True,
        )
    )
    chunks, error = await collect(provider, request(tools=TOOLS))
    assert error is None
    assert [c for c in chunks if isinstance(c, ToolCallStarted)] == [
        ToolCallStarted(index=0, id="call_fake_0", name="read_file"),
        ToolCallStarted(index=1, id="", name="sea"),  # announced on its first name fragment
    ]
    end = chunks[-1]
    assert end.finish_reason == "tool_calls"
    assert end.text == "Let me look."
    assert end.tool_calls[0] == ToolCall(
        "call_fake_0", "read_file", '{"path": "notes/ü.md", "lines": [1, 2]}'
    )
    assert (end.tool_calls[1].name, end.tool_calls[1].arguments) == ("search", '{"q": "sse"}')
    assert end.tool_calls[1].id.startswith("call_") and len(end.tool_calls[1].id) == 21
    assert fake_openai.requests[0].json["tools"] == TOOLS


async def test_usage_off_gives_usage_none(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(text="no usage here", usage=False))
    chunks, _ = await collect(provider)
    assert chunks[-1].usage is None
    assert chunks[-1].text == "no usage here"


async def test_500_then_success_after_a_retry(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(status=500), Script(text="recovered"))
    chunks, error = await collect(provider)
    assert error is None
    [retry] = retries(chunks)
    assert (retry.attempt, retry.max_attempts, retry.category) == (1, 2, "provider_error")
    assert 0.01 <= retry.delay <= 0.012
    assert "internal error" in retry.message
    assert chunks.index(retry) == 0
    assert text_of(chunks) == "recovered"
    assert len(fake_openai.chat_requests()) == 2


async def test_500_every_time_exhausts_the_retries(fake_openai: FakeOpenAI, provider):
    fake_openai.default = Script(status=502, error_body={"error": {"message": "upstream down"}})
    chunks, error = await collect(provider)
    assert [r.attempt for r in retries(chunks)] == [1, 2]
    assert error is not None
    assert (error.category, error.status, error.streamed) == ("provider_error", 502, False)
    assert "upstream down" in error.message
    assert len(fake_openai.chat_requests()) == 3


async def test_429_retry_after_is_honoured(fake_openai: FakeOpenAI, provider, monkeypatch):
    real_sleep, slept = asyncio.sleep, []

    async def recording_sleep(delay: float, *args: Any) -> Any:
        slept.append(delay)
        return await real_sleep(delay, *args)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    fake_openai.enqueue(Script(status=429, headers={"Retry-After": "0.2"}), Script(text="ok"))
    chunks, error = await collect(provider)
    assert error is None
    [retry] = retries(chunks)
    assert (retry.category, retry.delay) == ("rate_limited", 0.2)
    assert 0.2 in slept  # the provider really waited what the server asked
    assert len(fake_openai.chat_requests()) == 2
    assert text_of(chunks) == "ok"


@pytest.mark.parametrize(
    ("status", "body", "category", "phrase"),
    [
        (400, {"error": {"message": "Unknown parameter 'tools'"}}, "bad_request", "Unknown param"),
        (401, {"error": {"message": "Invalid API key"}}, "bad_request", "rejected the API key"),
        (403, {"error": {"message": "Forbidden"}}, "bad_request", "rejected the API key"),
        (404, {"error": {"message": "The model does not exist"}}, "bad_request", "model may not"),
        (
            400,
            {"error": {"message": "Please reduce the length", "code": "context_length_exceeded"}},
            "context_too_long",
            "too long",
        ),
    ],
)
async def test_4xx_is_not_retried(fake_openai, provider, status, body, category, phrase):
    fake_openai.default = Script(status=status, error_body=body)
    chunks, error = await collect(provider)
    assert chunks == []
    assert error is not None
    assert (error.category, error.status, error.streamed) == (category, status, False)
    assert phrase in error.message
    assert len(fake_openai.chat_requests()) == 1


async def test_in_stream_error_after_tokens(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(
        Script(
            text="one two three four",
            fault_after=2,
            stream_error={
                "error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}
            },
        )
    )
    chunks, error = await collect(provider)
    assert text_of(chunks) == "one two"
    assert error is not None
    assert (error.category, error.streamed) == ("rate_limited", True)
    assert len(fake_openai.chat_requests()) == 1


async def test_in_stream_error_before_tokens(fake_openai: FakeOpenAI, provider):
    context_error = {"error": {"message": "maximum context length exceeded"}}
    fake_openai.enqueue(Script(stream_error=context_error))
    chunks, error = await collect(provider)
    assert (chunks, error.category, error.streamed) == ([], "context_too_long", False)
    # A server-side error event before anything was shown is retried.
    fake_openai.enqueue(Script(stream_error="overloaded", error_event=True), Script(text="fine"))
    chunks, error = await collect(provider)
    assert error is None
    assert [r.category for r in retries(chunks)] == ["provider_error"]
    assert text_of(chunks) == "fine"


async def test_malformed_line_after_tokens(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(text="a b c", fault_after=1, malformed=True))
    chunks, error = await collect(provider)
    assert text_of(chunks) == "a"
    assert (error.category, error.streamed) == ("malformed_stream", True)


async def test_a_reads_deltas_come_merged(fake_openai: FakeOpenAI, provider):
    """One read's deltas go on as one per kind, in order (a paced read brings several)."""
    fake_openai.enqueue(
        Script(tokens=["a", " b", " c"], reasoning_tokens=["x", "y"], coalesce=True)
    )
    chunks, error = await collect(provider)
    assert error is None
    assert chunks[:2] == [ReasoningDelta("xy"), TextDelta("a b c")]


async def test_the_deltas_of_a_read_before_its_failing_event_still_go_out(
    fake_openai: FakeOpenAI, provider
):
    fake_openai.enqueue(
        Script(tokens=["a", " b", " c"], fault_after=2, malformed=True, coalesce=True)
    )
    chunks, error = await collect(provider)
    assert chunks == [TextDelta("a b")]
    assert (error.category, error.streamed) == ("malformed_stream", True)


async def test_malformed_line_before_tokens_is_retried(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(malformed=True), Script(text="good"))
    chunks, error = await collect(provider)
    assert error is None
    assert [r.category for r in retries(chunks)] == ["malformed_stream"]
    assert text_of(chunks) == "good"


async def test_dropped_connection_before_first_token_is_retried(fake_openai, provider):
    fake_openai.enqueue(Script(drop=True), Script(text="second try"))
    chunks, error = await collect(provider)
    assert error is None
    assert [r.category for r in retries(chunks)] == ["unreachable"]
    assert text_of(chunks) == "second try"


async def test_dropped_connection_after_tokens_keeps_the_partial_text(fake_openai, provider):
    fake_openai.enqueue(Script(text="alpha beta gamma delta", drop=True, fault_after=2))
    chunks, error = await collect(provider)
    assert text_of(chunks) == "alpha beta"
    assert error is not None
    assert (error.category, error.streamed) == ("unreachable", True)
    assert "lost" in error.message
    assert len(fake_openai.chat_requests()) == 1


async def test_reset_connection_is_unreachable_and_streamed_only_if_text_arrived(
    fake_openai, provider
):
    # An RST may discard bytes the client had not read yet, so either outcome is possible:
    # the flag must match what the caller actually saw.
    fake_openai.default = Script(
        text="a b c d", drop=True, drop_reset=True, fault_after=2, token_delay=0.02
    )
    chunks, error = await collect(provider)
    assert error is not None
    assert error.category == "unreachable"
    assert error.streamed == bool(text_of(chunks))
    assert text_of(chunks) in ("", "a", "a b")


async def test_a_web_page_instead_of_an_api_is_a_clear_bad_request(fake_openai, provider):
    fake_openai.default = Script(status=200, error_body="<html>UI</html>")
    fake_openai.default.headers = {"Content-Type": "text/html"}
    chunks, error = await collect(provider)
    assert (chunks, error.category) == ([], "bad_request")
    assert "base URL" in error.message
    assert len(fake_openai.chat_requests()) == 1


async def test_stall_before_the_headers_hits_the_first_byte_timeout(fake_openai):
    fake_openai.default = Script(headers_delay=2.0)
    provider = make_provider(fake_openai, first_byte_timeout=0.3, max_retries=1)
    chunks, error = await collect(provider)
    assert error is not None
    assert (error.category, error.streamed) == ("timed_out", False)
    assert "start answering within 0.3 s" in error.message
    assert [r.category for r in retries(chunks)] == ["timed_out"]
    assert await fake_openai.wait_for_disconnect_async(count=2, timeout=1.0)
    await provider.aclose()


async def test_silence_after_the_headers_counts_against_the_first_byte_timeout(fake_openai):
    fake_openai.enqueue(Script(body_delay=2.0), Script(text="quick"))
    provider = make_provider(fake_openai, first_byte_timeout=0.3, idle_timeout=5.0)
    chunks, error = await collect(provider)
    assert error is None
    assert [r.category for r in retries(chunks)] == ["timed_out"]
    assert text_of(chunks) == "quick"
    await provider.aclose()


async def test_stall_mid_stream_hits_the_idle_timeout(fake_openai: FakeOpenAI):
    fake_openai.enqueue(Script(text="one two three", fault_after=2, stall=3.0))
    provider = make_provider(fake_openai, idle_timeout=0.3)
    chunks, error = await collect(provider)
    assert text_of(chunks) == "one two"
    assert error is not None
    assert (error.category, error.streamed) == ("timed_out", True)
    assert "stopped sending for 0.3 s" in error.message
    assert await fake_openai.wait_for_disconnect_async(timeout=1.0)  # upstream closed
    await provider.aclose()


async def test_keepalive_comments_keep_a_slow_stream_alive(fake_openai: FakeOpenAI):
    fake_openai.enqueue(
        Script(text="before after", fault_after=1, stall=0.9, keepalive=0.1, line_ending="\r\n")
    )
    provider = make_provider(fake_openai, idle_timeout=0.3, first_byte_timeout=0.3)
    chunks, error = await collect(provider)
    assert error is None
    assert retries(chunks) == []
    assert chunks[-1].text == "before after"
    await provider.aclose()


async def test_missing_done_is_fine_after_a_finish_reason(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(text="no sentinel", done=False))
    chunks, error = await collect(provider)
    assert error is None
    assert (chunks[-1].text, chunks[-1].finish_reason) == ("no sentinel", "stop")


async def test_an_empty_200_stream_is_malformed_not_an_empty_answer(fake_openai, provider):
    fake_openai.default = Script(text="", done=False, finish=False, usage=False)
    chunks, error = await collect(provider)
    assert error is not None
    assert (error.category, error.streamed) == ("malformed_stream", False)
    assert len(retries(chunks)) == 2


async def test_data_after_done_is_ignored(fake_openai: FakeOpenAI, provider):
    late = '{"choices": [{"index": 0, "delta": {"content": " LATE"}}]}'
    fake_openai.enqueue(Script(text="the end", after_done=late))
    chunks, error = await collect(provider)
    assert error is None
    assert chunks[-1].text == "the end"
    fake_openai.enqueue(Script(text="the end", after_done="{not json"))
    chunks, error = await collect(provider)
    assert (error, chunks[-1].text) == (None, "the end")


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
async def test_crlf_comments_and_writes_split_inside_lines_and_utf8(fake_openai, provider, ending):
    text = "Grüße, 世界! 🎉 naïve café"
    fake_openai.enqueue(
        Script(
            text=text,
            reasoning="Überlegung 🤔",
            line_ending=ending,
            comments=True,
            split=5,
            split_seed=7,
            tool_calls=[FakeToolCall("note", '{"text": "ü🎉"}', pieces=3)],
        )
    )
    chunks, error = await collect(provider)
    assert error is None
    end = chunks[-1]
    assert (end.text, end.reasoning) == (text, "Überlegung 🤔")
    assert end.tool_calls == [ToolCall("call_fake_0", "note", '{"text": "ü🎉"}')]


async def test_server_ignoring_stream_true_still_streams_one_reply(fake_openai, provider):
    fake_openai.enqueue(Script(text="all at once", reasoning="r", non_stream=True))
    chunks, error = await collect(provider)
    assert error is None
    assert chunks == [
        TextDelta("all at once"),
        ReasoningDelta("r"),
        StreamEnd("stop", [], Usage(11, 4), "all at once", "r"),
    ]


async def test_cancelling_the_consumer_closes_the_upstream_within_a_second(fake_openai, provider):
    fake_openai.enqueue(Script(tokens=[f"t{i} " for i in range(100)], token_delay=0.05))
    seen: list[Any] = []
    two_tokens = asyncio.Event()

    async def consume() -> None:
        async for item in provider.stream(request()):
            seen.append(item)
            if len(seen) == 2:
                two_tokens.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(two_tokens.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await fake_openai.wait_for_disconnect_async(timeout=1.0)
    assert len(seen) < 100


async def test_closing_the_generator_closes_the_upstream(fake_openai, provider):
    fake_openai.enqueue(Script(tokens=[f"t{i} " for i in range(100)], token_delay=0.05))
    stream = provider.stream(request())
    assert await anext(stream) == TextDelta("t0 ")
    await stream.aclose()
    assert await fake_openai.wait_for_disconnect_async(timeout=1.0)


async def test_concurrent_streams_on_one_provider(fake_openai: FakeOpenAI, provider):
    fake_openai.respond_with(
        lambda req: Script(text=f"echo {req.json['messages'][-1]['content']}", token_delay=0.01)
    )
    results = await asyncio.gather(*(collect(provider, request(f"n{i}")) for i in range(4)))
    assert [chunks[-1].text for chunks, _ in results] == [f"echo n{i}" for i in range(4)]


async def test_unreachable_provider(fake_openai: FakeOpenAI):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = make_provider(None, base_url=f"http://127.0.0.1:{port}/v1", max_retries=1)
    chunks, error = await collect(provider)
    assert error is not None
    assert (error.category, error.streamed) == ("unreachable", False)
    assert [r.category for r in retries(chunks)] == ["unreachable"]
    await provider.aclose()


# --- the API key never leaks ---------------------------------------------------------------

ECHO = {"error": {"message": f"Incorrect API key provided: {API_KEY}", "code": "invalid_key"}}
KEY_FAULTS = [
    Script(status=401, error_body=ECHO),
    Script(status=400, error_body=ECHO),
    Script(status=400, error_body=f"bad request for key {API_KEY}"),
    Script(status=404, error_body=ECHO),
    Script(status=429, error_body=ECHO, headers={"Retry-After": "0"}),
    Script(status=500, error_body=ECHO),
    Script(stream_error=ECHO),
    Script(stream_error=ECHO, fault_after=1),
    Script(stream_error=f"key {API_KEY}", error_event=True),
    Script(malformed=True, fault_after=1),
    Script(drop=True, fault_after=1),
    Script(fault_after=1, stall=2.0),
    Script(headers_delay=2.0),
    Script(text="", done=False, finish=False, usage=False),
]


@pytest.mark.parametrize("script", KEY_FAULTS)
async def test_the_api_key_never_appears_in_errors(fake_openai: FakeOpenAI, script: Script):
    fake_openai.default = script
    provider = make_provider(fake_openai, first_byte_timeout=0.3, idle_timeout=0.3, max_retries=1)
    chunks, error = await collect(provider)
    assert error is not None
    assert_no_key(str(error), error.message, repr(error), repr(provider))
    assert_no_key(*(r.message for r in retries(chunks)))
    assert fake_openai.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    await provider.aclose()


async def test_the_api_key_never_appears_in_complete_or_list_models_errors(fake_openai):
    fake_openai.default = Script(status=400, error_body=ECHO)
    provider = make_provider(fake_openai)
    with pytest.raises(ProviderError) as caught:
        await provider.complete(request())
    assert_no_key(str(caught.value), caught.value.message)
    provider = make_provider(None, base_url="http://127.0.0.1:1/v1", max_retries=0)
    with pytest.raises(ProviderError) as caught:
        await provider.list_models()
    assert_no_key(str(caught.value), caught.value.message)


async def test_no_authorization_header_without_a_key(fake_openai: FakeOpenAI):
    provider = make_provider(fake_openai, api_key="")
    chunks, _ = await collect(provider)
    assert chunks[-1].text == "Hello from the fake model."
    assert "authorization" not in fake_openai.requests[0].headers
    await provider.aclose()


# --- complete() and list_models() ------------------------------------------------------------


async def test_list_models_is_sorted(fake_openai: FakeOpenAI, provider):
    fake_openai.models = ["zeta", "alpha", "mid", "alpha"]
    assert await provider.list_models() == ["alpha", "mid", "zeta"]
    assert fake_openai.requests[0].method == "GET"
    assert fake_openai.requests[0].path == "/v1/models"


async def test_complete_returns_text_usage_and_tool_calls(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(
        Script(
            text="Summary done.",
            reasoning="short",
            tool_calls=[FakeToolCall("save", '{"a": 1}'), FakeToolCall("log", "{}", id="")],
        )
    )
    end = await provider.complete(request("summarise", system_prompt="You summarise."))
    assert (end.text, end.reasoning, end.finish_reason) == ("Summary done.", "short", "tool_calls")
    assert end.usage == Usage(11, 8)  # the fake counts every content chunk
    assert end.tool_calls[0] == ToolCall("call_fake_0", "save", '{"a": 1}')
    assert end.tool_calls[1].name == "log" and end.tool_calls[1].id.startswith("call_")
    sent = fake_openai.requests[0].json
    assert sent["stream"] is False and "stream_options" not in sent
    assert fake_openai.requests[0].headers["accept"] == "application/json"


async def test_complete_retries_and_reports_each_retry(fake_openai: FakeOpenAI, provider):
    fake_openai.enqueue(Script(status=503), Script(status=500), Script(text="third time"))
    seen: list[Retrying] = []
    end = await provider.complete(request(), on_retry=seen.append)
    assert end.text == "third time"
    assert [(r.attempt, r.category) for r in seen] == [(1, "provider_error"), (2, "provider_error")]


async def test_complete_maps_errors_without_retrying_4xx(fake_openai: FakeOpenAI, provider):
    fake_openai.default = Script(
        status=400, error_body={"error": {"code": "context_length_exceeded"}}
    )
    with pytest.raises(ProviderError) as caught:
        await provider.complete(request())
    assert caught.value.category == ErrorCategory.CONTEXT_TOO_LONG
    assert len(fake_openai.requests) == 1


async def test_error_object_in_a_200_json_body(fake_openai: FakeOpenAI, provider):
    overloaded = {"error": {"message": "model overloaded"}}
    fake_openai.enqueue(Script(error_body=overloaded), Script(text="ok"))
    seen: list[Retrying] = []
    end = await provider.complete(request(), on_retry=seen.append)
    assert end.text == "ok"
    assert seen[0].category == "provider_error" and "overloaded" in seen[0].message
    fake_openai.enqueue(Script(error_body={"error": {"code": "context_length_exceeded"}}))
    chunks, error = await collect(provider)
    assert (chunks, error.category) == ([], "context_too_long")


# --- the fake server itself ---------------------------------------------------------------------


def test_fake_server_serves_other_threads_and_sync_clients():
    import httpx

    with FakeOpenAI() as server:
        server.enqueue(Script(text="a b", usage=False))
        with httpx.Client() as client:
            with client.stream(
                "POST", f"{server.base_url}/chat/completions", json={"stream": True}
            ) as response:
                body = response.read().decode()
            models = client.get(f"{server.base_url}/models").json()
    assert body.startswith("data: ") and body.rstrip().endswith("data: [DONE]")
    assert [m["id"] for m in models["data"]] == ["fake-model", "fake-reasoner"]
    assert server.disconnects == []


# --- paced reads ------------------------------------------------------------------------


async def test_paced_reads_take_the_tokens_in_a_few_reads_and_lose_none(fake_openai, monkeypatch):
    """read_interval: one network read per interval carries every token that came since."""
    words = [f"w{i} " for i in range(40)]
    fake_openai.enqueue(Script(tokens=words, token_delay=0.005))  # 0.2 s of tokens
    fake_openai.enqueue(Script(text="Second reply"))
    reads: list[int] = []
    real_read = netbackend.AsyncioStream.read

    async def counted_read(self, max_bytes, timeout=None):
        data = await real_read(self, max_bytes, timeout)
        reads.append(len(data))
        return data

    monkeypatch.setattr(netbackend.AsyncioStream, "read", counted_read)
    provider = make_provider(fake_openai, read_interval=0.05)
    try:
        chunks, error = await collect(provider)
        assert error is None
        assert text_of(chunks) == "".join(words)
        assert sum(1 for size in reads if size) <= 10  # not one read per token
        # The connection went back to the pool reading as usual: the next reply is whole.
        again, error = await collect(provider)
        assert error is None and text_of(again) == "Second reply"
    finally:
        await provider.aclose()


# --- one provider, many requests: its client is reused, and closed by aclose ----------------


async def keep_alive_sse_server(connections: list[asyncio.Task[Any]]) -> asyncio.Server:
    """A loopback server that answers every chat request on a connection with a short SSE
    reply and keeps the connection open (tests/fakeopenai.py closes after each one).
    ``connections`` gets the task serving each connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connections.append(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
                asked = json.loads(await reader.readexactly(length))["messages"][-1]["content"]
                encoder = ChunkEncoder("m")
                end = StreamEnd("stop", [], Usage(1, 1), f"re: {asked}", "")
                body = b"".join(
                    encode_event(json.dumps(item))
                    for item in encoder.encode_all([TextDelta(end.text), end])
                ) + encode_event("[DONE]")
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def _kept(provider: OpenAIProvider) -> object:
    """What the provider keeps between requests: its lean pool, or its httpx client."""
    return provider._pool() if provider._lean else provider._client()


@pytest.mark.parametrize("transport", ["lean", "asyncio", "stock"])
async def test_sequential_requests_share_one_client_and_one_connection(transport: str):
    connections: list[asyncio.Task[Any]] = []
    server = await keep_alive_sse_server(connections)
    port = server.sockets[0].getsockname()[1]
    provider = make_provider(None, base_url=f"http://127.0.0.1:{port}/v1", transport=transport)
    try:
        first, error = await collect(provider, request("one"))
        kept = _kept(provider)
        second, error2 = await collect(provider, request("two"))
        assert (error, error2) == (None, None)
        assert (first[-1].text, second[-1].text) == ("re: one", "re: two")
        assert _kept(provider) is kept
        assert len(connections) == 1  # the second request went over the pooled connection
        assert provider._lean == (transport == "lean")
        if transport != "lean":
            assert isinstance(kept._transport, netbackend.AsyncioTransport) == (  # type: ignore[attr-defined]
                transport == "asyncio"
            )
    finally:
        await provider.aclose()
        server.close()
        # Closing the client closed its pooled connection: the server sees the end.
        await asyncio.wait_for(asyncio.gather(*connections), 2.0)


@pytest.mark.parametrize("transport", ["lean", "asyncio"])
async def test_the_fake_server_sees_one_client_for_many_requests(
    fake_openai: FakeOpenAI, transport: str
):
    provider = make_provider(fake_openai, transport=transport)
    made: list[object] = []
    real_client_init = httpx.AsyncClient.__init__
    real_pool_init = httpclient.Pool.__init__

    def counting_client_init(self: httpx.AsyncClient, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        real_client_init(self, *args, **kwargs)

    def counting_pool_init(self: httpclient.Pool, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        real_pool_init(self, *args, **kwargs)

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(httpx.AsyncClient, "__init__", counting_client_init)
            patch.setattr(httpclient.Pool, "__init__", counting_pool_init)
            for n in range(3):
                chunks, error = await collect(provider, request(f"n{n}"))
                assert error is None and chunks[-1].text == "Hello from the fake model."
            assert await provider.list_models() == ["fake-model", "fake-reasoner"]
            end = await provider.complete(request())
            assert end.text == "Hello from the fake model."
        kind = httpclient.Pool if transport == "lean" else httpx.AsyncClient
        assert [type(one) for one in made] == [kind]
        assert len(fake_openai.chat_requests()) == 4
    finally:
        await provider.aclose()


async def test_aclose_closes_the_pool_and_a_later_request_builds_a_new_one():
    connections: list[asyncio.Task[Any]] = []
    server = await keep_alive_sse_server(connections)
    port = server.sockets[0].getsockname()[1]
    provider = make_provider(None, base_url=f"http://127.0.0.1:{port}/v1")
    try:
        first, _ = await collect(provider, request("one"))
        pool = provider._pool()
        await provider.aclose()
        # The kept connection was closed: the server saw its end.
        await asyncio.wait_for(asyncio.gather(*connections), 2.0)
        await provider.aclose()  # twice is fine
        second, error = await collect(provider, request("two"))
        assert error is None and (first[-1].text, second[-1].text) == ("re: one", "re: two")
        assert provider._pool() is not pool and len(connections) == 2
    finally:
        await provider.aclose()
        server.close()


async def test_aclose_closes_the_httpx_client_and_a_later_request_builds_a_new_one(
    fake_openai: FakeOpenAI,
):
    provider = make_provider(fake_openai, transport="asyncio")
    await collect(provider)
    client = provider._client()
    await provider.aclose()
    assert client.is_closed
    await provider.aclose()  # twice is fine
    chunks, error = await collect(provider)
    assert error is None and chunks[-1].text == "Hello from the fake model."
    assert provider._client() is not client and not provider._client().is_closed
    await provider.aclose()


@pytest.mark.parametrize("transport", ["lean", "asyncio"])
def test_a_provider_used_from_two_event_loops_rebuilds_its_client(
    fake_openai: FakeOpenAI, transport: str
):
    provider = make_provider(fake_openai, transport=transport)
    kept: list[object] = []

    async def one_reply() -> str:
        chunks, error = await collect(provider)
        assert error is None
        kept.append(_kept(provider))
        return chunks[-1].text

    assert asyncio.run(one_reply()) == "Hello from the fake model."
    assert asyncio.run(one_reply()) == "Hello from the fake model."  # a new loop
    assert kept[0] is not kept[1]
    asyncio.run(provider.aclose())  # from a third loop: the client is dropped, no error
    assert provider._own_client is None and provider._own_pool is None


def test_an_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="transport"):
        OpenAIProvider("p", "http://127.0.0.1:1/v1", "", transport="curl")


# --- the provider's own HTTP client (chat/llm/httpclient.py) under the provider ---------------


class Scripted:
    """A loopback server answering each request with the next reply, written as the given
    pieces (a short pause between them, so the client's reads cut where they cut); the
    connection is kept for the next request unless ``close_after`` says otherwise (without
    saying so in the answer)."""

    def __init__(self, replies: list[list[bytes]], close_after: bool = False) -> None:
        self.replies = list(replies)
        self.close_after = close_after
        self.connections = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.server is not None
        self.server.close()

    def url(self, scheme: str = "http") -> str:
        assert self.server is not None
        return f"{scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                found = re.search(rb"(?i)content-length: *(\d+)", head)
                if found:
                    await reader.readexactly(int(found[1]))
                for piece in self.replies.pop(0):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.002)
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def sse_reply(words: list[str], tail: bytes = b"") -> bytes:
    """An SSE body of ``words`` as text deltas, their end, usage and ``[DONE]``."""
    encoder = ChunkEncoder("m")
    end = StreamEnd("stop", [], Usage(1, len(words)), "".join(words), "")
    items = [TextDelta(word) for word in words] + [end]
    return b"".join(encode_event(json.dumps(item)) for item in encoder.encode_all(items)) + (
        tail or encode_event("[DONE]")
    )


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out: list[bytes] = []
    pos = 0
    while pos < len(body):
        size = sizes[len(out) % len(sizes)]
        out.append(b"%x\r\n" % len(body[pos : pos + size]) + body[pos : pos + size] + b"\r\n")
        pos += size
    return b"".join(out) + b"0\r\n\r\n"


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


@pytest.mark.parametrize("seed", range(4))
async def test_a_chunked_stream_cut_anywhere_reads_the_same_over_one_kept_connection(seed: int):
    import random as random_module

    rng = random_module.Random(seed)
    words = ["Grüße", ", ", "世界", "! 🎉", " naïve", " café"] * 3
    replies = []
    for _ in range(2):
        raw = SSE_HEAD + chunked(sse_reply(words), [rng.randint(1, 40) for _ in range(7)])
        cuts = sorted(rng.sample(range(1, len(raw)), 12))
        replies.append([raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)])
    async with Scripted(replies) as server:
        provider = make_provider(None, base_url=server.url())
        try:
            for _ in range(2):
                chunks, error = await collect(provider)
                assert error is None and retries(chunks) == []
                assert text_of(chunks) == chunks[-1].text == "".join(words)
        finally:
            await provider.aclose()
    assert server.connections == 1  # the second request went over the kept connection
    head = server.heads[0].decode().lower()
    assert head.startswith("post /v1/chat/completions http/1.1\r\n")
    for line in ("content-type: application/json", "accept-encoding: identity", "host: 127.0.0.1"):
        assert line in head


@pytest.mark.parametrize("pause", [0.0, 0.05])  # the server's close unseen (sent again) or seen
async def test_a_kept_connection_the_server_closed_is_replaced_without_a_retry(pause: float):
    reply = SSE_HEAD + chunked(sse_reply(["fine"]), [1000])
    async with Scripted([[reply], [reply], [reply]], close_after=True) as server:
        provider = make_provider(None, base_url=server.url())
        try:
            for _ in range(3):
                chunks, error = await collect(provider)
                assert error is None and retries(chunks) == [] and text_of(chunks) == "fine"
                await asyncio.sleep(pause)
        finally:
            await provider.aclose()
    assert server.connections == 3


async def test_tokens_and_an_error_in_one_read_keep_the_tokens():
    error = encode_event(json.dumps({"error": {"message": "Rate limit reached"}}))
    body = sse_reply(["one", " two"], tail=error)
    body = body[: body.index(b"data: {", body.index(b"two"))] + error  # no end, no usage
    async with Scripted([[SSE_HEAD + chunked(body, [len(body)])]]) as server:
        provider = make_provider(None, base_url=server.url())
        try:
            chunks, failure = await collect(provider)
        finally:
            await provider.aclose()
    assert text_of(chunks) == "one two"
    assert failure is not None
    assert (failure.category, failure.streamed) == ("rate_limited", True)


async def test_a_redirect_is_a_bad_request_naming_the_base_url():
    moved = b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n"
    async with Scripted([[moved]]) as server:
        provider = make_provider(None, base_url=server.url())
        try:
            chunks, error = await collect(provider)
        finally:
            await provider.aclose()
    assert error is not None and error.category == "bad_request"
    assert "redirect (HTTP 302); check the base URL" in error.message


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compressed_json_reply_is_decoded(encoding: str):
    import gzip
    import zlib

    completion = {
        "choices": [{"index": 0, "message": {"content": "Packed."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    raw = json.dumps(completion).encode()
    packed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: %s\r\n" % (
        encoding.encode()
    )
    answer = head + b"Content-Length: %d\r\n\r\n" % len(packed) + packed
    async with Scripted([[answer[:40], answer[40:60], answer[60:]]]) as server:
        provider = make_provider(None, base_url=server.url())
        try:
            end = await provider.complete(request())
        finally:
            await provider.aclose()
    assert end.text == "Packed." and end.usage == Usage(3, 1)


async def test_an_encoding_that_cannot_be_read_is_a_malformed_reply():
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: br\r\n"
        b"Content-Length: 4\r\n\r\n\x0b\x02\x80{"
    )
    async with Scripted([[answer]]) as server:
        provider = make_provider(None, base_url=server.url(), max_retries=0)
        try:
            with pytest.raises(ProviderError) as caught:
                await provider.complete(request())
        finally:
            await provider.aclose()
    assert caught.value.category == "malformed_stream"
    assert "'br'" in caught.value.message


async def test_a_refused_connection_says_so():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = make_provider(None, base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    chunks, error = await collect(provider)
    assert error is not None and error.category == "unreachable"
    assert error.message == "The model provider could not be reached (connection refused)."
    provider = make_provider(None, base_url="ftp://127.0.0.1/v1", max_retries=0)
    chunks, error = await collect(provider)
    assert error is not None and error.category == "bad_request"
    assert "base URL or settings are not valid" in error.message


async def test_https_over_the_providers_own_client(certificate, monkeypatch):  # noqa: F811
    from chat.llm import openai as openai_module
    from tests.llm.test_netbackend import server_context, trusting_context

    reply = SSE_HEAD + chunked(sse_reply(["secure", " words"]), [7])
    connections: list[int] = []
    replies = [reply, reply]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                await reader.readexactly(int(length[1]))  # type: ignore[index]
                writer.write(replies.pop(0))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context(certificate))
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        untrusting = make_provider(None, base_url=url, max_retries=0)
        chunks, error = await collect(untrusting)
        await untrusting.aclose()
        assert error is not None and error.category == "unreachable"
        assert (
            error.message == "The model provider could not be reached (the TLS handshake failed)."
        )
        monkeypatch.setattr(
            openai_module, "_shared_ssl_context", lambda: trusting_context(certificate)
        )
        provider = make_provider(None, base_url=url)
        try:
            for _ in range(2):
                chunks, error = await collect(provider)
                assert error is None and text_of(chunks) == "secure words"
        finally:
            await provider.aclose()
        # Both over one kept connection (the refused one never got past its handshake).
        assert provider._lean and len(connections) == 1
    finally:
        server.close()
