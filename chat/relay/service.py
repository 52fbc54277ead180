"""The relay's work: admit a request, call the upstream with a pool key, pass its stream on.

``prepare`` (sync) checks the body, the whitelist and the agent, picks the upstream keys
and takes the limits: in the event loop when everything it reads is in the per-process
caches and the limits are in Redis (``ttlcache.offline()``; the hot path), else on the
database thread. ``open_upstream``
sends the request, moving to the next key when one fails before its first byte.
``relay_stream`` passes the upstream's SSE bytes on as they come, cut only at line ends:
each ``data:`` line is looked at (is it JSON-shaped, is it ``[DONE]``, an error, the usage
chunk) but parsed only when it carries usage or an error, or when ``session_key`` needs the
reply's text. ``finish`` hands the one usage record, the limits to settle, the keys' attempts and the
exchange to store to the batch writer (``writer.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import re
import time
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils.translation import gettext
from redis.exceptions import RedisError

from chat import throttle
from chat.apikeys import authenticate_api_key, hash_key
from chat.catalog import ModelChoice, available_models
from chat.core.tokens import estimate_text_tokens, estimate_tokens
from chat.llm import httpclient as upstream_http
from chat.llm.httpclient import Response, UpstreamError
from chat.llm.openai import scrub_secret
from chat.llm.retry import error_fields, parse_retry_after, short_detail
from chat.llm.wire import WireError, messages_from_openai
from chat.models import Agent, ApiKey, UsageRecord
from chat.relay import limits, nowait, pool, quiet, ttlcache
from chat.relay.ttlcache import cached
from chat.relay.writer import Item, writer

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
USER_AGENT = "lyceum-relay/1.0"
# The Chat Completions request fields passed to the upstream; others are dropped unless
# named in LYCEUM_RELAY_PASS_FIELDS. session_key and agent_id are the relay's own.
OPENAI_FIELDS = frozenset(
    [
        "messages",
        "model",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "n",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "seed",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning_effort",
        "modalities",
        "prediction",
        "audio",
        "service_tier",
        "metadata",
        "store",
        "web_search_options",
        "verbosity",
        "functions",
        "function_call",
    ]
)


class RelayError(Exception):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


@dataclass
class Prepared:
    user: Any
    api_key: ApiKey
    choice: ModelChoice
    upstream: pool.Upstream
    body: bytes  # what goes to the upstream
    stream: bool
    admission: limits.Admission | None
    prompt_estimate: int
    session_key: str = ""
    agent_id: str = ""
    user_text: str = ""
    started: float = field(default_factory=time.monotonic)
    model: str = ""  # as the client named it
    policies: list[limits.Policy] = field(default_factory=list)
    cost: int = 0  # tokens held against the budgets
    pooled: Any = None  # pool.pool_of's answer


@dataclass
class Outcome:
    status: str = "failed"  # ok, failed, cancelled
    http_status: int | None = None
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usage_seen: bool = False
    completion_estimate: int = 0
    ttft: float | None = None
    key: pool.PoolKey | None = None
    attempts: list[pool.KeyOutcome] = field(default_factory=list)
    reply_text: str = ""


# --- admission ----------------------------------------------------------------------------------


def authenticate(raw_key: str) -> ApiKey:
    """The key's row (sync; inside ``ttlcache.offline()`` only from memory)."""
    return _key_or_error(cached(("key", hash_key(raw_key)), lambda: authenticate_api_key(raw_key)))


def _key_or_error(key: ApiKey | None) -> ApiKey:
    if key is None:
        raise RelayError(
            401,
            "Incorrect API key provided: send a Lyceum API key as 'Authorization: Bearer <key>'.",
            "authentication_error",
            "invalid_api_key",
        )
    return key


