"""The OpenAI-compatible provider (OpenAI, vLLM, Ollama, llama.cpp, DeepSeek, …).

This module is the HTTP side: timeouts, retries, errors, the client. What goes over the
wire (the request payload, the chunk dicts and what they mean) is ``wire.py``; the SSE
framing is ``sse.py``.

Decisions worth knowing:

* The requests go over ``httpclient.py``'s own HTTP/1.1 client (the relay's too): a read
  of the network is de-chunked in one pass and handed to the SSE decoder whole, where
  httpx turned each HTTP chunk (one a token) into an h11 event passed up through four
  async generators, about half the provider's CPU per streamed token. httpx is kept for
  what that client does not do: a proxy set in the environment, a client passed in, and
  ``transport="asyncio"`` (httpx on ``netbackend.AsyncioTransport``) or ``"stock"``
  (httpx's own transport) when asked for (``bench/bench_stock_paths.py``).

* One provider serves many requests: its connection pool (or httpx client) is built on
  first use and kept; ``aclose()`` closes it, and a later request builds a new one. A
  pool belongs to one event loop: used from another loop, the provider builds a new
  one and drops the old one (it cannot be closed from the new loop).

* Three separately configurable timeouts: ``connect_timeout``, ``first_byte_timeout``
  (request sent → headers and the first body bytes arrived) and ``idle_timeout`` (no bytes
  at all for that long; SSE keep-alive comments count as bytes). The last two use
  ``asyncio.timeout`` around each read, not httpx's read timeout.
* Retries (jittered exponential backoff, or the server's Retry-After) happen only while
  nothing has been streamed to the caller, for the categories in ``retry.RETRYABLE``.
  A ``Retrying`` chunk is yielded before each retry.
* After the first delta, any failure raises ``ProviderError(streamed=True)``. A connection
  that breaks mid-reply is UNREACHABLE ("the connection … was lost"): it is a network
  failure, not something the provider said; a stall is TIMED_OUT.
* Error messages are scrubbed of the API key (and of long pieces of it, since providers
  echo masked keys back), and 401/403 bodies are never quoted.
* The response is held in ``async with`` blocks, so cancelling the consuming task or
  closing the generator closes the upstream connection at once (a response read to its
  end goes back to the pool instead).
* With httpx, the client this provider creates runs on ``netbackend.AsyncioTransport``
  (plain asyncio instead of anyio underneath httpcore), unless the environment configures
  a proxy: then the stock transport is kept (httpx handles proxies only there).
* ``read_interval`` paces the network reads of a streamed body (``AsyncioStream.pace_reads``):
  providers send one packet per token, and reading each the moment it landed cost a
  wake-up and a trip through the HTTP client and the SSE decoder per token, while the page
  shows new text only once per push interval anyway. Text left in the socket buffer
  until the next read is no later on the page: at 30 tokens/s and a read every 0.1 s,
  one read carries three tokens, for about a third of the cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import random
import re
import socket
import ssl
import weakref
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import httpx

from chat.llm import httpclient
from chat.llm.netbackend import AsyncioTransport, environment_proxy_for
from chat.llm.retry import (
    RandomSource,
    classify_http_error,
    error_from_payload,
    is_retryable,
    retry_delay,
)
from chat.llm.sse import SSEDecoder
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    ProviderError,
    RetryCallback,
    Retrying,
    StreamChunk,
    StreamEnd,
)
from chat.llm.wire import (
    ChunkDecoder,
    ContentChunk,
    StreamAccumulator,
    build_payload,
    completion_to_chunk,
    merge_deltas,
)

T = TypeVar("T")

REDACTED = "[redacted]"
MAX_ERROR_BODY = 64 * 1024  # enough for any error JSON; more is a misbehaving server
MAX_JSON_BODY = 32 * 1024 * 1024
DRAIN_TIMEOUT = 0.25  # after [DONE], how long to wait for the end of the HTTP body
MAX_DRAIN_BYTES = 64 * 1024
# How requests go: "lean" httpclient.py (httpx when a proxy is set), "asyncio" httpx on
# netbackend.py, "stock" httpx's own transport. See _pool() and _client().
TRANSPORTS = frozenset({"lean", "asyncio", "stock"})


def scrub_secret(text: str, secret: str, min_run: int = 8) -> str:
    """Hide ``secret`` in ``text``, and any run of 8+ characters of it (echoed masked keys)."""
    if len(secret) < 4 or not text:
        return text  # a secret this short cannot be searched for without mangling words
    text = text.replace(secret, REDACTED)
    if len(secret) < 2 * min_run:
        return text
    pieces = {secret[i : i + min_run] for i in range(len(secret) - min_run + 1)}
    out: list[str] = []
    index = 0
    while index < len(text):
        if text[index : index + min_run] in pieces:
            end = index + min_run
            while end < len(text) and text[index : end + 1] in secret:
                end += 1
            out.append(REDACTED)
            index = end
        else:
            out.append(text[index])
            index += 1
    return "".join(out)


def _network_reason(exc: BaseException) -> str:
    """The operating system's reason under an httpx failure, in plain words ("" if none)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for candidate in (current, *current.args):
            if isinstance(candidate, socket.gaierror):
                return "the host name could not be resolved"
            if isinstance(candidate, ssl.SSLError):
                return "the TLS handshake failed"
            if isinstance(candidate, OSError) and candidate.errno in _ERRNO_REASONS:
                return _ERRNO_REASONS[candidate.errno]
        current = current.__cause__ or current.__context__
    return ""


