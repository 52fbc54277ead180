"""Class exports: a student's transcript, and the class's zip (transcripts, summary, flags)."""

from __future__ import annotations

import csv
import io
import zipfile
from datetime import datetime

from django.db.models import Count, Q, Sum
from django.utils import timezone
from django.utils.text import slugify

from chat import store
from chat.core.messages import DisplayType
from chat.models import Run
from chat.presentation.exports import _entries
from classroom.models import Classroom, ClassroomChat, Flag

ALL = 10**9


def transcript(link: ClassroomChat) -> str:
    """One student's class chat as Markdown, each message labelled with who wrote it."""
    student = link.student.get_username()
    events = store.display_events_after(link.chat_id, 0, ALL)
    lines = [f"# {link.classroom.title}: {student}", ""]
    for entry in _entries(events, with_reasoning=False):
        kind = entry["type"]
        if kind == DisplayType.USER:
            who = entry.get("sender")
            lines += [f"## {who} (teacher)" if who else f"## {student}", "", entry["content"], ""]
        elif kind == DisplayType.ASSISTANT_TEXT:
            lines += [f"## {entry.get('sender', 'AI')}", "", entry["content"], ""]
        elif kind == DisplayType.SYSTEM:
            lines += [f"_{entry['content']}_", ""]
        elif kind == "scene":
            lines += ["---", "", f"_Scene {entry.get('number')}: {entry.get('title')}_", ""]
        elif kind == "cancelled":
            lines += ["_Stopped._", ""]
        elif kind == "error":
            lines += [f"_Error: {entry.get('message')}_", ""]
    return "\n".join(lines).rstrip() + "\n"


def transcript_name(link: ClassroomChat) -> str:
    return f"{slugify(link.student.get_username()) or 'student'}-{link.student_id}.md"


def _summary(classroom: Classroom, links: list[ClassroomChat]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["student", "messages", "replies", "flags", "open_flags", "tokens", "last_activity"]
    )
    flags = dict(
        Flag.objects.filter(classroom=classroom)
        .values("chat_id")
        .annotate(n=Count("pk"), open=Count("pk", filter=Q(reviewed_at__isnull=True)))
        .values_list("chat_id", "n")
    )
    open_flags = dict(
        Flag.objects.filter(classroom=classroom, reviewed_at__isnull=True)
        .values("chat_id")
        .annotate(n=Count("pk"))
        .values_list("chat_id", "n")
    )
    for link in links:
        counts = {"user": 0, "assistant": 0}
        for event in store.display_events_after(link.chat_id, 0, ALL):
            role = event.payload.get("role")
            extra = event.payload.get("extra") or {}
            if event.kind == "msg" and role in counts and not extra.get("teacher"):
                counts[role] += 1
        tokens = Run.objects.filter(chat_id=link.chat_id).aggregate(
            i=Sum("input_tokens"), o=Sum("output_tokens")
        )
        last: datetime = link.chat.updated_at
        writer.writerow(
            [
                link.student.get_username(),
                counts["user"],
                counts["assistant"],
                flags.get(link.chat_id, 0),
                open_flags.get(link.chat_id, 0),
                (tokens["i"] or 0) + (tokens["o"] or 0),
                last.isoformat(),
            ]
        )
    return out.getvalue()


def _flags(classroom: Classroom) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        [
            "created_at",
            "student",
            "source",
            "speaker",
            "severity",
            "category",
            "reason",
            "message",
            "reviewed_by",
            "reviewed_at",
        ]
    )
    for flag in Flag.objects.filter(classroom=classroom).select_related("student", "reviewed_by"):
        writer.writerow(
            [
                flag.created_at.isoformat(),
                flag.student.get_username(),
                flag.source,
                flag.speaker,
                flag.get_severity_display(),
                flag.category,
                flag.reason,
                flag.message,
                flag.reviewed_by.get_username() if flag.reviewed_by else "",
                flag.reviewed_at.isoformat() if flag.reviewed_at else "",
            ]
        )
    return out.getvalue()


def class_zip(classroom: Classroom, links: list[ClassroomChat]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for link in links:
            archive.writestr(f"transcripts/{transcript_name(link)}", transcript(link))
        archive.writestr("summary.csv", _summary(classroom, links))
        archive.writestr("flags.csv", _flags(classroom))
    return buffer.getvalue()


def zip_name(classroom: Classroom) -> str:
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    return f"{slugify(classroom.title)[:60] or 'class'}-{stamp}.zip"