def parse_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_BODY_BYTES:
        raise RelayError(413, "The request body is too large.", code="request_too_large")
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise RelayError(400, "The body must be JSON.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise RelayError(400, "The body must be a JSON object.", code="invalid_json")
    return data


def find_model(name: str) -> ModelChoice:
    choices = cached("models", available_models)
    for choice in choices:
        if choice.alias == name:
            return choice
    for choice in choices:
        if choice.model_id == name and choice.provider_name != "demo":
            return choice
    raise RelayError(
        404,
        f"The model '{name}' does not exist or you do not have access to it.",
        code="model_not_found",
    )


def prepare(api_key: ApiKey, data: dict[str, Any], *, admit: bool = True) -> Prepared:
    """Everything before the upstream call (sync: call on the database thread). With
    ``admit=False`` the limits are not taken: the caller takes them (:func:`admitted`)."""
    user = api_key.user
    session_key = _optional_str(data, "session_key", 200)
    agent_id = _optional_str(data, "agent_id", 64)
    messages = data.get("messages")
    try:
        parsed = messages_from_openai(messages)
    except WireError as exc:
        raise RelayError(400, str(exc), code="invalid_messages") from None
    if not parsed:
        raise RelayError(400, "'messages' must not be empty.", code="invalid_messages")
    if agent_id:
        agent = cached(("agent", agent_id), Agent.objects.filter(slug=agent_id).first)
        if agent is None:
            raise RelayError(404, f"No agent '{agent_id}'.", code="agent_not_found")
        if agent.system_prompt:
            messages = [{"role": "system", "content": agent.system_prompt}, *(messages or [])]
        if not data.get("model"):
            data["model"] = agent.default_model
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise RelayError(400, "'model' is required.", code="missing_model")
    choice = find_model(model)
    if choice.provider_name == "demo":
        raise RelayError(
            404, f"The model '{model}' is not served by the relay.", code="model_not_found"
        )
    stream = data.get("stream") is True
    max_tokens = data.get("max_completion_tokens") or data.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise RelayError(400, "'max_tokens' must be a positive integer.", code="invalid_max_tokens")
    prompt_estimate = estimate_tokens(parsed)
    cost = prompt_estimate + (max_tokens or settings.LYCEUM_RELAY_RESERVE_TOKENS)
    user_text = next((m.content for m in reversed(parsed) if m.role == "user"), "")
    # Everything read before the limits are taken: a cache miss in the event loop
    # (ttlcache.Miss) must leave nothing taken, the database thread then does it all.
    pooled = pool.pool_of(choice.provider_name)
    policies = cached(("limits", api_key.pk), lambda: limits.policies_for(user, api_key))
    passed = set(settings.LYCEUM_RELAY_PASS_FIELDS)
    out = {k: v for k, v in data.items() if k in OPENAI_FIELDS or k in passed}
    out["model"] = choice.model_id
    out["messages"] = messages
    if stream:
        options = out.get("stream_options")
        out["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
    body = json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    prep = Prepared(
        user,
        api_key,
        choice,
        pool.Upstream(pooled[0], pooled[1].rstrip("/"), [], 0.0),  # ordered once admitted
        body,
        stream,
        None,
        prompt_estimate,
        session_key,
        agent_id,
        user_text,
        model=model,
        policies=policies,
        cost=cost,
        pooled=pooled,
    )
    if admit:
        try:
            admitted(prep, limits.admit(policies, cost))
        except limits.Refused as exc:
            raise _refused(prep, exc) from None
        except (RedisError, DatabaseError, OSError) as exc:
            raise _unavailable(prep, exc) from None
    return prep


def admitted(prep: Prepared, admission: limits.Admission) -> None:
    """The request is admitted: it holds ``admission`` and takes the round robin's turn."""
    prep.admission = admission
    prep.upstream = pool.ordered(prep.pooled)  # once per admitted request


def _refused(prep: Prepared, exc: limits.Refused) -> RelayError:
    _record_refusal(
        prep.user, prep.api_key, prep.model, prep.stream, prep.session_key, prep.agent_id, exc
    )
    return RelayError(
        429,
        exc.message,
        "rate_limit_error" if exc.reason == "rate_limit" else "insufficient_quota",
        "rate_limit_exceeded" if exc.reason == "rate_limit" else "insufficient_quota",
        retry_after=exc.retry_after,
    )


UNAVAILABLE_RETRY_AFTER = 2  # seconds


def _unavailable(prep: Prepared, exc: BaseException) -> RelayError:
    """The limits could not be checked: a failed record (nothing reached the upstream, no
    tokens counted) and a 503 the SDKs retry after ``Retry-After``."""
    logger.warning("relay admission failed: %s: %s", type(exc).__name__, exc)
    writer.add(
        Item(_unserved_record(prep, "failed", 503, f"limits unavailable ({type(exc).__name__})"))
    )
    return RelayError(
        503,
        "The relay could not check your limits just now; retry shortly.",
        "api_error",
        "limits_unavailable",
        retry_after=UNAVAILABLE_RETRY_AFTER,
    )


def _unserved_record(prep: Prepared, status: str, http_status: int, error: str) -> UsageRecord:
    return UsageRecord(
        user=prep.user,
        api_key=prep.api_key,
        model=prep.model[:200],
        stream=prep.stream,
        status=status,
        http_status=http_status,
        error=error[:200],
        session_key=prep.session_key,
        agent_id=prep.agent_id,
        latency_ms=int((time.monotonic() - prep.started) * 1000),
    )


def _optional_str(data: dict[str, Any], name: str, limit: int) -> str:
    value = data.pop(name, None)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit:
        raise RelayError(400, f"'{name}' must be a string of at most {limit} characters.")
    return value


def _record_refusal(
    user: Any,
    api_key: ApiKey,
    model: str,
    stream: bool,
    session_key: str,
    agent_id: str,
    exc: limits.Refused,
) -> None:
    writer.add(
        Item(
            UsageRecord(
                user=user,
                api_key=api_key,
                model=model[:200],
                stream=stream,
                status="refused",
                http_status=429,
                error=exc.reason,
                session_key=session_key,
                agent_id=agent_id,
                latency_ms=0,
            )
        )
    )


# --- the upstream ---------------------------------------------------------------------------------

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, upstream_http.Client] = (
    weakref.WeakKeyDictionary()
)


def client() -> upstream_http.Client:
    """One upstream client (and connection pool) per event loop (``chat/llm/httpclient.py``)."""
    loop = asyncio.get_running_loop()
    kept = _clients.get(loop)
    if kept is None:
        # Spare connections opened in quiet moments: an upstream that closes every
        # connection (or a pool emptied by a burst) costs the next request no connect.
        kept = _clients[loop] = upstream_http.Client(
            settings.LYCEUM_CONNECT_TIMEOUT, settings.LYCEUM_RELAY_TIMEOUT, spare_when=quiet.moment
        )
    return kept


async def close_clients() -> None:
    for kept in list(_clients.values()):
        await kept.aclose()
    _clients.clear()


def _scrub(text: str, keys: list[pool.PoolKey]) -> str:
    for key in keys:
        text = scrub_secret(text, key.secret)
    return text


async def open_upstream_recorded(prep: Prepared, outcome: Outcome) -> Response:
    """:func:`open_upstream`; a request that fails or is cancelled before the upstream
    answered still leaves its usage record (the relay's two front doors share this)."""
    try:
        return await open_upstream(prep, outcome)
    except BaseException as exc:
        if isinstance(exc, RelayError):
            outcome.http_status, outcome.error = exc.status, exc.message
        elif isinstance(exc, asyncio.CancelledError):
            outcome.status, outcome.error = "cancelled", "the client disconnected"
        finish(prep, outcome)
        raise


async def open_upstream(prep: Prepared, outcome: Outcome) -> Response:
    """The upstream's 200 response (headers read), trying the pool's keys in turn."""
    up = prep.upstream
    if not up.keys:
        raise RelayError(
            429,
            "Every upstream key is cooling down; retry shortly.",
            "rate_limit_error",
            "upstream_rate_limited",
            retry_after=max(1, int(up.cooling_for + 0.999)),
        )
    url = f"{up.base_url}/chat/completions"
    last: RelayError | None = None
    for key in up.keys:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Accept": "text/event-stream" if prep.stream else "application/json",
            "Accept-Encoding": "identity",
        }
        if key.secret:
            headers["Authorization"] = f"Bearer {key.secret}"
        try:
            async with asyncio.timeout(settings.LYCEUM_RELAY_FIRST_BYTE_TIMEOUT):
                response = await client().post(url, prep.body, headers)
        except TimeoutError:
            outcome.attempts.append(pool.KeyOutcome(key, None, True, "first byte timeout"))
            last = RelayError(
                504, "The upstream did not answer in time.", "api_error", "upstream_timeout"
            )
            continue
        except UpstreamError as exc:
            outcome.attempts.append(pool.KeyOutcome(key, None, True, type(exc).__name__))
            last = RelayError(
                502, "The upstream could not be reached.", "api_error", "upstream_unreachable"
            )
            continue
        status = response.status_code
        if status == 200:
            outcome.key = key
            outcome.attempts.append(pool.KeyOutcome(key, 200, False))
            return response
        try:
            async with asyncio.timeout(settings.LYCEUM_RELAY_IDLE_TIMEOUT):
                raw = await response.aread()
        except (UpstreamError, TimeoutError):
            raw = b""
        finally:
            await response.aclose()
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw.decode("utf-8", "replace")
        message = (
            short_detail(_scrub(error_fields(payload)[0], up.keys))
            if status not in (401, 403)
            else ""
        )
        cooled = status in (401, 403, 429)
        if cooled:
            wait = parse_retry_after(response.headers) if status == 429 else None
            pool.cool_down(key, max(wait or 0, settings.LYCEUM_RELAY_KEY_COOLDOWN))
        outcome.attempts.append(
            pool.KeyOutcome(key, status, True, message or f"HTTP {status}", cooled)
        )
        if status == 429:
            last = RelayError(
                429,
                "The upstream is rate limiting; retry shortly.",
                "rate_limit_error",
                "upstream_rate_limited",
                retry_after=int(settings.LYCEUM_RELAY_KEY_COOLDOWN) or 1,
            )
        elif status in (401, 403):
            last = RelayError(
                502, "The upstream refused the relay's credentials.", "api_error", "upstream_auth"
            )
        elif status >= 500 or status in (408, 409):
            last = RelayError(
                502, f"The upstream failed (HTTP {status}).", "api_error", "upstream_error"
            )
        else:  # the request itself is wrong: another key would not help
            client_status = status if status in (400, 413, 422) else 400
            raise RelayError(
                client_status,
                message or f"The upstream refused the request (HTTP {status}).",
                code="upstream_bad_request",
            )
    assert last is not None
    raise last


