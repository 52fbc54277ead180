"""What people can do to a chat: one function per action, each owning its effects.

An action checks access (``chat.access``), writes in one transaction, and after the
commit rings the doorbell and launches the run it started. Callers (the socket
consumer, the views, the API, and later the classroom and the relay) call one
action and nothing else: they never dispatch a run or ring a doorbell themselves.
Actions are synchronous (call them from async code through
``database_sync_to_async``) and raise :class:`ActionError` with a message for the
user when the action cannot be done.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from chat import store
from chat.access import ChatAction, access_chat
from chat.catalog import UnknownModel, available_models, default_agent, default_model
from chat.core.eventlog import msg_event
from chat.core.messages import ChatMessage
from chat.live.doorbell import ring, ring_cancel
from chat.models import Agent, ChatEvent, ChatSession, ChatToolGrant, QueuedInput, Run, ToolApproval
from chat.runhost import transitions
from chat.runhost.executor import launch_on_commit
from chat.runhost.titles import provisional_title

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 32_000


class ActionError(Exception):
    """A user action that cannot be done, with a message for that user."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# --- chats ---------------------------------------------------------------------------------------


def new_chat(user, *, agent: Agent | None = None, model: str = "", title: str = "") -> ChatSession:
    with transaction.atomic():
        return _create_chat(user, agent=agent, model=model, title=title)


def _create_chat(user, *, agent: Agent | None, model: str, title: str = "") -> ChatSession:
    agent = agent or default_agent()
    try:
        alias = default_model(model or agent.default_model)
    except UnknownModel as exc:
        raise ActionError(str(exc), "unknown_model") from None
    if model and alias != model:
        raise ActionError(str(UnknownModel(model)), "unknown_model")
    chat = store.create_chat(user, title=title, model=alias)
    chat.agent = agent
    chat.save(update_fields=["agent"])
    return chat


def rename_chat(user, chat_id, title: str) -> str:
    chat = access_chat(user, chat_id, ChatAction.MANAGE)
    title = " ".join((title or "").split())[:200]
    if not title:
        raise ActionError("A chat needs a title.", "empty")
    with transaction.atomic():
        ring(chat.pk, _set_title(chat, title))
    return title


def _set_title(chat: ChatSession, title: str) -> list[ChatEvent]:
    """Store the title (inside a transaction); the caller rings for the event returned."""
    ChatSession.objects.filter(pk=chat.pk).update(title=title)
    return store.append_display(chat.pk, [{"type": "title", "title": title}])


def pin_chat(user, chat_id, *, pinned: bool) -> bool:
    """Pin a chat to the top of its owner's list, or unpin it."""
    chat = access_chat(user, chat_id, ChatAction.MANAGE)
    with transaction.atomic():
        # .update() leaves updated_at alone: pinning is not activity in the chat.
        ChatSession.objects.filter(pk=chat.pk).update(pinned_at=timezone.now() if pinned else None)
    return pinned


def delete_chat(user, chat_id) -> str:
    """Delete a chat with its log, its runs and its workspace files; returns its title.

    A live run is asked to stop first; its process finds the chat gone and ends.
    """
    chat = access_chat(user, chat_id, ChatAction.MANAGE)
    title = chat.display_title
    workspace = settings.LYCEUM_WORKSPACE_ROOT / str(chat.pk)
    with transaction.atomic():
        for run in Run.objects.filter(chat=chat, status=Run.Status.RUNNING):
            ring_cancel(run.pk)
        chat.delete()
        transaction.on_commit(lambda: shutil.rmtree(workspace, ignore_errors=True))
    return title


