"""Seed 001's classroom commands over the API: send, stream, history.

* ``POST /api/v1/classrooms/<id>/chat`` ``{"user_message": ..., "scene_context": ...?}``:
  the list of ``ClassroomChatMessage`` (the learner's message first, ``agent_id: "user"``,
  then the one to three persona replies).
* ``POST /api/v1/classrooms/<id>/chat/stream``: the same as Server-Sent Events: a
  ``message`` event for the learner's message, ``delta`` events per persona (each with its
  ``agent_id``), ``thinking_delta``, a ``message`` event per written reply, and one
  terminal ``complete`` / ``cancelled`` / ``error`` carrying ``messages``.
* ``GET /api/v1/classrooms/<id>/history``: the class chat's messages in order.

API keys and the same permission checks as the pages (``classroom.access``): a class the
key's user is not in is a 404.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from chat import store
from chat.agent.events import TERMINAL_TYPES
from chat.api.follow import RunFollower, follow_run
from chat.api.views import ApiError, _field, api_view, read_json
from chat.store import StoredEvent
from classroom import actions
from classroom.access import ClassAction, access_classroom
from classroom.models import ClassroomChat, Persona

USER_AVATAR = "🧑"
USER_COLOUR = "#475569"
OTHER_COLOUR = "#64748b"


class Cast:
    """Who is who in a class's messages: persona names to their API fields."""

    def __init__(self, personas: list[Persona]) -> None:
        self.by_name = {p.name.casefold(): p for p in personas}

    def agent(self, name: str | None) -> dict[str, Any]:
        if not name:
            return {
                "agent_id": "assistant",
                "agent_name": "Assistant",
                "agent_avatar": "🤖",
                "role": "assistant",
                "color": OTHER_COLOUR,
            }
        persona = self.by_name.get(name.casefold())
        if persona is None:  # a persona since removed from the cast
            return {
                "agent_id": f"persona:{name}",
                "agent_name": name,
                "agent_avatar": "🤖",
                "role": "assistant",
                "color": OTHER_COLOUR,
            }
        return {
            "agent_id": str(persona.pk),
            "agent_name": persona.name,
            "agent_avatar": persona.avatar,
            "role": persona.role,
            "color": persona.colour,
        }


def message_id(chat_id, seq: int) -> str:
    """``msg_`` and a UUID, stable for one message of one chat."""
    return f"msg_{uuid.uuid5(uuid.UUID(str(chat_id)), str(seq))}"


def as_classroom_message(chat_id, event: StoredEvent, cast: Cast) -> dict[str, Any] | None:
    """A display event as a ``ClassroomChatMessage`` (None: not a user or persona message)."""
    payload = event.payload
    if event.kind != "msg" or payload.get("tool_calls"):
        return None
    role = payload.get("role")
    if role == "user" and not payload.get("sender_name"):
        who = {
            "agent_id": "user",
            "agent_name": "You",
            "agent_avatar": USER_AVATAR,
            "role": "user",
            "color": USER_COLOUR,
        }
    elif role == "assistant" and (payload.get("content") or "").strip():
        who = cast.agent(payload.get("sender_name"))
    else:
        return None
    return {
        "id": message_id(chat_id, event.seq),
        **who,
        "content": payload.get("content") or "",
        "timestamp": int(payload.get("timestamp_ms") or 0),
    }


def _cast(classroom_id) -> Cast:
    return Cast(list(Persona.objects.filter(classroom_id=classroom_id)))


def _history(user, classroom_id) -> list[dict[str, Any]]:
    classroom = access_classroom(user, classroom_id, ClassAction.STUDY)
    link = ClassroomChat.objects.filter(classroom=classroom, student=user).first()
    if link is None:
        return []
    cast = _cast(classroom.pk)
    events = store.display_events_after(link.chat_id, 0)
    return [m for e in events if (m := as_classroom_message(link.chat_id, e, cast)) is not None]


def _reply_messages(chat_id, classroom_id, from_seq: int, run_id: str | None):
    """The learner's message at ``from_seq`` and the replies its run wrote, and the cast."""
    cast = _cast(classroom_id)
    out = []
    for event in store.display_events_after(chat_id, from_seq - 1):
        extra = event.payload.get("extra") or {}
        if event.seq != from_seq and extra.get("run_id") != run_id:
            continue
        message = as_classroom_message(chat_id, event, cast)
        if message is not None:
            out.append(message)
    return out