# --- streaming ------------------------------------------------------------------------------------


# OpenAI sends "usage": null in every chunk when include_usage is on: those need no parsing.
_NULL_USAGE = re.compile(rb'"usage"\s*:\s*null')


class StreamScanner:
    """Cuts the upstream's bytes at line ends and notes what the relay needs from them."""

    def __init__(self, capture_text: bool) -> None:
        self.pending = b""
        self.capture_text = capture_text
        self.text: list[str] = []
        self.done = False
        self.failed = ""  # an error the upstream sent in the stream
        self.malformed = False
        self.content_events = 0
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes) -> bytes:
        """The complete lines of ``pending + data``, up to any malformed one."""
        buf = self.pending + data if self.pending else data
        end = buf.rfind(b"\n")
        if end < 0:
            self.pending = buf
            return b""
        self.pending = buf[end + 1 :]
        out = buf[: end + 1]
        start = 0
        for line in out.split(b"\n"):
            if line.startswith(b"data:"):
                if not self._data(line[5:].strip()):
                    self.malformed = True
                    self.pending = b""
                    return out[:start]
            elif line.startswith(b"event:") and line[6:].strip() == b"error":
                self.failed = self.failed or "the upstream sent an error event"
            start += len(line) + 1
        return out

    def _data(self, payload: bytes) -> bool:
        if payload == b"[DONE]":
            self.done = True
            return True
        if not (payload.startswith(b"{") and payload.endswith(b"}")):
            return False
        self.content_events += 1
        if not (
            self.capture_text
            or (b'"usage"' in payload and not _NULL_USAGE.search(payload))
            or payload.startswith(b'{"error"')
        ):
            return True
        try:
            chunk = json.loads(payload)
        except ValueError:
            return False
        self.take(chunk)
        return True

    def take(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        if chunk.get("error"):
            message = error_fields(chunk)[0]
            self.failed = short_detail(message) or "the upstream sent an error"
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if self.capture_text:
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict) and choice.get("index", 0) == 0:
                    delta = choice.get("delta") or {}
                    content = delta.get("content") if isinstance(delta, dict) else None
                    if isinstance(content, str):
                        self.text.append(content)