def switch_model(user, chat_id, alias: str) -> str:
    """Use ``alias`` from the next request on (a run in progress keeps its model)."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        return _switch_model(chat, alias)


def _switch_model(chat: ChatSession, alias: str) -> str:
    if alias not in {c.alias for c in available_models()}:
        raise ActionError(str(UnknownModel(alias)), "unknown_model")
    if alias == chat.model:
        return alias
    ChatSession.objects.filter(pk=chat.pk).update(model=alias)
    chat.model = alias
    rows = store.append_display(chat.pk, [{"type": "model_switched", "model": alias}])
    ring(chat.pk, rows)
    return alias


# --- send ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SendResult:
    input_id: int
    display_seq: int
    run_id: str | None  # the run it started (None when the message was queued or repeated)
    duplicate: bool
    queued: bool
    chat_id: str = ""


def _checked_text(text: str) -> str:
    text = (text or "").strip()
    if not text:
        raise ActionError("The message is empty.", "empty")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ActionError(
            f"The message is too long ({len(text)} characters; the limit is {MAX_MESSAGE_CHARS}).",
            "too_long",
        )
    return text


def _checked_client_id(client_id: str) -> str:
    client_id = (client_id or "").strip()[:64]
    if not client_id:
        raise ActionError("The message has no client id.", "no_client_id")
    return client_id


def send_message(
    user,
    chat_id,
    text: str,
    client_id: str,
    *,
    thinking: bool = True,
    edit_of: int | None = None,
) -> SendResult:
    """Store a user message once per ``client_id``; start a run unless one is live."""
    text = _checked_text(text)
    client_id = _checked_client_id(client_id)
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    existing = _sent_before(chat, client_id)
    if existing:
        return existing
    try:
        with transaction.atomic():
            return _record_send(chat, text, client_id, thinking, edit_of)
    except IntegrityError:
        # Two sends with the same client id raced; the first one won.
        won = _sent_before(chat, client_id)
        if won is None:
            raise
        return won


def start_chat_and_send(
    user,
    text: str,
    client_id: str,
    *,
    chat_id=None,
    agent_slug: str = "",
    model: str = "",
    thinking: bool = True,
) -> SendResult:
    """Send into ``chat_id``, or into a new chat; all of it or nothing (the API's send).

    A new chat is made in the same transaction as its first message, so a refused
    message leaves no empty chat behind.
    """
    text = _checked_text(text)
    client_id = _checked_client_id(client_id)
    if chat_id:
        chat = access_chat(user, chat_id, ChatAction.WRITE)
        existing = _sent_before(chat, client_id)
        if existing:
            return existing
    agent = None
    if not chat_id and agent_slug:
        agent = Agent.objects.filter(slug=agent_slug).first()
        if agent is None:
            raise ActionError(f"No agent named {agent_slug!r}.", "not_found")
    with transaction.atomic():
        if chat_id:
            if model:
                _switch_model(chat, model)
        else:
            chat = _create_chat(user, agent=agent, model=model)
        return _record_send(chat, text, client_id, thinking, None)


def _sent_before(chat: ChatSession, client_id: str) -> SendResult | None:
    existing = QueuedInput.objects.filter(chat=chat, client_id=client_id).first()
    if existing is None:
        return None
    return SendResult(existing.pk, existing.display_seq or 0, None, True, False, str(chat.pk))


def _record_send(
    chat: ChatSession, text: str, client_id: str, thinking: bool, edit_of: int | None
) -> SendResult:
    live = transitions.live_run(chat, lock=True)
    entry = QueuedInput.objects.create(chat=chat, client_id=client_id, content=text)
    message = ChatMessage(role="user", content=text, extra={"input_id": entry.pk})
    if edit_of:
        message.extra["edit_of"] = edit_of
    if live:
        message.extra["queued"] = True
    (row,) = store.append_display(chat.pk, [msg_event(message, store.now_ms())])
    entry.display_seq = row.seq
    entry.save(update_fields=["display_seq"])
    rows = [row]
    if not chat.title:
        rows += _set_title(chat, provisional_title(text))
    run_id = None
    if live is None:
        run = transitions.new_run(chat, thinking=thinking)
        run_id = str(run.pk)
        # The message belongs to the run it started, even if the run ends before taking it.
        QueuedInput.objects.filter(pk=entry.pk).update(run=run)
        launch_on_commit(run_id)
    ring(chat.pk, rows)
    return SendResult(entry.pk, row.seq, run_id, False, live is not None, str(chat.pk))


def _start_run(chat: ChatSession, *, kind: str = Run.Kind.REPLY) -> Run:
    """A run for ``chat``, launched after the commit (call inside a transaction)."""
    if transitions.live_run(chat, lock=True) is not None:
        raise ActionError("Wait for the current reply to finish.", "busy")
    run = transitions.new_run(chat, kind=kind)
    launch_on_commit(str(run.pk))
    return run


def _last_user_index(context: list[ChatMessage]) -> int:
    for index in range(len(context) - 1, -1, -1):
        if context[index].role == "user":
            return index
    raise ActionError("There is no message to answer yet.", "empty")


def regenerate(user, chat_id) -> str:
    """Answer the last user message again; the earlier reply stays in the log and on screen."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        context = store.load_context(chat.pk)
        keep = _last_user_index(context) + 1
        run = _start_run(chat)
        if keep < len(context):
            store.restore_context(chat.pk, context[:keep])
        note = ChatMessage(role="system", content="Regenerating the last reply.")
        rows = store.append_display_messages(chat.pk, [note])
        ring(chat.pk, rows)
    return str(run.pk)


def edit_last_message(user, chat_id, text: str, client_id: str) -> SendResult:
    """Replace the last user message with ``text`` and answer it; both versions stay shown."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        if transitions.live_run(chat, lock=True) is not None:
            raise ActionError("Wait for the current reply to finish.", "busy")
        context = store.load_context(chat.pk)
        store.restore_context(chat.pk, context[: _last_user_index(context)])
        previous = (
            QueuedInput.objects.filter(chat=chat)
            .order_by("-pk")
            .values_list("display_seq", flat=True)
            .first()
        )
        result = send_message(user, chat.pk, text, client_id, edit_of=previous)
    return result


def request_compaction(user, chat_id) -> str:
    """ "Compact now": a run that only compacts the context."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        if not store.load_context(chat.pk):
            raise ActionError("There is nothing to compact yet: the chat is empty.", "empty")
        run = _start_run(chat, kind=Run.Kind.COMPACT)
    return str(run.pk)


# --- cancel --------------------------------------------------------------------------------------


def cancel_run(user, chat_id) -> str | None:
    """Ask the live run to stop. Idempotent; returns the run id or None when idle.

    A run waiting for an approval executes nowhere: it ends here, and what was
    queued behind it starts.
    """
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        run = transitions.live_run(chat, lock=True)
        if run is None:
            return None
        if run.status == Run.Status.WAITING:
            transitions.finish_waiting_run_cancelled(run)
            transaction.on_commit(lambda: launch_next_queued(chat))
            return str(run.pk)
        if not run.cancel_requested:
            Run.objects.filter(pk=run.pk).update(cancel_requested=True)
        ring_cancel(run.pk)
    return str(run.pk)


def launch_next_queued(chat: ChatSession) -> None:
    """After a run ended outside any task: start the run for messages queued behind it."""
    with transaction.atomic():
        launch_on_commit(transitions.start_run_if_idle(chat))


# --- approvals -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecideResult:
    run_id: str | None  # the run resumed, when this answer was the last one it waited for
    status: str


def decide_approval(
    user, chat_id, call_id: str, *, approve: bool, reason: str = "", always: bool = False
) -> DecideResult:
    """Approve or deny one tool call; the run resumes once every call has an answer."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        approval = (
            ToolApproval.objects.select_for_update()
            .filter(chat=chat, call_id=call_id)
            .select_related("run")
            .first()
        )
        if approval is None:
            raise ActionError("There is no such tool call waiting for approval.", "not_found")
        if approval.status != ToolApproval.Status.PENDING:
            return DecideResult(None, approval.status)  # answered already: idempotent
        approval.status = ToolApproval.Status.APPROVED if approve else ToolApproval.Status.DENIED
        approval.reason = (reason or "").strip()[:2000]
        approval.decided_by = user
        approval.decided_at = timezone.now()
        approval.save()
        if always and approve:
            ChatToolGrant.objects.get_or_create(
                chat=chat, tool_name=approval.tool_name, defaults={"granted_by": user}
            )
        run_id = transitions.record_decision(approval)
        launch_on_commit(run_id, resume=True)
    return DecideResult(run_id, approval.status)
