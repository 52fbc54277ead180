"""The agent API: JSON and Server-Sent Events over the same runs the browser uses.

Authentication is an API key sent as ``Authorization: Bearer <key>``. Errors are
``{"error": {"type": ..., "message": ...}}`` with a fitting status; another
user's session is 404, exactly like one that does not exist.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import wraps
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import RequestDataTooBig, ValidationError
from django.db import InterfaceError, OperationalError
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import reverse
from django.utils.http import content_disposition_header
from django.utils.translation import gettext
from django.views.decorators.csrf import csrf_exempt

from chat import actions, artifacts, store, throttle
from chat.access import (
    ChatAction,
    ViewHow,
    access_artifact,
    access_chat,
    access_version,
    note_view,
)
from chat.agent.events import TERMINAL_TYPES
from chat.api.follow import RunFollower, follow_run
from chat.apikeys import authenticate_key
from chat.catalog import available_models
from chat.core.artifacts import safe_filename
from chat.inputs import BadInput, parse_object, text_problem
from chat.models import Artifact, ArtifactVersion, Run, ToolApproval
from chat.runhost import executor

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 256 * 1024
STATUS_BY_CODE = {
    "not_found": 404,
    "busy": 409,
    "unknown_model": 400,
    "no_agent": 503,
    "too_large": 413,
    "chat_full": 413,
    # The user's limits (chat/quotas.py).
    "rate_limited": 429,
    "too_many_runs": 429,
    "too_many_chats": 403,
    "too_many_keys": 403,
    "over_quota": 413,
}
LIMIT_TYPES = {"rate_limited": "rate_limit_error", "too_many_runs": "rate_limit_error"}


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type_, message


def error_response(status: int, type_: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"type": type_, "message": message}}, status=status)


def locked_response(locked: throttle.Locked) -> JsonResponse:
    response = error_response(
        429,
        "rate_limit_error",
        gettext("Too many requests with a wrong API key from your address; try again in %(s)d s.")
        % {"s": locked.retry_after},
    )
    response["Retry-After"] = str(locked.retry_after)
    return response


View = Callable[..., Awaitable[HttpResponse]]


def api_view(*, methods: tuple[str, ...] = ("POST",)) -> Callable[[View], View]:
    """Bearer auth, method check, and errors as JSON for an async API view."""

    def decorate(view: View) -> View:
        @csrf_exempt
        @login_not_required
        @wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error_response(405, "method_not_allowed", f"Use {', '.join(methods)}.")
                response["Allow"] = ", ".join(methods)  # required on a 405 (RFC 9110)
                return response
            header = request.headers.get("Authorization", "")
            scheme, _, raw = header.partition(" ")
            raw = raw.strip() if scheme.lower() == "bearer" else ""
            user = None
            if raw:
                # A shut address is refused before its key is looked up (chat/throttle.py).
                address = throttle.request_address(request)
                locked = throttle.key_door_shut(address)
                if locked is None:
                    try:
                        user = await database_sync_to_async(authenticate_key)(raw)
                    except Exception as exc:
                        # The key lookup is the first database call: when the database is
                        # out of reach (say, out of connections) the client still reads JSON.
                        logger.exception(
                            "API %s %s: the key lookup failed", request.method, request.path
                        )
                        return server_failure_response(exc)
                    if user is None:
                        locked = await database_sync_to_async(throttle.bad_key)(address)
                if locked is not None:
                    return locked_response(locked)
            if user is None:
                response = error_response(
                    401,
                    "authentication_error",
                    "Send a valid API key as 'Authorization: Bearer <key>'.",
                )
                response["WWW-Authenticate"] = "Bearer"
                return response
            request.api_user = user
            # A process serving the API dispatches runs: it recovers them too (§6).
            executor.ensure_sweeper()
            if any(isinstance(v, str) and text_problem(v) for v in kwargs.values()):
                return error_response(
                    400, "invalid_request_error", "The URL holds characters that are not allowed."
                )
            try:
                return await view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status, exc.type, exc.message)
            except Http404 as exc:
                what = "artifact" if "artifact" in str(exc) or "version" in str(exc) else "chat"
                message = "No such artifact." if what == "artifact" else "No such chat session."
                return error_response(404, "not_found", message)
            except actions.ActionError as exc:
                kind = "not_found" if exc.code == "not_found" else "invalid_request_error"
                kind = LIMIT_TYPES.get(exc.code, kind)
                response = error_response(STATUS_BY_CODE.get(exc.code, 400), kind, exc.message)
                if exc.retry_after is not None:
                    response["Retry-After"] = str(exc.retry_after)
                return response
            except BadInput as exc:
                return error_response(400, "invalid_request_error", exc.message)
            except Exception as exc:
                # A client of the API reads JSON, never Django's HTML error page.
                logger.exception("API %s %s failed", request.method, request.path)
                return server_failure_response(exc)

        return wrapper

    return decorate


DATABASE_RETRY_AFTER = 5


def server_failure_response(exc: Exception) -> HttpResponse:
    """An unexpected failure, in JSON: a database out of reach (down, or out of
    connections) is a 503 to retry shortly; anything else a 500."""
    if isinstance(exc, OperationalError | InterfaceError):
        response = error_response(
            503,
            "service_unavailable",
            "The server cannot reach its database just now; try again in a few seconds.",
        )
        response["Retry-After"] = str(DATABASE_RETRY_AFTER)
        return response
    return error_response(500, "internal_error", "Something went wrong on the server; try again.")


def read_json(request: HttpRequest) -> dict[str, Any]:
    too_large = ApiError(413, "invalid_request_error", "The request body is too large.")
    try:
        body = request.body
    except RequestDataTooBig:
        # Past DATA_UPLOAD_MAX_MEMORY_SIZE Django refuses to read it (an HTML 400 otherwise).
        raise too_large from None
    if len(body) > MAX_BODY_BYTES:
        raise too_large
    # Deep nesting, NUL characters, lone surrogates, huge numbers: a 400 here (BadInput),
    # never an error from the database after half of the request was written.
    return parse_object(body or b"{}")


def _field(data: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = data.get(name)
    if value is None:  # JSON null means "not given", not a value to store
        return default
    if not isinstance(value, kind):
        raise ApiError(400, "invalid_request_error", f"'{name}' must be a {kind.__name__}.")
    return value


def _send(user, data: dict[str, Any]) -> actions.SendResult:
    """Send the request's message (into its session, or a new one): one action."""
    message = _field(data, "message", str)
    if not message or not message.strip():
        raise ApiError(400, "invalid_request_error", "'message' is required.")
    return actions.start_chat_and_send(
        user,
        message,
        f"api-{uuid.uuid4().hex}",
        chat_id=_field(data, "session_id", str),
        agent_slug=_field(data, "agent", str) or "",
        model=_field(data, "model", str) or "",
        thinking=_field(data, "thinking", bool, True),
        attachments=_attachment_ids(data),
    )


