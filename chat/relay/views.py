"""The relay's HTTP views: thin, errors in OpenAI's shape (the SDKs raise their usual exceptions)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.views.decorators.csrf import csrf_exempt

from chat import throttle
from chat.relay import service
from chat.relay.service import RelayError

logger = logging.getLogger(__name__)

View = Callable[..., Awaitable[HttpResponseBase]]


def error_response(error: RelayError) -> JsonResponse:
    response = JsonResponse(error.body(), status=error.status)
    if error.retry_after is not None:
        response["Retry-After"] = str(error.retry_after)
    if error.status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


def relay_view(*, method: str) -> Callable[[View], View]:
    """Method check, Bearer auth (the key lands on ``request.relay_key``), errors as OpenAI's."""

    def decorate(view: View) -> View:
        @csrf_exempt
        @login_not_required
        @wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            try:
                if request.method != method:
                    response = error_response(
                        RelayError(405, f"Use {method}.", code="method_not_allowed")
                    )
                    response["Allow"] = method
                    return response
                scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
                raw = raw.strip() if scheme.lower() == "bearer" else ""
                address = throttle.request_address(request)
                request.relay_key = await service.authenticated(raw, address)  # type: ignore[attr-defined]
                return await view(request, *args, **kwargs)
            except RelayError as exc:
                return error_response(exc)
            except Exception:
                logger.exception("relay request failed")
                return error_response(
                    RelayError(500, "The relay failed; try again.", "api_error", "internal_error")
                )

        return wrapper

    return decorate


def _body(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:
        raise RelayError(413, "The request body is too large.", code="request_too_large") from None


@relay_view(method="POST")
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    data = service.parse_body(_body(request))
    prep = await service.prepared(request.relay_key, data)  # type: ignore[attr-defined]
    outcome = service.Outcome()
    upstream = await service.open_upstream_recorded(prep, outcome)
    if prep.stream:
        response = StreamingHttpResponse(
            service.relay_stream(prep, upstream, outcome), content_type="text/event-stream"
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    try:
        raw = await service.relay_once(prep, upstream, outcome)
    except RelayError as exc:
        outcome.http_status, outcome.error = exc.status, exc.message
        raise
    finally:
        service.finish(prep, outcome)
    return HttpResponse(raw, content_type="application/json")


@relay_view(method="GET")
async def models(request: HttpRequest) -> HttpResponse:
    data = await database_sync_to_async(service.list_models)()
    return JsonResponse({"object": "list", "data": data})