def error_event(message: str, code: str, type_: str = "api_error") -> bytes:
    body = {"error": {"message": message, "type": type_, "code": code}}
    return b"data: " + json.dumps(body).encode("utf-8") + b"\n\n"


async def relay_stream(
    prep: Prepared,
    response: Response,
    outcome: Outcome,
    done: asyncio.Future[None] | None = None,
) -> AsyncGenerator[bytes, None]:
    """The upstream's SSE bytes for the client; the outcome is recorded however it ends."""
    scanner = StreamScanner(capture_text=bool(prep.session_key))
    idle = settings.LYCEUM_RELAY_IDLE_TIMEOUT
    network: Any = response.network
    interval = settings.LYCEUM_RELAY_READ_INTERVAL
    paced = interval > 0 and network is not None
    if paced:  # one read per interval carries every token that arrived meanwhile
        network.pace_reads(interval)
    reads = response.aiter_body(idle).__aiter__()
    outcome.http_status = 200
    tail = b""
    held: list[bytes] = []  # complete lines kept while the next event is already here
    held_size = 0
    try:
        while not scanner.done:
            try:
                data = await reads.__anext__()  # TimeoutError after `idle` without a byte
            except StopAsyncIteration:
                break
            out = scanner.feed(data)
            if out:
                held.append(out)
                held_size += len(out)
                if held_size < HOLD_BYTES and response.pending():
                    continue  # one send for every event of one read, not one per event
                if outcome.ttft is None:
                    outcome.ttft = time.monotonic() - prep.started
                yield b"".join(held)
                held.clear()
                held_size = 0
            if scanner.malformed:
                break
        if scanner.malformed:
            outcome.error = "the upstream sent a malformed event"
            tail = error_event("The upstream sent a malformed event.", "upstream_malformed")
        elif scanner.failed:
            outcome.error = scanner.failed
        elif not scanner.done:
            outcome.error = "the upstream stream ended before [DONE]"
            tail = error_event("The upstream's stream ended early.", "upstream_incomplete")
        else:
            outcome.status = "ok"
    except TimeoutError:
        outcome.error = "the upstream stalled"
        tail = error_event("The upstream stopped sending (timed out).", "upstream_timeout")
    except UpstreamError as exc:
        outcome.error = f"the connection to the upstream was lost ({type(exc).__name__})"
        tail = error_event("The connection to the upstream was lost.", "upstream_disconnected")
    except (asyncio.CancelledError, GeneratorExit):
        outcome.status, outcome.error = "cancelled", "the client disconnected"
        raise
    finally:
        if paced:
            network.pace_reads(0.0)
        _stream_outcome(outcome, scanner, prep)
        background(_close_and_finish(response, prep, outcome, done))
    if held or tail:
        if held and outcome.ttft is None:
            outcome.ttft = time.monotonic() - prep.started
        yield b"".join(held) + tail