def _attachment_ids(data: dict[str, Any]) -> list[str]:
    ids = _field(data, "attachments", list, [])
    if not all(isinstance(i, str) for i in ids):
        raise ApiError(400, "invalid_request_error", "'attachments' must be a list of ids.")
    return ids


async def _follow(
    user, data: dict[str, Any]
) -> tuple[str, RunFollower, AsyncIterator[dict[str, Any]]]:
    sent = await database_sync_to_async(_send)(user, data)
    # The run is known when this message started it; a queued message finds its run
    # by the input_taken event.
    follower = RunFollower(
        chat_id=sent.chat_id,
        last_seq=sent.display_seq,
        input_seq=sent.display_seq,
        run_id=sent.run_id,
    )
    return sent.chat_id, follower, follow_run(follower)


@api_view()
async def chat(request: HttpRequest) -> HttpResponse:
    """``POST /api/v1/chat``: the final reply, its usage and the session id.

    When the run stops to ask for a tool approval, the answer is 202 with the
    pending approvals; approve or deny them, then follow up with another request.
    """
    chat_id, _follower, events = await _follow(request.api_user, read_json(request))
    reply: list[str] = []
    try:
        async for event in events:
            kind = event["type"]
            if kind == "delta":
                reply.append(event["text"])
            elif kind == "complete":
                return JsonResponse(
                    {
                        "session_id": chat_id,
                        "run_id": event["run_id"],
                        "status": "completed",
                        "reply": event["text"],
                        "usage": _usage(event),
                    }
                )
            elif kind in ("cancelled", "error"):
                return _run_failed(chat_id, event)
            elif kind == "approval_required":
                pending = await database_sync_to_async(_pending_approvals)(event["run_id"])
                if pending is not None:
                    return JsonResponse(
                        {
                            "session_id": chat_id,
                            "run_id": event["run_id"],
                            "status": "waiting_for_approval",
                            "reply": "".join(reply),
                            "approvals": pending,
                        },
                        status=202,
                    )
    finally:
        await events.aclose()
    raise ApiError(500, "internal_error", "The run ended without a final event.")


