"""Retry policy and error classification for OpenAI-compatible providers.

Pure functions: no network, no clock except where one is passed in. The provider
retries a request only while nothing has been streamed to the caller yet, and only
for the categories in :data:`RETRYABLE`.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

from chat.llm.types import USER_MESSAGES, ErrorCategory, ProviderError

# A server asking us to wait longer than this is treated as if it asked for this long;
# the caller's own patience (and the hang guard) is the real limit.
RETRY_AFTER_CAP = 120.0

# Jitter spreads simultaneous retries (many chats hitting one rate limit) apart.
JITTER_FRACTION = 0.2

# Errors worth another attempt. BAD_REQUEST and CONTEXT_TOO_LONG would fail the same way;
# MALFORMED_STREAM is retried because broken streams are usually a flaky proxy, not the model.
RETRYABLE = frozenset(
    {
        ErrorCategory.UNREACHABLE,
        ErrorCategory.TIMED_OUT,
        ErrorCategory.PROVIDER_ERROR,
        ErrorCategory.RATE_LIMITED,
        ErrorCategory.MALFORMED_STREAM,
    }
)

MAX_DETAIL_CHARS = 200

_CONTEXT_HINTS = (
    "context length",
    "maximum context",
    "context window",
    "too many tokens",
    "prompt is too long",
    "prompt too long",
    "input is too long",
    "maximum input length",
    "reduce the length",
)
_RATE_HINTS = ("rate limit", "ratelimit", "too many requests", "rate limited")
_QUOTA_HINTS = ("insufficient quota", "billing", "payment required")


class RandomSource(Protocol):
    def random(self) -> float: ...


def backoff_delay(attempt: int, base: float, cap: float, rng: RandomSource | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    ``min(base * 2**(attempt-1), cap)`` plus 0-20 % jitter on top, so the jitter still
    spreads retries apart once the cap is reached.
    """
    exponent = max(attempt, 1) - 1
    raw = min(base * math.pow(2.0, min(exponent, 62)), cap)
    source = rng if rng is not None else random
    return max(raw, 0.0) * (1.0 + JITTER_FRACTION * source.random())


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """The server's requested wait in seconds (``Retry-After`` seconds or HTTP-date), capped."""
    lowered = {key.lower(): value for key, value in headers.items()}
    milliseconds = lowered.get("retry-after-ms")  # OpenAI sends this finer-grained hint too
    if milliseconds:
        try:
            return _clamp_wait(float(milliseconds) / 1000.0)
        except ValueError:
            pass
    value = (lowered.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return _clamp_wait(float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now or datetime.now(UTC)
    return _clamp_wait((when - current).total_seconds())


def _clamp_wait(seconds: float) -> float | None:
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP)


def _normalise(text: str) -> str:
    return re.sub(r"[\s_\-]+", " ", text.lower())


def category_from_error_text(text: str, default: ErrorCategory) -> ErrorCategory:
    """Guess a category from an upstream error's code, type and message."""
    normal = _normalise(text)
    if any(hint in normal for hint in _CONTEXT_HINTS):
        return ErrorCategory.CONTEXT_TOO_LONG
    if any(hint in normal for hint in _QUOTA_HINTS):
        return ErrorCategory.BAD_REQUEST  # retrying cannot fix an empty account
    if any(hint in normal for hint in _RATE_HINTS):
        return ErrorCategory.RATE_LIMITED
    return default


def error_fields(payload: Any) -> tuple[str, str]:
    """(message, code+type text) from the many error shapes servers use.

    Handles ``{"error": {"message", "type", "code"}}``, ``{"error": "text"}``, vLLM's
    ``{"object": "error", "message", ...}`` and FastAPI's ``{"detail": ...}``.
    """
    if isinstance(payload, str):
        return payload, ""
    if not isinstance(payload, dict):
        return "", ""
    inner = payload.get("error", payload)
    if isinstance(inner, str):
        return inner, ""
    if not isinstance(inner, dict):
        return "", ""
    message = inner.get("message") or inner.get("detail") or ""
    if not isinstance(message, str):
        message = json.dumps(message)[:MAX_DETAIL_CHARS]
    codes = " ".join(str(inner.get(key) or "") for key in ("code", "type", "status"))
    return message, codes


def short_detail(message: str) -> str:
    """One line of upstream text, short enough to show to a user; HTML pages are dropped."""
    text = " ".join(message.split())
    if text.startswith("<"):
        return ""
    if len(text) > MAX_DETAIL_CHARS:
        text = text[: MAX_DETAIL_CHARS - 1] + "…"
    return text


def error_from_payload(payload: Any, *, status: int | None = None) -> ProviderError:
    """A :class:`ProviderError` for an error object sent inside a 200 stream or body."""
    message, codes = error_fields(payload)
    category = category_from_error_text(f"{codes} {message}", ErrorCategory.PROVIDER_ERROR)
    if category == ErrorCategory.PROVIDER_ERROR and _mentions_status(codes, 429):
        category = ErrorCategory.RATE_LIMITED
    detail = short_detail(message)
    text = USER_MESSAGES[category]
    if detail:
        text = f"{text.rstrip('.')} ({detail})."
    return ProviderError(category, text, status=status)


def _mentions_status(codes: str, status: int) -> bool:
    return str(status) in codes.split()


def _decode_body(body: bytes | str) -> Any:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        return json.loads(text)
    except ValueError:
        return text


def classify_http_error(
    status: int, body: bytes | str, headers: Mapping[str, str]
) -> ProviderError:
    """Map a non-2xx response to a user-readable :class:`ProviderError`.

    The message may quote the upstream error text; the provider scrubs secrets from it.
    """
    message, codes = error_fields(_decode_body(body))
    hint_text = f"{codes} {message}"
    detail = short_detail(message)
    if status in (401, 403):
        # Never quote the body: providers echo (part of) the rejected key back.
        return ProviderError(
            ErrorCategory.BAD_REQUEST,
            f"The provider rejected the API key (HTTP {status}). Check the provider settings.",
            status=status,
        )
    if status == 404:
        return ProviderError(
            ErrorCategory.BAD_REQUEST,
            "The provider answered 404: the model may not exist, or the base URL is wrong."
            + (f" ({detail})" if detail else ""),
            status=status,
        )
    if status == 429:
        category = category_from_error_text(hint_text, ErrorCategory.RATE_LIMITED)
        if category == ErrorCategory.BAD_REQUEST:
            return _with_detail(category, status, detail or "the account is out of quota")
        return _with_detail(
            ErrorCategory.RATE_LIMITED, status, detail, retry_after=parse_retry_after(headers)
        )
    if status == 408:
        return _with_detail(ErrorCategory.TIMED_OUT, status, detail)
    if status == 413:
        return _with_detail(ErrorCategory.CONTEXT_TOO_LONG, status, detail)
    if status >= 500:
        category = category_from_error_text(hint_text, ErrorCategory.PROVIDER_ERROR)
        if category == ErrorCategory.RATE_LIMITED:
            category = ErrorCategory.PROVIDER_ERROR  # an overloaded server, same retry policy
        return _with_detail(category, status, detail, retry_after=parse_retry_after(headers))
    category = category_from_error_text(hint_text, ErrorCategory.BAD_REQUEST)
    if category == ErrorCategory.RATE_LIMITED:
        category = ErrorCategory.BAD_REQUEST  # a 4xx that merely mentions limits is not a 429
    return _with_detail(category, status, detail)


def _with_detail(
    category: ErrorCategory, status: int, detail: str, *, retry_after: float | None = None
) -> ProviderError:
    base = USER_MESSAGES[category].rstrip(".")
    suffix = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    return ProviderError(category, f"{base} ({suffix}).", status=status, retry_after=retry_after)


def is_retryable(error: ProviderError) -> bool:
    return error.category in RETRYABLE


def retry_delay(
    error: ProviderError, attempt: int, base: float, cap: float, rng: RandomSource | None = None
) -> float:
    """How long to wait before ``attempt``: the server's Retry-After when it gave one."""
    if error.retry_after is not None:
        return min(error.retry_after, RETRY_AFTER_CAP)
    return backoff_delay(attempt, base, cap, rng)