HOLD_BYTES = 64 * 1024


def _stream_outcome(outcome: Outcome, scanner: StreamScanner, prep: Prepared) -> None:
    outcome.reply_text = "".join(scanner.text)
    _usage_into(outcome, scanner.usage)
    if scanner.capture_text:
        outcome.completion_estimate = estimate_text_tokens(outcome.reply_text)
    else:
        outcome.completion_estimate = scanner.content_events


def _usage_into(outcome: Outcome, usage: Any) -> None:
    if isinstance(usage, dict):
        outcome.usage_seen = True
        outcome.prompt_tokens = _int(usage.get("prompt_tokens"))
        outcome.completion_tokens = _int(usage.get("completion_tokens"))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


_background: set[asyncio.Task[Any]] = set()


def background(coro: Any) -> None:
    """Run ``coro`` beyond the request: in a fresh context, so its database calls go to the
    process's own database thread, not to the finished request's executor."""
    task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _close_and_finish(
    response: Response, prep: Prepared, outcome: Outcome, done: asyncio.Future[None] | None
) -> None:
    try:
        await response.aclose()
    except Exception:  # noqa: BLE001 - the upstream is gone either way
        logger.debug("closing the upstream response failed", exc_info=True)
    try:
        finish(prep, outcome)
    finally:
        if done is not None and not done.done():
            done.set_result(None)