def _pending_approvals(run_id: str) -> list[dict[str, Any]] | None:
    """The run's open approvals, once it is waiting for them (None while still running)."""
    if not Run.objects.filter(pk=run_id, status=Run.Status.WAITING).exists():
        return None
    return [
        {
            "call_id": a.call_id,
            "name": a.tool_name,
            "arguments": a.arguments,
            "expires_at": a.expires_at.isoformat(),
        }
        for a in ToolApproval.objects.filter(run_id=run_id, status=ToolApproval.Status.PENDING)
    ]


def _usage(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": event["input_tokens"],
        "output_tokens": event["output_tokens"],
        "estimated": event["usage_estimated"],
    }


def _run_failed(chat_id: str, event: dict[str, Any]) -> JsonResponse:
    if event["type"] == "cancelled":
        error = {"type": "cancelled", "message": "The reply was stopped."}
        status = 409
    else:
        error = {"type": event["category"], "message": event["message"]}
        status = 502 if event["category"] not in ("bad_request", "context_too_long") else 400
    return JsonResponse(
        {
            "session_id": chat_id,
            "run_id": event["run_id"],
            "status": event.get("status", event["type"]),
            "partial_text": event.get("partial_text", ""),
            "error": error,
        },
        status=status,
    )


@api_view()
async def chat_stream(request: HttpRequest) -> HttpResponse:
    """``POST /api/v1/chat/stream``: the run's typed events as ``text/event-stream``."""
    chat_id, follower, events = await _follow(request.api_user, read_json(request))
    return _sse_response(chat_id, follower, events)


