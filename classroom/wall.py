"""The teacher's wall: a tile per enrolled student, rendered compact.

Tiles get fragments of their own, swapped out of band by htmx like the chat page's,
with ids scoped by chat: ``tile-msgs-<chat>`` (the last messages, appended),
``tile-stream-<chat>`` (the "writing…" line), ``tile-activity-<chat>`` and
``tile-seq-<chat>`` (that chat's resync cursor). A stream snapshot becomes one short
line (the speaker and the tail of the text, escaped, not rendered as markdown), so
forty streams cost the wall a few string operations each, not a markdown render.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.template.loader import render_to_string
from django.utils.html import escape
from django.utils.translation import gettext as _

from chat import store
from chat.models import ChatSession, Run
from chat.presentation.fragments import REPLAY_BATCH
from chat.runhost import transitions
from chat.store import StoredEvent
from classroom.models import Classroom, ClassroomChat, Enrollment, Flag, Guardrails, Scene

TILE_MESSAGES = 4  # messages a tile shows (the focused view shows them all)
FOCUSED_MESSAGES = 200
TEXT_CHARS = 280
TAIL_CHARS = 160
TERMINAL = {"complete", "cancelled", "error"}
_TAG = re.compile(r"</?([^<>/]{1,60})>")


@dataclass
class TileItem:
    seq: int
    who: str
    kind: str  # student, persona, teacher, system, scene
    text: str


@dataclass
class Tile:
    student: Any
    chat_id: str = ""
    last_seq: int = 0
    items: list[TileItem] = field(default_factory=list)
    writing: bool = False
    activity: datetime | None = None
    flags: list[Flag] = field(default_factory=list)


def _short(text: str, limit: int = TEXT_CHARS) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def tile_item(event: StoredEvent, student_name: str) -> TileItem | None:
    p = event.payload
    if event.kind == "scene":
        text = _("Scene %(number)s: %(title)s") % {
            "number": p.get("number"),
            "title": p.get("title"),
        }
        return TileItem(event.seq, _("Scene"), "scene", text)
    if event.kind in ("cancelled", "error"):
        what = _("Stopped") if event.kind == "cancelled" else _("The reply failed")
        return TileItem(event.seq, "", "system", what)
    if event.kind != "msg":
        return None
    role, sender, extra = p.get("role"), p.get("sender_name") or "", p.get("extra") or {}
    text = _short(str(p.get("content") or ""))
    if role == "user":
        if extra.get("teacher"):
            return TileItem(event.seq, sender, "teacher", text)
        return TileItem(event.seq, student_name, "student", text)
    if role == "assistant" and text:
        return TileItem(event.seq, sender or _("AI"), "persona", text)
    if role == "system":
        return TileItem(event.seq, "", "system", text)
    return None


def _item_html(item: TileItem) -> str:
    return render_to_string("classroom/_tile_item.html", {"item": item})


def flags_html(chat_id: str, flags: list[Flag], *, oob: bool = True) -> str:
    return render_to_string(
        "classroom/_tile_flags.html", {"chat_id": chat_id, "flags": flags, "oob": oob}
    )


def open_flags(chat_id) -> list[Flag]:
    return list(Flag.objects.filter(chat_id=chat_id, reviewed_at__isnull=True)[:20])


def stream_line(chat_id: str, writing: bool, who: str = "", tail: str = "") -> str:
    if not writing:
        return f'<p id="tile-stream-{chat_id}" class="tile-stream" hx-swap-oob="true"></p>'
    return (
        f'<p id="tile-stream-{chat_id}" class="tile-stream writing" hx-swap-oob="true">'
        f'<span class="who">{escape(_("%(who)s is writing…") % {"who": who or _("AI")})}</span> '
        f'<span class="tail">{escape(tail)}</span></p>'
    )


def _speaker_and_tail(text: str, speakers: list[str]) -> tuple[str, str]:
    """Who is speaking now and the end of what they said (from the raw text's tail)."""
    window = text[-(TAIL_CHARS + 200) :]
    who = speakers[0] if speakers else _("AI")
    tail = window
    for match in _TAG.finditer(window):
        name = match.group(1)
        if not match.group(0).startswith("</") and (not speakers or name in speakers):
            who, tail = name, window[match.end() :]
    tail = _TAG.sub(" ", tail)
    tail = " ".join(tail.split())
    if len(tail) > TAIL_CHARS:
        tail = "…" + tail[-TAIL_CHARS:]
    return who, tail


def stream_html(event: dict[str, Any]) -> str:
    """A tile's line for a stream snapshot (ChatSubscription's ``stream_html``)."""
    who, tail = _speaker_and_tail(str(event.get("text") or ""), list(event.get("speakers") or []))
    return stream_line(str(event.get("chat_id")), True, who, tail)


def partial_html(chat_id: str, run: Run) -> str:
    """A wall (re)connecting during a run (ChatSubscription's ``partial_html``)."""
    who, tail = _speaker_and_tail(run.partial_text or "", list(run.speakers or []))
    return stream_line(chat_id, run.status == Run.Status.RUNNING, who, tail)


def _activity_html(chat_id: str, when: datetime) -> str:
    return render_to_string(
        "classroom/_tile_activity.html", {"chat_id": chat_id, "when": when, "oob": True}
    )


def tile_fragments(chat_id: str, events: list[StoredEvent], student_name: str) -> str:
    items = [i for i in (tile_item(e, student_name) for e in events) if i is not None]
    parts = []
    if items:
        html = "".join(_item_html(i) for i in items)
        parts.append(f'<div hx-swap-oob="beforeend:#tile-msgs-{chat_id}">{html}</div>')
        parts.append(_activity_html(chat_id, datetime.now(tz=UTC)))
    writing = None
    for event in events:
        if event.kind == "run_start":
            writing = True
        elif event.kind in TERMINAL:
            writing = False
    if writing is not None:
        parts.append(stream_line(chat_id, writing, _("AI") if writing else ""))
    elif any(i.kind == "persona" for i in items):
        parts.append(stream_line(chat_id, False))
    if events:
        seq = int(events[-1].seq)
        parts.append(
            f'<span id="tile-seq-{chat_id}" class="tile-seq" data-seq="{seq}" '
            'hx-swap-oob="true"></span>'
        )
    return "".join(parts)


def batch_renderer(student_name: str):
    """ChatSubscription's ``next_batch`` for one tile."""

    def next_batch(chat_id: str, after_seq: int) -> tuple[list[StoredEvent], str]:
        events = store.display_events_after(chat_id, after_seq, REPLAY_BATCH)
        return events, tile_fragments(chat_id, events, student_name) if events else ""

    return next_batch


def events_renderer(student_name: str):
    """ChatSubscription's ``events_html`` for one tile: the doorbell's compact events."""

    def events_html(chat_id: str, compact: list[Any]) -> str:
        events = [StoredEvent(int(seq), str(kind), dict(payload)) for seq, kind, payload in compact]
        return tile_fragments(chat_id, events, student_name) if events else ""

    return events_html


# --- the page ------------------------------------------------------------------------------------


def tiles(classroom: Classroom, *, student_id=None) -> list[Tile]:
    enrolled = Enrollment.objects.filter(classroom=classroom).select_related("student")
    links = ClassroomChat.objects.filter(classroom=classroom).select_related("chat", "student")
    if student_id is not None:
        enrolled = enrolled.filter(student_id=student_id)
        links = links.filter(student_id=student_id)
    by_student = {link.student_id: link for link in links}
    students = [e.student for e in enrolled]
    # A student taken off the roster keeps a class chat the teachers may still see.
    students += [link.student for link in by_student.values() if link.student not in students]
    limit = FOCUSED_MESSAGES if student_id is not None else TILE_MESSAGES
    result = []
    for student in students:
        link = by_student.get(student.pk)
        tile = Tile(student)
        if link is not None:
            tile.chat_id = str(link.chat_id)
            tile.activity = link.chat.updated_at
            events = store.display_events_before(link.chat_id, None, limit * 6)
            # The newest event read, not only the row's count read before them: a reply
            # written in between is on the tile, and the wall's resync must not add it again.
            tile.last_seq = max(link.chat.last_display_seq, events[-1].seq if events else 0)
            items = [tile_item(e, student.get_username()) for e in events]
            tile.items = [i for i in items if i is not None][-limit:]
            tile.writing = transitions.live_run(link.chat) is not None
            tile.flags = open_flags(link.chat_id)
        result.append(tile)
    return result


def tile_html(tile: Tile, classroom: Classroom, *, oob: bool = False) -> str:
    return render_to_string(
        "classroom/_tile.html", {"tile": tile, "classroom": classroom, "oob": oob}
    )


def state_html(classroom: Classroom, *, oob: bool = True) -> str:
    return render_to_string(
        "classroom/_wall_state.html",
        {
            "classroom": classroom,
            "scenes": Scene.objects.filter(classroom=classroom),
            "oob": oob,
        },
    )


def guardrails_for(classroom: Classroom) -> Guardrails:
    return Guardrails.objects.get_or_create(classroom=classroom)[0]


def chat_ids(classroom: Classroom) -> dict[str, str]:
    """chat id -> the student's username, for every class chat."""
    return {
        str(chat_id): name
        for chat_id, name in ClassroomChat.objects.filter(classroom=classroom).values_list(
            "chat_id", "student__username"
        )
    }


def is_class_chat(chat: ChatSession) -> bool:
    return chat.kind == ChatSession.Kind.CLASSROOM