# --- non-streaming ----------------------------------------------------------------------------


async def relay_once(prep: Prepared, response: Response, outcome: Outcome) -> bytes:
    try:
        async with asyncio.timeout(settings.LYCEUM_RELAY_TIMEOUT):
            raw = await response.aread()
    except TimeoutError:
        raise RelayError(
            504, "The upstream did not finish in time.", "api_error", "upstream_timeout"
        ) from None
    except UpstreamError:
        raise RelayError(
            502, "The connection to the upstream was lost.", "api_error", "upstream_disconnected"
        ) from None
    finally:
        await response.aclose()
    try:
        body = json.loads(raw)
    except ValueError:
        raise RelayError(
            502, "The upstream sent a malformed reply.", "api_error", "upstream_malformed"
        ) from None
    outcome.http_status = 200
    outcome.ttft = time.monotonic() - prep.started
    if isinstance(body, dict):
        _usage_into(outcome, body.get("usage"))
        if body.get("error"):
            outcome.error = short_detail(error_fields(body)[0]) or "upstream error"
        else:
            outcome.status = "ok"
        choices = body.get("choices") or []
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            outcome.reply_text = message["content"]
    outcome.completion_estimate = estimate_text_tokens(outcome.reply_text)
    return raw


# --- the record -------------------------------------------------------------------------------


def finish(prep: Prepared, outcome: Outcome) -> UsageRecord:
    """The usage record (unsaved), handed to the writer with the limits to settle, the key
    records and the exchange to store; they are written with the next batch."""
    estimated = not outcome.usage_seen
    prompt = prep.prompt_estimate if estimated else outcome.prompt_tokens
    completion = outcome.completion_estimate if estimated else outcome.completion_tokens
    latency = time.monotonic() - prep.started
    record = UsageRecord(
        user=prep.user,
        api_key=prep.api_key,
        model=prep.choice.alias,
        provider=prep.choice.provider_name,
        provider_key_id=outcome.key.key_id if outcome.key else None,
        stream=prep.stream,
        status=outcome.status,
        http_status=outcome.http_status,
        error=outcome.error[:200],
        prompt_tokens=prompt,
        completion_tokens=completion,
        estimated=estimated,
        latency_ms=int(latency * 1000),
        ttft_ms=None if outcome.ttft is None else int(outcome.ttft * 1000),
        session_key=prep.session_key,
        agent_id=prep.agent_id,
    )
    exchange = None
    if prep.session_key and outcome.status == "ok":
        exchange = (
            prep.user,
            prep.session_key,
            prep.user_text,
            outcome.reply_text,
            prep.choice.alias,
        )
    writer.add(Item(record, prep.admission, prompt + completion, list(outcome.attempts), exchange))
    return record


