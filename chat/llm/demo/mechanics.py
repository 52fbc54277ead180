"""The demo model's machinery: the Provider interface, streaming, pacing, usage, call ids.

``rules.plan_reply`` decides the whole reply; this module streams it (a short reasoning
unless ``request.thinking`` is false, then the text, then a tool call) at ``token_delay``
per chunk of ``chunk_words`` words, and fails where the plan says so.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

from chat.core.messages import ToolCall
from chat.llm.demo.rules import Failure, plan_reply, request_digest
from chat.llm.demo.texts import FAIL_MESSAGE, FAIL_MIDWAY_MESSAGE
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    ProviderError,
    ReasoningDelta,
    StreamChunk,
    StreamEnd,
    TextDelta,
    ToolCallStarted,
    Usage,
)

DEMO_MODELS = ["demo", "demo-fast"]
FAST_MODEL = "demo-fast"


class DemoProvider:
    """Scripted offline model behind the :class:`~chat.llm.types.Provider` interface."""

    def __init__(self, name: str = "demo", *, token_delay: float = 0.03, chunk_words: int = 1):
        if token_delay < 0:
            raise ValueError("token_delay must be >= 0")
        if chunk_words < 1:
            raise ValueError("chunk_words must be >= 1")
        self.name = name
        self.token_delay = token_delay
        self.chunk_words = chunk_words

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        delay = 0.0 if request.model == FAST_MODEL else self.token_delay
        return self._generate(request, delay)

    async def complete(self, request: ChatRequest) -> StreamEnd:
        async for chunk in self._generate(request, 0.0):
            if isinstance(chunk, StreamEnd):
                return chunk
        raise ProviderError(ErrorCategory.MALFORMED_STREAM)  # unreachable: the stream always ends

    async def aclose(self) -> None:
        """Nothing to close: the demo model holds no connection."""

    async def list_models(self) -> list[str]:
        return list(DEMO_MODELS)

    async def _generate(self, request: ChatRequest, delay: float) -> AsyncIterator[StreamChunk]:
        reply = plan_reply(request)
        if reply.failure is Failure.BEFORE_ANY_TOKEN:
            raise ProviderError(ErrorCategory.PROVIDER_ERROR, FAIL_MESSAGE)
        reasoning = reply.reasoning if request.thinking else ""
        output_words = 0
        for piece in split_into_chunks(reasoning, self.chunk_words):
            await _pause(delay)
            output_words += 1
            yield ReasoningDelta(piece)
        for piece in split_into_chunks(reply.text, self.chunk_words):
            await _pause(delay)
            output_words += 1
            yield TextDelta(piece)
        if reply.failure is Failure.MIDWAY:
            raise ProviderError(ErrorCategory.PROVIDER_ERROR, FAIL_MIDWAY_MESSAGE, streamed=True)
        tool_calls: list[ToolCall] = []
        if reply.tool_call is not None:
            call_id = tool_call_id(request)
            await _pause(delay)
            yield ToolCallStarted(index=0, id=call_id, name=reply.tool_call.name)
            arguments = json.dumps(reply.tool_call.arguments, ensure_ascii=False)
            tool_calls.append(ToolCall(id=call_id, name=reply.tool_call.name, arguments=arguments))
            output_words += max(1, len(arguments) // 4)
        yield StreamEnd(
            finish_reason="tool_calls" if tool_calls else "stop",
            tool_calls=tool_calls,
            usage=Usage(input_tokens=_input_tokens(request), output_tokens=output_words),
            text=reply.text,
            reasoning=reasoning,
        )


async def _pause(delay: float) -> None:
    # Always yield to the loop, even at zero delay, so a cancelled consumer stops at once.
    await asyncio.sleep(delay if delay > 0 else 0)


def split_into_chunks(text: str, words_per_chunk: int) -> list[str]:
    """Cut text into chunks of N words, keeping every whitespace so they join back exactly."""
    body = text.lstrip()
    words = re.findall(r"\S+\s*", body)  # linear, unlike a pattern that starts with \s*
    leading = text[: len(text) - len(body)]
    if not words:
        return [leading] if leading else []
    words[0] = leading + words[0]
    return ["".join(words[i : i + words_per_chunk]) for i in range(0, len(words), words_per_chunk)]


def tool_call_id(request: ChatRequest) -> str:
    return f"call_demo_{request_digest(request)[:8]}"


def _input_tokens(request: ChatRequest) -> int:
    chars = len(request.system_prompt)
    for message in request.messages:
        chars += len(message.content)
        chars += sum(len(c.name) + len(c.arguments) for c in message.tool_calls or [])
    return chars // 4