_ERRNO_REASONS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.EHOSTUNREACH: "no route to the host",
    errno.ENETUNREACH: "the network is unreachable",
    errno.ETIMEDOUT: "connection timed out",
}


def _transport_error(exc: Exception) -> ProviderError:
    """httpx or httpclient failure → category. Never quotes their text: it may carry URLs
    or headers. The two name their failures alike, so the messages are the same."""
    kind = type(exc).__name__
    reason = _network_reason(exc)
    if isinstance(exc, httpx.ConnectTimeout | httpclient.ConnectTimeout):
        return ProviderError(
            ErrorCategory.UNREACHABLE,
            f"The model provider could not be reached (connection timed out, {kind}).",
            detail="connection timed out",
        )
    if isinstance(exc, httpx.ConnectError | httpclient.ConnectError):
        return ProviderError(
            ErrorCategory.UNREACHABLE,
            f"The model provider could not be reached ({reason or kind}).",
            detail=reason,
        )
    if isinstance(exc, httpx.TimeoutException):
        return ProviderError(ErrorCategory.TIMED_OUT, f"{_msg(ErrorCategory.TIMED_OUT)} ({kind})")
    if isinstance(
        exc,
        httpx.UnsupportedProtocol
        | httpx.InvalidURL
        | httpx.LocalProtocolError
        | httpclient.InvalidURL,
    ):
        return ProviderError(
            ErrorCategory.BAD_REQUEST,
            f"The provider's base URL or settings are not valid ({kind}).",
        )
    return ProviderError(
        ErrorCategory.UNREACHABLE,
        f"The connection to the model provider was lost ({kind}).",
        detail=reason,
    )


def _msg(category: ErrorCategory) -> str:
    return ProviderError(category).message


# --- the provider -----------------------------------------------------------------------