async def authenticated(raw_key: str, address: str = "") -> ApiKey:
    """The key from memory in the event loop when held, else loaded once on the database
    thread for every request that asks for it meanwhile. No key, no lookup; an address
    shut for sending bad keys (``chat/throttle.py``) gets none either, unless its key is
    held in memory as a good one."""
    from channels.db import database_sync_to_async

    if not raw_key:
        return _key_or_error(None)
    writer.ensure_running()
    ttlcache.ensure_keeper()
    name = ("key", hash_key(raw_key))
    hit, key = ttlcache.peek(name, lambda: authenticate_api_key(raw_key))
    if hit and key is not None:
        return key
    _refuse_if_shut(throttle.key_door_shut(address))
    if not hit:
        if settings.LYCEUM_RELAY_CACHE_SECONDS <= 0:
            key = await database_sync_to_async(authenticate_api_key)(raw_key)
        else:
            key = await ttlcache.fill(name, lambda: authenticate_api_key(raw_key))
    if key is None:
        _refuse_if_shut(await database_sync_to_async(throttle.bad_key)(address))
    return _key_or_error(key)


def _refuse_if_shut(locked: throttle.Locked | None) -> None:
    if locked is not None:
        raise RelayError(
            429,
            gettext(
                "Too many requests with a wrong API key from your address; try again in %(s)d s."
            )
            % {"s": locked.retry_after},
            "rate_limit_error",
            "rate_limit_exceeded",
            retry_after=locked.retry_after,
        )


def _warm(api_key: ApiKey, data: dict[str, Any], miss: ttlcache.Miss) -> bool:
    """Load into the caches what :func:`prepare` reads (sync, the database thread)."""
    assert miss.load is not None
    cached(miss.key, miss.load)
    try:
        agent_id, model = data.get("agent_id"), data.get("model")
        if isinstance(agent_id, str) and agent_id:
            agent = cached(("agent", agent_id), Agent.objects.filter(slug=agent_id).first)
            model = model or (agent.default_model if agent else None)
        if isinstance(model, str) and model:
            pool.pool_of(find_model(model).provider_name)
        cached(("limits", api_key.pk), lambda: limits.policies_for(api_key.user, api_key))
    except Exception:  # noqa: BLE001 - prepare itself answers what is wrong
        logger.debug("warming the relay's caches failed", exc_info=True)
    return True