def _sse_response(
    chat_id: str, follower: RunFollower, events: AsyncIterator[dict[str, Any]]
) -> StreamingHttpResponse:
    """The events as SSE, each with the id to resume after it (``Last-Event-ID``)."""

    async def body() -> AsyncIterator[bytes]:
        yield f": session {chat_id}\n\n".encode()
        try:
            async for event in events:
                data = json.dumps(event, ensure_ascii=False)
                yield f"id: {follower.take_id(event)}\ndata: {data}\n\n".encode()
        except Exception:
            # Headers are gone: say it in the stream, and where to resume.
            logger.exception("API stream of chat %s failed", chat_id)
            problem = {
                "type": "stream_error",
                "message": "The stream broke off on the server; resume it with Last-Event-ID.",
                "run_id": follower.run_id,
                "resume": f"/api/v1/chat/{chat_id}/runs/{follower.run_id}/stream",
            }
            yield f"event: error\ndata: {json.dumps(problem)}\n\n".encode()

    response = StreamingHttpResponse(body(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    response["X-Lyceum-Session"] = chat_id
    return response


@api_view(methods=("GET",))
async def run_stream(request: HttpRequest, session_id: str, run_id: str) -> HttpResponse:
    """``GET /api/v1/chat/<session_id>/runs/<run_id>/stream``: the run's events as SSE.

    With ``Last-Event-ID`` (the id of the last event seen), every event after it and no
    event twice; without it, from the run's start. Ends with the run's terminal event.
    """
    chat_id, start = await database_sync_to_async(_run_stream_start)(
        request.api_user, session_id, run_id
    )
    last_event_id = request.headers.get("Last-Event-ID", "").strip()
    if last_event_id:
        try:
            follower = RunFollower.resuming(chat_id, run_id, last_event_id)
        except ValueError:
            raise ApiError(
                400, "invalid_request_error", "'Last-Event-ID' is not an id this API sent."
            ) from None
    else:
        follower = RunFollower(chat_id=chat_id, last_seq=start, run_id=run_id)
    return _sse_response(chat_id, follower, follow_run(follower))


def _run_stream_start(user, session_id: str, run_id: str) -> tuple[str, int]:
    """The chat and the seq just before the run's first event (after access checks)."""
    chat = access_chat(user, session_id, ChatAction.VIEW)
    try:
        run = Run.objects.get(pk=run_id, chat=chat)
    except (Run.DoesNotExist, ValueError, ValidationError):
        raise ApiError(404, "not_found", "No such run in this session.") from None
    started = store.run_events(chat.pk, str(run.pk), {"run_start"})
    return str(chat.pk), (started[0].seq - 1 if started else 0)


@api_view()
async def cancel(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /api/v1/chat/<session_id>/cancel``: idempotent."""
    run_id = await database_sync_to_async(actions.cancel_run)(request.api_user, session_id)
    return JsonResponse(
        {"session_id": str(session_id), "run_id": run_id, "cancelled": run_id is not None}
    )


@api_view()
async def approval(request: HttpRequest, session_id: str, call_id: str) -> HttpResponse:
    """``POST /api/v1/chat/<session_id>/approvals/<call_id>``: approve or deny one call."""
    data = read_json(request)
    decision = _field(data, "decision", str)
    if decision not in ("approve", "deny"):
        raise ApiError(400, "invalid_request_error", "'decision' must be 'approve' or 'deny'.")
    reason = _field(data, "reason", str, "") or ""
    always = bool(_field(data, "always", bool, False))
    try:
        result = await database_sync_to_async(actions.decide_approval)(
            request.api_user,
            session_id,
            call_id,
            approve=decision == "approve",
            reason=reason,
            always=always,
        )
    except actions.ActionError as exc:
        if exc.code == "not_found":
            raise ApiError(404, "not_found", exc.message) from None
        raise
    return JsonResponse(
        {"session_id": str(session_id), "call_id": call_id, "status": result.status}
    )


@api_view(methods=("GET",))
async def run_status(request: HttpRequest, session_id: str, run_id: str) -> HttpResponse:
    """``GET /api/v1/chat/<session_id>/runs/<run_id>``: where a run stands, and its reply.

    For JSON clients that got a 202: after answering the approvals, poll this.
    """
    body = await database_sync_to_async(_run_summary)(request.api_user, session_id, run_id)
    return JsonResponse(body)


def _run_summary(user, session_id: str, run_id: str) -> dict[str, Any]:
    chat = access_chat(user, session_id, ChatAction.VIEW)
    try:
        run = Run.objects.get(pk=run_id, chat=chat)
    except (Run.DoesNotExist, ValueError, ValidationError):
        raise ApiError(404, "not_found", "No such run in this session.") from None
    note_view(user, chat, ViewHow.API)
    terminals = store.run_events(chat.pk, str(run.pk), TERMINAL_TYPES)
    terminal = terminals[0].payload if terminals else None
    body: dict[str, Any] = {"session_id": str(chat.pk), "run_id": str(run.pk), "status": run.status}
    if run.status == Run.Status.WAITING:
        body["approvals"] = _pending_approvals(str(run.pk)) or []
    if terminal and terminal["type"] == "complete":
        body["reply"] = terminal["text"]
        body["usage"] = _usage(terminal)
    elif terminal:
        body["partial_text"] = terminal.get("partial_text", "")
        if terminal["type"] == "error":
            body["error"] = {"type": terminal["category"], "message": terminal["message"]}
    return body


# --- artifacts -----------------------------------------------------------------------------------


def _artifact_json(artifact: Artifact, request: HttpRequest) -> dict[str, Any]:
    return {
        "id": str(artifact.pk),
        "path": artifact.path,
        "kind": artifact.kind,
        "language": artifact.language,
        "source": artifact.source,
        "size": artifact.size,
        "versions": artifact.version_count,
        "updated_at": artifact.updated_at.isoformat(),
    }


def _version_json(version: ArtifactVersion, request: HttpRequest) -> dict[str, Any]:
    download = reverse("api_artifact_download", args=[version.artifact_id, version.number])
    return {
        "id": str(version.pk),
        "number": version.number,
        "size": version.size,
        "sha256": version.sha256,
        "kind": version.kind,
        "language": version.language,
        "content_type": version.mime,
        "seq": version.seq,
        "created_at": version.created_at.isoformat(),
        "download_url": request.build_absolute_uri(download),
    }


def _list_artifacts(user, session_id: str, request: HttpRequest) -> dict[str, Any]:
    chat = access_chat(user, session_id, ChatAction.VIEW)
    note_view(user, chat, ViewHow.API)
    rows = Artifact.objects.filter(chat=chat).order_by("-updated_at", "-pk")
    return {"session_id": str(chat.pk), "artifacts": [_artifact_json(a, request) for a in rows]}


@api_view(methods=("GET",))
async def artifacts_list(request: HttpRequest, session_id: str) -> HttpResponse:
    """``GET /api/v1/chat/<session_id>/artifacts``: the chat's artifacts, newest first."""
    body = await database_sync_to_async(_list_artifacts)(request.api_user, session_id, request)
    return JsonResponse(body)


def _one_artifact(user, artifact_id: str, request: HttpRequest) -> dict[str, Any]:
    artifact = access_artifact(user, artifact_id)
    note_view(user, artifact.chat, ViewHow.ARTIFACT)
    body = _artifact_json(artifact, request)
    body["session_id"] = str(artifact.chat_id)
    body["version_list"] = [_version_json(v, request) for v in artifact.versions.all()]
    return body


@api_view(methods=("GET",))
async def artifact_detail(request: HttpRequest, artifact_id: str) -> HttpResponse:
    """``GET /api/v1/artifacts/<id>``: one artifact with its versions."""
    body = await database_sync_to_async(_one_artifact)(request.api_user, artifact_id, request)
    return JsonResponse(body)


@api_view(methods=("GET",))
async def artifact_download(request: HttpRequest, artifact_id: str, number: int) -> HttpResponse:
    """``GET /api/v1/artifacts/<id>/versions/<n>/download``: the content, as an attachment."""
    version = await database_sync_to_async(_viewed_version)(request.api_user, artifact_id, number)
    data = await database_sync_to_async(artifacts.read_bytes)(version)
    response = HttpResponse(data, content_type=version.mime)
    response["Content-Disposition"] = content_disposition_header(
        True, safe_filename(version.artifact.path)
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    return response


def _viewed_version(user, artifact_id: str, number: int) -> ArtifactVersion:
    version = access_version(user, artifact_id, number)
    note_view(user, version.artifact.chat, ViewHow.ARTIFACT)
    return version


@api_view()
async def attachment_upload(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /api/v1/chat/<session_id>/attachments`` (multipart, field ``file``): an id.

    Send it with a message as ``"attachments": [id]`` in ``POST /api/v1/chat``.
    """
    upload = request.FILES.get("file")
    if upload is None:
        raise ApiError(400, "invalid_request_error", "Send the file as multipart field 'file'.")
    name = upload.name or "file"
    data = await database_sync_to_async(upload.read)()
    version = await database_sync_to_async(actions.attach_file)(
        request.api_user, session_id, name, data
    )
    return JsonResponse(
        {
            "id": str(version.pk),
            "artifact_id": str(version.artifact_id),
            "path": version.artifact.path,
            "kind": version.kind,
            "size": version.size,
            "version": version.number,
        },
        status=201,
    )


@api_view(methods=("GET",))
async def models(request: HttpRequest) -> HttpResponse:
    """``GET /api/v1/models``: the models the caller may use, OpenAI's list shape."""
    choices = await database_sync_to_async(available_models)()
    return JsonResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": choice.alias,
                    "object": "model",
                    "owned_by": choice.provider_name,
                    "context_window": choice.context_window,
                }
                for choice in choices
            ],
        }
    )


@csrf_exempt
@login_not_required
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """Any other path under /api/: a JSON 404, never the site's HTML page."""
    return error_response(404, "not_found", f"No API endpoint at {request.path}.")
