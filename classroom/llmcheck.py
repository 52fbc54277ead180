"""The optional model check of a class's guardrails (``Guardrails.check_model``).

When a class names a model, each student message and each persona reply is also read by
one short call to it (``chat.core.prompts.MODERATION_PROMPT``; the answer is "OK" or
"FLAG: <reason>"). The call never runs inside the send's or the run's transaction and
never holds the student's chat: :func:`check_on_commit` schedules it after the commit as
a task on the event loop the calling thread serves (the web process's or a worker's); a
hit writes a ``Flag`` (category ``llm``) and tells the wall, as the rule list does.

Because the answer may come after the reply has started, a hit of the model check never
holds a reply: it flags, and (unless the class asked only to be notified) adds a line to
the student's chat saying so, so nothing is hidden from the student. A failing or slow
model is logged and skipped: the chat goes on.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass

from asgiref.sync import SyncToAsync, async_to_sync
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction

from chat import store
from chat.catalog import UnknownModel, resolve_model
from chat.core.messages import ChatMessage
from chat.core.prompts import MODERATION_PROMPT, moderation_verdict
from chat.live.doorbell import ring
from chat.llm.types import ChatRequest
from classroom.models import Flag, FlagCategory, OnFlag

logger = logging.getLogger(__name__)

TEXT_MAX = 4_000  # what the check reads of one message
ANSWER_TOKENS = 60
MODEL_FLAG_NOTICE = "A message was flagged by the class's safety check for your teacher to read."

_checking: set[asyncio.Task] = set()


@dataclass(frozen=True)
class Job:
    model: str
    classroom_id: int
    chat_id: str
    student_id: int
    source: str  # Flag.Source
    speaker: str
    seq: int
    text: str


def check_on_commit(job: Job) -> None:
    """After the current transaction commits, check ``job`` in the background."""
    if job.model and job.text.strip():
        transaction.on_commit(lambda: _start(job))


def _start(job: Job) -> None:
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    if loop is not None and not loop.is_closed() and loop.is_running():
        loop.call_soon_threadsafe(_spawn, job)
        return
    # No event loop behind this thread (a management command, a WSGI request): check
    # here and now, after the commit all the same.
    async_to_sync(check)(job)


def _spawn(job: Job) -> None:
    # A fresh context: the one copied from the database thread's call would make the
    # task's own database calls look re-entrant to asgiref (and refuse them).
    task = asyncio.get_running_loop().create_task(check(job), context=contextvars.Context())
    _checking.add(task)
    task.add_done_callback(_checking.discard)


async def pending() -> None:
    """Wait for the checks started so far (tests, a clean shutdown)."""
    while _checking:
        await asyncio.gather(*list(_checking), return_exceptions=True)


async def check(job: Job) -> Flag | None:
    """One call to the class's check model; a "FLAG" answer becomes a flag."""
    try:
        resolved = await database_sync_to_async(resolve_model)(job.model)
    except UnknownModel:
        logger.warning("the check model %r of class %s is gone", job.model, job.classroom_id)
        return None
    request = ChatRequest(
        model=resolved.choice.model_id,
        messages=[ChatMessage(role="user", content=job.text[:TEXT_MAX])],
        system_prompt=MODERATION_PROMPT,
        max_tokens=ANSWER_TOKENS,
        thinking=False,
        temperature=0,
    )
    timeout = float(getattr(settings, "LYCEUM_MODERATION_TIMEOUT", 30.0))
    try:
        async with asyncio.timeout(timeout):
            end = await resolved.provider.complete(request)
    except Exception:  # noqa: BLE001 - the check is optional; the chat goes on without it
        logger.warning("the model check of chat %s failed", job.chat_id, exc_info=True)
        return None
    reason = moderation_verdict(end.text)
    if reason is None:
        return None
    return await database_sync_to_async(_flag)(job, reason)


def _flag(job: Job, reason: str) -> Flag:
    from classroom.actions import guardrails_of, ring_class  # actions imports this module

    with transaction.atomic():
        flag = Flag.objects.create(
            classroom_id=job.classroom_id,
            chat_id=job.chat_id,
            student_id=job.student_id,
            source=job.source,
            speaker=job.speaker,
            seq=job.seq,
            message=job.text[:TEXT_MAX],
            category=FlagCategory.LLM,
            severity=Flag.Severity.MEDIUM,
            reason=f"model check: {reason}"[:300],
        )
        ring_class(job.classroom_id, "flags", chat_id=str(job.chat_id))
        guardrails = guardrails_of(flag.classroom)
        if guardrails.on_flag != OnFlag.NOTIFY:
            note = ChatMessage(role="system", content=MODEL_FLAG_NOTICE)
            ring(job.chat_id, store.append_display_messages(job.chat_id, [note]))
    return flag