async def prepared(api_key: ApiKey, data: dict[str, Any]) -> Prepared:
    """:func:`prepare` in the event loop when everything it reads is in memory and the
    limits are in Redis; what is missing is loaded once on the database thread (however
    many requests miss it together) and the request tried again. The limits in SQLite:
    admitted here too when that needs no wait (``nowait.py``), else (or in PostgreSQL)
    only the admission on the database thread. A budget to seed in Redis: the whole of it
    on the database thread.

    In the event loop the admission script is sent to Redis, the upstream connected
    meanwhile (unless a kept connection waits), and then Redis's answer read: the two
    round trips overlap."""
    from channels.db import database_sync_to_async

    for _ in range(6):  # agent, models, pool, limits: each filled at most once
        try:
            with ttlcache.offline():
                prep = prepare(api_key, dict(data), admit=False)  # pops the relay's fields
        except ttlcache.Miss as miss:
            if miss.load is None:
                break
            # Everything prepare reads, loaded in one trip (entries expire together).
            warm = functools.partial(_warm, api_key, data, miss)
            await ttlcache.fill(("warm", miss.key), warm, keep=False)
            continue
        pending = limits.admit_later(prep.policies, prep.cost)
        if pending is None:  # the limits in the database
            try:  # in the event loop when that needs no wait (chat/relay/nowait.py)
                now = nowait.admit(prep.policies, prep.cost)
            except limits.Refused as exc:
                raise _refused(prep, exc) from None
            if now is None:
                return await _admitted_by_database(prep)
            admitted(prep, now)
            return prep
        try:
            await client().warm(f"{prep.upstream.base_url}/chat/completions")
            admission = await pending.result()
        except limits.Refused as exc:
            raise _refused(prep, exc) from None
        except limits.Unavailable as exc:
            raise _unavailable(prep, exc) from None
        except BaseException:  # cancelled: recorded, and what it took given back, once answered
            pending.add_done_callback(functools.partial(_abandoned, prep))
            raise
        if admission is None:
            break  # a budget to seed from the records: the database thread's work
        admitted(prep, admission)
        return prep
    return await database_sync_to_async(prepare)(api_key, data)


async def _admitted_by_database(prep: Prepared) -> Prepared:
    """``prep``'s admission on the database thread (a locked transaction; the rest of
    :func:`prepare` was done in the event loop), the upstream connected meanwhile: the two
    overlap, as with Redis."""
    from channels.db import database_sync_to_async

    admitting = asyncio.ensure_future(
        database_sync_to_async(limits.admit)(prep.policies, prep.cost)
    )
    try:
        await client().warm(f"{prep.upstream.base_url}/chat/completions")
        # Shielded: the thread admits whatever happens here, and its answer must be taken.
        admission = await asyncio.shield(admitting)
    except limits.Refused as exc:
        raise _refused(prep, exc) from None
    except (RedisError, DatabaseError, OSError) as exc:
        raise _unavailable(prep, exc) from None
    except asyncio.CancelledError:  # recorded, and what it took given back, once admitted
        admitting.add_done_callback(functools.partial(_abandoned_in_database, prep))
        raise
    admitted(prep, admission)
    return prep


def _abandoned_in_database(prep: Prepared, admitting: asyncio.Future) -> None:
    """The request went away while the database thread admitted it: one record, and what
    the admission took given back."""
    if admitting.cancelled():
        return
    failure = admitting.exception()
    if isinstance(failure, limits.Refused):
        _refused(prep, failure)
        return
    if failure is not None:
        if isinstance(failure, (RedisError, DatabaseError, OSError)):
            _unavailable(prep, failure)
        return
    admitted(prep, admitting.result())
    finish(prep, Outcome(status="cancelled", error="the client disconnected"))


def _abandoned(prep: Prepared, pending: limits.Pending) -> None:
    """The request went away while its admission was on its way: one record, and what the
    admission took given back (settled with the record)."""
    try:
        admission = pending.answer()
    except limits.Refused as exc:
        _refused(prep, exc)
        return
    except limits.Unavailable:
        admission = None
    if admission is not None:
        admitted(prep, admission)
    finish(prep, Outcome(status="cancelled", error="the client disconnected"))


def list_models() -> list[dict[str, Any]]:
    """What the relay serves: the whitelist without the offline demo models."""
    from chat.models import ProviderModel

    rows = {r.alias: r for r in ProviderModel.objects.filter(enabled=True, provider__enabled=True)}
    out = []
    for choice in available_models():
        if choice.provider_name == "demo":
            continue
        row = rows.get(choice.alias)
        out.append(
            {
                "id": choice.alias,
                "object": "model",
                "created": 0,
                "owned_by": choice.provider_name,
                "provider_id": choice.provider_name,
                "context_window": choice.context_window,
                "max_output_tokens": row.max_output_tokens if row else None,
                "supports_streaming": True,
                "supports_vision": bool(row and row.accepts_images),
            }
        )
    return out