def _send(user, classroom_id, data: dict[str, Any]):
    text = _field(data, "user_message", str)
    if not text or not text.strip():
        raise ApiError(400, "invalid_request_error", "'user_message' is required.")
    scene_context = _field(data, "scene_context", str)
    link, sent = actions.send_class_message(
        user, classroom_id, text, f"api-{uuid.uuid4().hex}", scene_context=scene_context
    )
    speakers = [p.name for p in _cast_order(link)]
    return link, sent, speakers


def _cast_order(link: ClassroomChat) -> list[Persona]:
    from classroom.prompt import cast_of

    return cast_of(link.classroom)


async def _start(request: HttpRequest, classroom_id):
    link, sent, speakers = await database_sync_to_async(_send)(
        request.api_user, classroom_id, read_json(request)
    )
    follower = RunFollower(
        chat_id=sent.chat_id,
        last_seq=sent.display_seq,
        input_seq=sent.display_seq,
        run_id=sent.run_id,
    )
    return link, sent, speakers, follower, follow_run(follower)


def _held(chat_id, classroom_id, seq: int) -> dict[str, Any]:
    """A message kept without a reply (the teacher paused the AI, or a flag holds it)."""
    notices = [
        str(e.payload.get("content") or "")
        for e in store.display_events_after(chat_id, seq)
        if e.kind == "msg" and e.payload.get("role") == "system"
    ]
    return {
        "type": "held",
        "message": notices[0] if notices else "Your message is kept; no reply for now.",
        "messages": _reply_messages(chat_id, classroom_id, seq, None)[:1],
    }


@api_view()
async def classroom_chat(request: HttpRequest, classroom_id: int) -> HttpResponse:
    link, sent, _speakers, follower, events = await _start(request, classroom_id)
    if sent.held:
        await events.aclose()
        held = await database_sync_to_async(_held)(
            sent.chat_id, link.classroom_id, sent.display_seq
        )
        return JsonResponse(held, status=202)
    terminal: dict[str, Any] | None = None
    try:
        async for event in events:
            if event["type"] in TERMINAL_TYPES:
                terminal = event
                break
    finally:
        await events.aclose()
    messages = await database_sync_to_async(_reply_messages)(
        sent.chat_id, link.classroom_id, sent.display_seq, follower.run_id
    )
    if terminal is None or terminal["type"] == "complete":
        return JsonResponse(messages, safe=False)
    error = (
        {"type": "cancelled", "message": "The reply was stopped."}
        if terminal["type"] == "cancelled"
        else {"type": terminal.get("category", "error"), "message": terminal.get("message", "")}
    )
    return JsonResponse(
        {"error": error, "messages": messages},
        status=409 if terminal["type"] == "cancelled" else 502,
    )


@api_view()
async def classroom_chat_stream(request: HttpRequest, classroom_id: int) -> HttpResponse:
    link, sent, speakers, follower, events = await _start(request, classroom_id)
    cast = await database_sync_to_async(_cast)(link.classroom_id)
    mine = await database_sync_to_async(_reply_messages)(
        sent.chat_id, link.classroom_id, sent.display_seq, None
    )

    def sse(event: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()

    async def body() -> AsyncIterator[bytes]:
        yield f": session {sent.chat_id}\n\n".encode()
        for message in mine[:1]:
            yield sse({"type": "message", "message": message})
        if sent.held:
            await events.aclose()
            yield sse(
                await database_sync_to_async(_held)(
                    sent.chat_id, link.classroom_id, sent.display_seq
                )
            )
            return
        try:
            async for event in events:
                kind = event["type"]
                if kind == "delta":
                    # The follower splits the run's voices: each delta names its speaker.
                    agent = cast.agent(event.get("speaker") or None)
                    who = {"agent_id": agent["agent_id"], "agent_name": agent["agent_name"]}
                    yield sse({"type": "delta", **who, "text": event["text"]})
                elif kind in TERMINAL_TYPES:
                    written = await database_sync_to_async(_reply_messages)(
                        sent.chat_id, link.classroom_id, sent.display_seq, follower.run_id
                    )
                    replies = [m for m in written if m["agent_id"] != "user"]
                    for message in replies:
                        yield sse({"type": "message", "message": message})
                    final = {k: v for k, v in event.items() if k != "text"}
                    yield sse({**final, "messages": written})
                    break
                else:
                    yield sse(event)
        finally:
            await events.aclose()

    response = StreamingHttpResponse(body(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    response["X-Lyceum-Session"] = sent.chat_id
    return response


@api_view(methods=("GET",))
async def classroom_history(request: HttpRequest, classroom_id: int) -> HttpResponse:
    messages = await database_sync_to_async(_history)(request.api_user, classroom_id)
    return JsonResponse(messages, safe=False)
