"""What every provider speaks: a request, a stream of typed chunks, and errors by category.

Providers know nothing of the agent loop or of Django. The loop consumes
``Provider.stream()`` and reacts to these chunk types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from chat.core.i18n import gettext_noop
from chat.core.messages import ChatMessage, ToolCall


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    estimated: bool = False  # True when the provider sent none and we counted ourselves


@dataclass(slots=True)
class ChatRequest:
    model: str  # the provider's real model id (aliases are resolved before this point)
    messages: list[ChatMessage]
    system_prompt: str = ""
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI "function" tool specs
    max_tokens: int | None = None
    thinking: bool = True
    temperature: float | None = None


# --- stream chunks ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """The first fragment of a tool call arrived (its name is known)."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Retrying:
    """Nothing was streamed yet and the request failed in a retryable way."""

    attempt: int  # 1 for the first retry
    max_attempts: int
    delay: float  # seconds until the next attempt
    category: ErrorCategory
    message: str


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Always the last chunk of a successful stream."""

    finish_reason: str | None
    tool_calls: list[ToolCall]
    usage: Usage | None  # None when the provider sent no usage
    text: str  # the full text of this response
    reasoning: str  # the full reasoning of this response


StreamChunk = TextDelta | ReasoningDelta | ToolCallStarted | Retrying | StreamEnd


# --- errors -------------------------------------------------------------------------------


class ErrorCategory(StrEnum):
    UNREACHABLE = "unreachable"
    RATE_LIMITED = "rate_limited"
    PROVIDER_ERROR = "provider_error"
    BAD_REQUEST = "bad_request"
    CONTEXT_TOO_LONG = "context_too_long"
    TIMED_OUT = "timed_out"
    MALFORMED_STREAM = "malformed_stream"
    INTERRUPTED = "interrupted"  # the process running the reply went away
    INTERNAL = "internal"  # a bug on our side, not the provider's
    CANCELLED = "cancelled"


USER_MESSAGES: dict[ErrorCategory, str] = {
    ErrorCategory.UNREACHABLE: gettext_noop("The model provider could not be reached."),
    ErrorCategory.RATE_LIMITED: gettext_noop(
        "The model provider is rate limiting requests. Try again shortly."
    ),
    ErrorCategory.PROVIDER_ERROR: gettext_noop("The model provider had an internal error."),
    ErrorCategory.BAD_REQUEST: gettext_noop("The model provider rejected the request."),
    ErrorCategory.CONTEXT_TOO_LONG: gettext_noop(
        "The conversation is too long for this model's context window."
    ),
    ErrorCategory.TIMED_OUT: gettext_noop("The model provider stopped responding in time."),
    ErrorCategory.MALFORMED_STREAM: gettext_noop(
        "The model provider sent a reply that could not be read."
    ),
    ErrorCategory.INTERRUPTED: gettext_noop(
        "The reply was interrupted because the server restarted."
    ),
    ErrorCategory.CANCELLED: gettext_noop("The reply was stopped."),
    ErrorCategory.INTERNAL: gettext_noop(
        "Lyceum hit an internal error while answering. Please try again."
    ),
}


class ProviderError(Exception):
    """A failure with a category a user understands. Never carries the API key."""

    def __init__(
        self,
        category: ErrorCategory,
        message: str | None = None,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        streamed: bool = False,
        detail: str = "",
    ) -> None:
        self.category = ErrorCategory(category)
        self.message = message or USER_MESSAGES[self.category]
        self.status = status
        self.retry_after = retry_after
        self.streamed = streamed  # True when text had already been streamed before the failure
        self.detail = detail  # a network failure in plain words ("connection refused"), or ""
        super().__init__(f"{self.category}: {self.message}")


RetryCallback = Callable[[Retrying], None]


class Provider(Protocol):
    name: str

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        """Stream one response. Yields ``Retrying`` before retries, ends with ``StreamEnd``.

        Raises :class:`ProviderError`. Cancelling the consuming task closes the
        upstream request.
        """
        ...

    async def complete(self, request: ChatRequest) -> StreamEnd:
        """One non-streaming response (used for compaction summaries)."""
        ...

    async def list_models(self) -> list[str]: ...

    async def aclose(self) -> None:
        """Release what the provider holds (its HTTP client and pooled connections).

        A provider is meant to be kept and reused for many requests; after ``aclose`` it
        may still be used (it builds what it needs again), so closing is never unsafe.
        """
        ...