class OpenAIProvider:
    """Streams chat completions from an OpenAI-compatible ``/chat/completions`` endpoint."""

    def __init__(
        self,
        name: str,
        base_url: str,
        api_key: str,
        *,
        connect_timeout: float = 10.0,
        first_byte_timeout: float = 60.0,
        idle_timeout: float = 60.0,
        complete_timeout: float = 300.0,
        max_retries: int = 3,
        backoff_base: float = 1.0,
        backoff_cap: float = 30.0,
        client: httpx.AsyncClient | None = None,
        user_agent: str = "Lyceum/0.1",
        rng: RandomSource | None = None,
        read_interval: float = 0.0,
        transport: str = "lean",
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {sorted(TRANSPORTS)}, not {transport!r}")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key.strip()
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.idle_timeout = idle_timeout
        self.complete_timeout = complete_timeout  # a whole non-streamed reply
        self.read_interval = read_interval
        self.transport = transport  # see TRANSPORTS
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.user_agent = user_agent
        self._rng = rng or random.Random()
        self._given_client = client
        self._own_client: httpx.AsyncClient | None = None
        self._own_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._own_pool: httpclient.Pool | None = None  # the lean client's, for _pool_loop
        self._pool_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        # Decided once: requests go over the lean client (else httpx, see _pool()).
        self._lean = (
            transport == "lean" and client is None and not environment_proxy_for(self.base_url)
        )
        # read/write are bounded by our own asyncio deadlines; httpx handles connect.
        self._timeout = httpx.Timeout(
            connect=connect_timeout, read=None, write=None, pool=connect_timeout
        )

    def __repr__(self) -> str:  # the key stays out of logs and tracebacks
        return f"OpenAIProvider(name={self.name!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        """Close the pool or client this provider created (a client passed in is the caller's).

        The provider stays usable: the next request builds a new one. One built in another
        event loop cannot be closed from this one; it is only dropped.
        """
        pool, self._own_pool = self._own_pool, None
        pool_owner = self._pool_loop() if self._pool_loop is not None else None
        self._pool_loop = None
        if pool is not None and pool_owner is asyncio.get_running_loop():
            await pool.aclose()
        client, self._own_client = self._own_client, None
        owner = self._own_loop() if self._own_loop is not None else None
        self._own_loop = None
        if client is None or client.is_closed:
            return
        if owner is asyncio.get_running_loop():
            await client.aclose()

    # --- public API -------------------------------------------------------------------

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamChunk]:
        payload = build_payload(request, stream=True)
        attempt = 0
        while True:
            accumulator = StreamAccumulator()
            try:
                async with contextlib.aclosing(self._stream_once(payload, accumulator)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                return
            except ProviderError as error:
                failure = self._public_error(error, streamed=accumulator.produced_content)
                retry = None if failure.streamed else self._plan_retry(failure, attempt)
                if retry is None:
                    raise failure from None
            attempt = retry.attempt
            yield retry
            await asyncio.sleep(retry.delay)

    async def complete(
        self, request: ChatRequest, *, on_retry: RetryCallback | None = None
    ) -> StreamEnd:
        payload = build_payload(request, stream=False)

        async def once() -> StreamEnd:
            data = await self._fetch_json(
                "POST", "/chat/completions", payload, self.complete_timeout
            )
            accumulator = StreamAccumulator()
            accumulator.add(completion_to_chunk(data))
            return accumulator.finish()

        return await self._with_retries(once, on_retry)

    async def list_models(self) -> list[str]:
        async def once() -> list[str]:
            data = await self._fetch_json("GET", "/models", None, self.first_byte_timeout)
            entries = data.get("data") if isinstance(data, dict) else data
            if not isinstance(entries, list):
                raise ProviderError(
                    ErrorCategory.MALFORMED_STREAM, "The model list could not be read."
                )
            ids = {
                str(entry["id"]) for entry in entries if isinstance(entry, dict) and entry.get("id")
            }
            return sorted(ids)

        return await self._with_retries(once, None)

    # --- one streamed attempt -----------------------------------------------------------

    async def _stream_once(
        self, payload: dict[str, Any], accumulator: StreamAccumulator
    ) -> AsyncGenerator[StreamChunk, None]:
        """Yield deltas while the response is open, then close it and yield ``StreamEnd``."""
        sse = SSEDecoder()
        decoder = ChunkDecoder()
        loop = asyncio.get_running_loop()
        first_byte_deadline = loop.time() + self.first_byte_timeout
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    async with asyncio.timeout_at(first_byte_deadline):
                        response = await self._open(stack, "POST", "/chat/completions", payload)
                except TimeoutError:
                    raise self._first_byte_timeout_error() from None
                network: Any = response.network
                if self.read_interval > 0 and hasattr(network, "pace_reads"):
                    network.pace_reads(self.read_interval)
                    stack.callback(network.pace_reads, 0.0)  # before it goes back to the pool
                if _is_json(response):
                    # The server ignored stream=true and answered with one JSON body.
                    data = await self._read_json(response, first_byte_deadline)
                    for chunk in accumulator.add(completion_to_chunk(data)):
                        yield chunk
                    decoder.done = True
                else:
                    reads = _body(response)
                    with ReadWatch(first_byte_deadline, self.idle_timeout) as watch:
                        while not decoder.done:
                            data = await self._read_some(watch, reads)
                            events = sse.feed(data) if data else sse.close()
                            # A read's deltas go on merged (wire.merge_deltas); those
                            # before an event that fails still go out before it raises.
                            deltas: list[ContentChunk] = []
                            try:
                                for chunk_dict in decoder.decode_each(events):
                                    deltas += accumulator.add(chunk_dict)
                            except Exception:
                                for chunk in merge_deltas(deltas):
                                    yield chunk
                                raise
                            for chunk in merge_deltas(deltas):
                                yield chunk
                            if not data:
                                break
                    if data:
                        await _drain_after_done(reads)
        except (httpx.HTTPError, httpclient.UpstreamError) as exc:
            raise _transport_error(exc) from None
        # The upstream response is closed before the caller sees the end of the reply.
        yield accumulator.finish(saw_done=decoder.done)

    async def _read_some(self, watch: ReadWatch, reads: AsyncIterator[bytes]) -> bytes:
        """Next bytes of the body (b"" at the end), within the first-byte or idle deadline."""
        try:
            return await watch.read(reads)
        except TimeoutError:
            if not watch.started:
                raise self._first_byte_timeout_error() from None
            raise ProviderError(
                ErrorCategory.TIMED_OUT,
                f"The model provider stopped sending for {self.idle_timeout:g} s.",
            ) from None

    def _first_byte_timeout_error(self) -> ProviderError:
        return ProviderError(
            ErrorCategory.TIMED_OUT,
            f"The model provider did not start answering within {self.first_byte_timeout:g} s.",
        )

    # --- HTTP plumbing ------------------------------------------------------------------

    async def _open(
        self,
        stack: contextlib.AsyncExitStack,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
    ) -> _Response:
        """Send the request; raise a classified error for any non-2xx answer."""
        streaming = bool(payload and payload.get("stream"))
        response: _Response
        if self._lean:
            headers = self._headers(streaming)
            headers["Accept-Encoding"] = "identity"  # nothing to decode (httpx asks for gzip)
            body = None
            if payload is not None:
                headers["Content-Type"] = "application/json"
                body = _json_body(payload)
            url = self.base_url + path
            try:
                response = await self._pool().request(method, url, body, headers)
            except httpclient.UpstreamError as exc:
                raise _transport_error(exc) from None
            stack.push_async_callback(response.aclose)
        else:
            try:
                raw = await stack.enter_async_context(
                    self._client().stream(
                        method,
                        self.base_url + path,
                        json=payload,
                        headers=self._headers(streaming),
                        timeout=self._timeout,
                    )
                )
            except httpx.InvalidURL as exc:
                raise _transport_error(exc) from None
            response = _HttpxResponse(raw)
        status = response.status_code
        if 200 <= status < 300:
            content_type = response.headers.get("content-type", "").lower()
            if content_type.startswith("text/html"):
                # Typically a base URL pointing at a web UI instead of its API.
                raise ProviderError(
                    ErrorCategory.BAD_REQUEST,
                    "The provider answered with a web page instead of an API reply; "
                    "check the base URL.",
                    status=status,
                )
            return response
        error_body = await _read_limited(response, MAX_ERROR_BODY)
        if status in (301, 302, 303, 307, 308) and "location" in response.headers:
            raise ProviderError(
                ErrorCategory.BAD_REQUEST,
                f"The provider answered with a redirect (HTTP {status}); check the base URL.",
                status=status,
            )
        raise classify_http_error(status, error_body, response.headers)

    async def _fetch_json(
        self, method: str, path: str, payload: dict[str, Any] | None, timeout: float
    ) -> Any:
        try:
            async with asyncio.timeout(timeout), contextlib.AsyncExitStack() as stack:
                response = await self._open(stack, method, path, payload)
                return await self._read_json(response, None)
        except TimeoutError:
            raise ProviderError(
                ErrorCategory.TIMED_OUT,
                f"The model provider did not answer within {timeout:g} s.",
            ) from None
        except (httpx.HTTPError, httpclient.UpstreamError) as exc:
            raise _transport_error(exc) from None

    async def _read_json(self, response: _Response, deadline: float | None) -> Any:
        if deadline is not None:
            try:
                async with asyncio.timeout_at(deadline):
                    body = await _read_limited(response, MAX_JSON_BODY)
            except TimeoutError:
                raise self._first_byte_timeout_error() from None
        else:
            body = await _read_limited(response, MAX_JSON_BODY)
        try:
            data = json.loads(body)
        except ValueError:
            raise ProviderError(
                ErrorCategory.MALFORMED_STREAM, "The model provider's reply was not valid JSON."
            ) from None
        if isinstance(data, dict) and ("error" in data or data.get("object") == "error"):
            raise error_from_payload(data, status=response.status_code)
        return data

    def _headers(self, streaming: bool) -> dict[str, str]:
        headers = {"User-Agent": self.user_agent}
        if streaming:
            headers["Accept"] = "text/event-stream"
            headers["Accept-Encoding"] = "identity"  # compressed SSE tends to be buffered
        else:
            headers["Accept"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _pool(self) -> httpclient.Pool:
        """The lean client's connection pool: built on first use, then kept for every
        request, for one event loop (as :meth:`_client`)."""
        loop = asyncio.get_running_loop()
        owner = self._pool_loop() if self._pool_loop is not None else None
        if self._own_pool is None or owner is not loop:
            self._own_pool = httpclient.Pool(self.connect_timeout, _shared_ssl_context())
            self._pool_loop = weakref.ref(loop)
        return self._own_pool

    def _client(self) -> httpx.AsyncClient:
        """The caller's client, or ours: built on first use, then kept for every request.

        Its pool is bound to the event loop it was built in: when a request runs in
        another loop (each ``asyncio.run``, each async test), the old client is dropped
        (it cannot be closed from here) and a new one built.
        """
        if self._given_client is not None:
            return self._given_client
        loop = asyncio.get_running_loop()
        owner = self._own_loop() if self._own_loop is not None else None
        if self._own_client is None or self._own_client.is_closed or owner is not loop:
            if self.transport == "stock" or environment_proxy_for(self.base_url):
                # httpx ignores HTTP(S)_PROXY when given a transport: keep its own.
                self._own_client = httpx.AsyncClient(
                    timeout=self._timeout, follow_redirects=False, verify=_shared_ssl_context()
                )
            else:
                # httpx's pool and TLS settings on a plain-asyncio network backend
                # (netbackend.py): less CPU per network read, i.e. per streamed token.
                self._own_client = httpx.AsyncClient(
                    transport=AsyncioTransport(verify=_shared_ssl_context()),
                    timeout=self._timeout,
                    follow_redirects=False,
                )
            self._own_loop = weakref.ref(loop)
        return self._own_client

    # --- retries and errors ---------------------------------------------------------------

    def _plan_retry(self, error: ProviderError, attempt: int) -> Retrying | None:
        """The next ``Retrying`` (attempt counts retries from 1), or None to give up."""
        if not is_retryable(error) or attempt >= self.max_retries:
            return None
        next_attempt = attempt + 1
        delay = retry_delay(error, next_attempt, self.backoff_base, self.backoff_cap, self._rng)
        return Retrying(
            attempt=next_attempt,
            max_attempts=self.max_retries,
            delay=delay,
            category=error.category,
            message=error.message,
        )

    async def _with_retries(
        self, once: Callable[[], Awaitable[T]], on_retry: RetryCallback | None
    ) -> T:
        attempt = 0
        while True:
            try:
                return await once()
            except ProviderError as error:
                failure = self._public_error(error, streamed=False)
                retry = self._plan_retry(failure, attempt)
                if retry is None:
                    raise failure from None
            attempt = retry.attempt
            if on_retry is not None:
                on_retry(retry)
            await asyncio.sleep(retry.delay)

    def _public_error(self, error: ProviderError, *, streamed: bool) -> ProviderError:
        """A copy safe to show: no key in the message, and ``streamed`` set."""
        message = scrub_secret(error.message, self._api_key)
        return ProviderError(
            error.category,
            message,
            status=error.status,
            retry_after=error.retry_after,
            streamed=streamed or error.streamed,
            detail=error.detail,
        )


class ReadWatch:
    """The first-byte and idle deadlines of one streamed body, kept by one timer.

    A stream reads once per token or so; an ``asyncio.timeout`` around each read (a
    context, a timer handle scheduled and cancelled) cost more than the read's own
    parsing. Here a read only notes when it started; one timer per stream wakes at the
    deadline and, if the read that was pending then is still pending, cancels it, which
    :meth:`read` turns into ``TimeoutError`` (as ``asyncio.timeout`` does). Time spent
    outside a read (the caller handling what it got) never counts.
    """

    def __init__(self, first_byte_deadline: float, idle_timeout: float) -> None:
        self._first_byte_deadline = first_byte_deadline
        self._idle = idle_timeout
        self.started = False  # some bytes came
        self._reading_since: float | None = None
        self._fired = False
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> ReadWatch:
        self._task = asyncio.current_task()
        self._timer = self._loop.call_at(self._first_byte_deadline, self._check)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    async def read(self, reads: AsyncIterator[bytes]) -> bytes:
        self._reading_since = self._loop.time()
        try:
            data = await anext(reads, b"")
        except asyncio.CancelledError:
            if self._fired and self._task is not None and self._task.uncancel() == 0:
                self._fired = False
                raise TimeoutError from None
            raise
        finally:
            self._reading_since = None
        if not self.started:  # from now on the idle deadline, not the first byte's
            self.started = True
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._loop.time() + self._idle, self._check)
        return data

    def _check(self) -> None:
        now = self._loop.time()
        since = self._reading_since
        if since is None:  # between reads: look again one idle period on
            due = now + self._idle
        else:
            due = since + self._idle if self.started else self._first_byte_deadline
            if now >= due and self._task is not None:
                self._fired = True
                self._task.cancel()
                return
        self._timer = self._loop.call_at(due, self._check)


async def _drain_after_done(reads: AsyncIterator[bytes]) -> None:
    """Read the little that follows ``[DONE]`` so the connection can be reused.

    Closing a response that was not read to the end closes its connection too, and the
    next request would pay a new TCP + TLS handshake. Whatever follows is ignored, and a
    server that keeps the stream open after ``[DONE]`` costs at most ``DRAIN_TIMEOUT``.
    """
    drained = 0
    with contextlib.suppress(TimeoutError, httpx.HTTPError, httpclient.UpstreamError):
        async with asyncio.timeout(DRAIN_TIMEOUT):
            while drained <= MAX_DRAIN_BYTES:
                data = await anext(reads, b"")
                if not data:
                    return
                drained += len(data)


@functools.cache
def _shared_ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle costs tens of milliseconds; one context serves every client.
    return httpx.create_ssl_context()


class _Response(Protocol):
    """An answer as the provider reads it: ``httpclient.Response`` or :class:`_HttpxResponse`."""

    status_code: int
    network: Any  # the netbackend stream, if any (paced reads)

    @property
    def headers(self) -> Mapping[str, str]: ...  # looked up by lower-case names

    def aiter_body(self, idle: float | None = None) -> AsyncIterator[bytes]: ...


class _HttpxResponse:
    """An httpx response (held open by the caller's ``async with``) as a :class:`_Response`.
    Its body is decoded (httpx asks for gzip) and its errors stay httpx's."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.headers = response.headers
        self.network: Any = response.extensions.get("network_stream")

    def aiter_body(self, idle: float | None = None) -> AsyncIterator[bytes]:
        return self._response.aiter_bytes()


def _json_body(payload: dict[str, Any]) -> bytes:
    # As httpx's json=: compact, UTF-8, no NaN.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _body(response: _Response) -> AsyncIterator[bytes]:
    """The response's body, decoded when the server compressed it though asked not to."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if isinstance(response, _HttpxResponse) or encoding in ("", "identity"):
        return response.aiter_body()
    return _decompressed(response.aiter_body(), encoding)


async def _decompressed(pieces: AsyncIterator[bytes], encoding: str) -> AsyncIterator[bytes]:
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ProviderError(
            ErrorCategory.MALFORMED_STREAM,
            f"The model provider's reply was compressed as {encoding[:20]!r}, "
            "which cannot be read.",
        )
    # gzip: its header; deflate: zlib's (the usual) or raw, as httpx tells them apart.
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 16 if "gzip" in encoding else zlib.MAX_WBITS)
    first = True
    async for piece in pieces:
        try:
            data = decoder.decompress(piece)
        except zlib.error:
            if not (first and encoding == "deflate"):
                raise ProviderError(
                    ErrorCategory.MALFORMED_STREAM,
                    "The model provider's compressed reply could not be read.",
                ) from None
            decoder = zlib.decompressobj(-zlib.MAX_WBITS)
            data = decoder.decompress(piece)
        first = False
        if data:
            yield data
    rest = decoder.flush()
    if rest:
        yield rest


def _is_json(response: _Response) -> bool:
    content_type = response.headers.get("content-type", "")
    return bool(re.match(r"\s*application/json", content_type, re.IGNORECASE))


async def _read_limited(response: _Response, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for part in _body(response):
        parts.append(part)
        size += len(part)
        if size >= limit:
            break
    return b"".join(parts)[:limit]
