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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from chat import apikeys, artifacts, quotas, store
from chat.access import ChatAction, access_chat
from chat.catalog import UnknownModel, available_models, default_agent, default_model
from chat.core.artifacts import TEXT_KINDS, Kind, detect_kind, safe_filename
from chat.core.eventlog import msg_event
from chat.core.messages import ChatMessage
from chat.live.doorbell import ring, ring_cancel
from chat.models import (
    Agent,
    ApiKey,
    Artifact,
    ArtifactVersion,
    ChatEvent,
    ChatSession,
    ChatToolGrant,
    QueuedInput,
    Run,
    ToolApproval,
)
from chat.rows import create as create_row
from chat.runhost import transitions
from chat.runhost.executor import launch_on_commit
from chat.runhost.titles import provisional_title

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 32_000


class ActionError(Exception):
    """A user action that cannot be done, with a message for that user."""

    def __init__(
        self, message: str, code: str = "bad_request", retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after = retry_after  # seconds, for a limit that lifts by itself


@contextmanager
def _within_limits() -> Iterator[None]:
    """A user's limit (chat/quotas.py) refuses the action with its own words."""
    try:
        yield
    except quotas.OverLimit as exc:
        raise ActionError(exc.message, exc.code, exc.retry_after) from None


# --- chats ---------------------------------------------------------------------------------------


def new_chat(user, *, agent: Agent | None = None, model: str = "", title: str = "") -> ChatSession:
    with transaction.atomic():
        return _create_chat(user, agent=agent, model=model, title=title)


def _create_chat(user, *, agent: Agent | None, model: str, title: str = "") -> ChatSession:
    with _within_limits():
        quotas.check_new_chat(user)
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
        raise ActionError(_("A chat needs a title."), "empty")
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
    """Delete a chat with its log, its runs and its artifacts (rows and stored content);
    returns its title.

    A live run is asked to stop first; its process finds the chat gone and ends.
    """
    chat = access_chat(user, chat_id, ChatAction.MANAGE)
    title = chat.display_title
    workspace = settings.LYCEUM_WORKSPACE_ROOT / str(chat.pk)  # files of older versions
    with transaction.atomic():
        for run in Run.objects.filter(chat=chat, status=Run.Status.RUNNING):
            ring_cancel(run.pk)
        stored = artifacts.storage_names(chat.pk)
        chat.delete()
        transaction.on_commit(lambda: artifacts.forget_content(stored))
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


@dataclass
class SendCheck:
    """What an app decided about a message just stored (see :func:`register_send_check`)."""

    hold: bool = False  # keep the message but start no run for it (nor let a live run take it)
    notices: list[str] = field(default_factory=list)  # system notes shown after the message


SendCheckHook = Callable[[ChatSession, QueuedInput], SendCheck | None]
_send_checks: dict[str, SendCheckHook] = {}


def register_send_check(kind: str, check: SendCheckHook) -> None:
    """Check each message sent into a chat of ``kind``, inside the send's transaction.

    The classroom holds a student's message while the teacher has paused the AI, and
    moderates it. A held message's ``QueuedInput`` is stored consumed, so no run takes
    it; whoever releases it marks it unconsumed and starts the run.
    """
    _send_checks[kind] = check


@dataclass(frozen=True)
class SendResult:
    input_id: int
    display_seq: int
    run_id: str | None  # the run it started (None when the message was queued or repeated)
    duplicate: bool
    queued: bool
    chat_id: str = ""
    held: bool = False  # kept, no run started (see register_send_check)


def _checked_text(text: str) -> str:
    text = (text or "").strip()
    if not text:
        raise ActionError(_("The message is empty."), "empty")
    if len(text) > MAX_MESSAGE_CHARS:
        raise ActionError(
            _("The message is too long (%(length)s characters; the limit is %(limit)s).")
            % {"length": len(text), "limit": MAX_MESSAGE_CHARS},
            "too_long",
        )
    return text


def _checked_client_id(client_id: str) -> str:
    client_id = (client_id or "").strip()[:64]
    if not client_id:
        raise ActionError(_("The message has no client id."), "no_client_id")
    return client_id


def send_message(
    user,
    chat_id,
    text: str,
    client_id: str,
    *,
    thinking: bool = True,
    edit_of: int | None = None,
    attachments: list[str] | None = None,
    language: str = "",
) -> SendResult:
    """Store a user message once per ``client_id``; start a run unless one is live.

    ``attachments`` are ids of versions attached to this chat (:func:`attach_file`).
    ``language`` is the sender's page's: the owner writing from a page in another
    language than the chat's moves the chat to it (its live fragments and the model's
    replies follow), as someone who switched the interface expects.
    """
    text = _checked_text(text)
    client_id = _checked_client_id(client_id)
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    existing = _sent_before(chat, client_id)
    if existing:
        return existing
    try:
        with transaction.atomic():
            if language and language != chat.language and chat.owner_id == user.pk:
                ChatSession.objects.filter(pk=chat.pk).update(language=language)
                chat.language = language
            return _record_send(user, chat, text, client_id, thinking, edit_of, attachments)
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
    attachments: list[str] | None = None,
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
            raise ActionError(_("No agent named '%(slug)s'.") % {"slug": agent_slug}, "not_found")
    with transaction.atomic():
        if chat_id:
            if model:
                _switch_model(chat, model)
        else:
            if attachments:
                raise ActionError(_("Attach files to an existing chat."), "bad_request")
            chat = _create_chat(user, agent=agent, model=model)
        return _record_send(user, chat, text, client_id, thinking, None, attachments)


def _sent_before(chat: ChatSession, client_id: str) -> SendResult | None:
    # A written-out statement: every send asks it on the database thread, and building
    # it with the ORM cost more than running it. (chat, client_id) is unique.
    opts = QueuedInput._meta
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {quote(str(opts.pk.column))}, {quote(str(opts.get_field('display_seq').column))} "
        f"FROM {quote(opts.db_table)} WHERE {quote(opts.get_field('chat').column)} = %s "
        f"AND {quote(str(opts.get_field('client_id').column))} = %s"
    )
    chat_id = opts.get_field("chat").get_db_prep_value(chat.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [chat_id, client_id])
        existing = cursor.fetchone()
    if existing is None:
        return None
    return SendResult(existing[0], existing[1] or 0, None, True, False, str(chat.pk))


def _record_send(
    user,
    chat: ChatSession,
    text: str,
    client_id: str,
    thinking: bool,
    edit_of: int | None,
    attachments: list[str] | None = None,
) -> SendResult:
    _check_budget(chat)
    live = transitions.has_live_run(chat, lock=True)
    with _within_limits():
        quotas.take_message(user)
        if not live:
            quotas.check_new_run(chat.owner_id)
    attached = _attached_versions(chat, attachments or [])
    context_text, images = _with_attachments(chat, text, attached)
    # A run that no check can hold is made first, so the input is stored with its run
    # and its seq in one statement (a held chat's run waits for its checks).
    run = None
    if not live and chat.kind not in _send_checks:
        run = transitions.new_run(chat, thinking=thinking)
    # The message's seq (and the title's after it) is reserved before the input is
    # stored: the message names its input, the input its seq.
    # A new chat's provisional title is set in the same statement.
    title_text = provisional_title(text) if not chat.title else None
    count = 1 if title_text is None else 2
    seq = store.reserve_seqs(chat.pk, store.DISPLAY, count, title=title_text) + 1
    entry = create_row(
        QueuedInput,
        chat=chat,
        client_id=client_id,
        content=context_text,
        images=images,
        display_seq=seq,
        run=run,
    )
    message = ChatMessage(role="user", content=text, extra={"input_id": entry.pk})
    if edit_of:
        message.extra["edit_of"] = edit_of
    if live:
        message.extra["queued"] = True
    if attached:
        message.extra["attachments"] = [
            artifacts.card_payload(v.artifact, v) | {"type": "attachment"} for v in attached
        ]
    payloads = [msg_event(message, store.now_ms())]
    if title_text is not None:
        payloads.append({"type": "title", "title": title_text})
    rows = store.insert_events(chat.pk, store.DISPLAY, seq - 1, payloads)
    row = rows[0]
    if attached:
        ArtifactVersion.objects.filter(pk__in=[v.pk for v in attached], seq=None).update(
            seq=row.seq
        )
    checked = _send_checks[chat.kind](chat, entry) if chat.kind in _send_checks else None
    if checked is not None and checked.notices:
        notes = [ChatMessage(role="system", content=notice) for notice in checked.notices]
        rows += store.append_display_messages(chat.pk, notes)
    if checked is not None and checked.hold:
        QueuedInput.objects.filter(pk=entry.pk).update(consumed=True)
        ring(chat.pk, rows)
        return SendResult(entry.pk, row.seq, None, False, True, str(chat.pk), held=True)
    run_id = None
    if not live:
        if run is None:
            run = transitions.new_run(chat, thinking=thinking)
            # The message belongs to the run it started, even if the run ends before
            # taking it.
            QueuedInput.objects.filter(pk=entry.pk).update(run=run)
        run_id = str(run.pk)
        launch_on_commit(run_id)
    ring(chat.pk, rows)
    return SendResult(entry.pk, row.seq, run_id, False, live, str(chat.pk))


# --- attachments ---------------------------------------------------------------------------------

MAX_ATTACHMENTS = 10


def attach_file(user, chat_id, name: str, data: bytes) -> ArtifactVersion:
    """Store a file the user attaches to ``chat_id``; the version to send with a message.

    The kind comes from the content, and must be one the settings allow. Attaching
    the same name again is a new version of that file (the same content: the same
    version).
    """
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    path = safe_filename(name)
    detected = detect_kind(path, data)
    allowed = settings.LYCEUM_ATTACHMENT_KINDS
    if detected.kind.value not in allowed:
        raise ActionError(
            _("%(path)s is %(kind)s; files you can attach here: %(allowed)s.")
            % {
                "path": path,
                "kind": _kind_words_shown(detected.kind),
                "allowed": ", ".join(allowed),
            },
            "refused_type",
        )
    with transaction.atomic():
        try:
            saved = artifacts.save_version(
                chat.pk, path, data, source=Artifact.Source.ATTACHMENT, card=False
            )
        except artifacts.ArtifactError as exc:
            raise ActionError(exc.message, exc.code) from None
        if saved is not None:
            return saved.version
        version = artifacts.latest_version(chat.pk, path)
        assert version is not None
        return version


def _kind_words_shown(kind: Kind) -> str:
    """What a kind of file is called, for the person attaching it (translated)."""
    words = {Kind.BINARY: _("a binary file"), Kind.IMAGE: _("an image"), Kind.PDF: _("a PDF")}
    return words.get(kind) or _("a %(kind)s file") % {"kind": kind.value}


def _kind_words(kind: Kind) -> str:
    return {Kind.BINARY: "a binary file", Kind.IMAGE: "an image", Kind.PDF: "a PDF"}.get(
        kind, f"a {kind.value} file"
    )


def _attached_versions(chat: ChatSession, ids: list[str]) -> list[ArtifactVersion]:
    ids = list(dict.fromkeys(str(i) for i in ids if i))
    if not ids:
        return []
    if len(ids) > MAX_ATTACHMENTS:
        raise ActionError(
            _("Attach at most %(count)s files to one message.") % {"count": MAX_ATTACHMENTS},
            "too_many",
        )
    try:
        found = {
            str(v.pk): v
            for v in ArtifactVersion.objects.filter(pk__in=ids, artifact__chat=chat).select_related(
                "artifact"
            )
        }
    except ValidationError:
        found = {}
    if len(found) != len(ids):
        raise ActionError(_("An attached file is gone; attach it again."), "not_found")
    return [found[i] for i in ids]


def _with_attachments(
    chat: ChatSession, text: str, attached: list[ArtifactVersion]
) -> tuple[str, list[str]]:
    """The message as the model gets it (text files inlined, up to a cap) and its images."""
    if not attached:
        return text, []
    budget = settings.LYCEUM_ATTACHMENT_CONTEXT_CHARS
    parts = [text]
    images: list[str] = []
    for version in attached:
        path = version.artifact.path
        kind = Kind(version.kind)
        if kind == Kind.IMAGE:
            if not _model_takes_images(chat.model):
                raise ActionError(
                    _(
                        "The model %(model)s cannot read images; switch to a model that can, "
                        "or send the message without %(path)s."
                    )
                    % {"model": chat.model, "path": path},
                    "no_images",
                )
            images.append(str(version.pk))
            parts.append(f"[Attached image: {path}]")
            continue
        content = artifacts.read_text(version) if kind in TEXT_KINDS else None
        if content is None:
            parts.append(
                f"[Attached file: {path}, {artifacts.human_size(version.size)}, "
                f"{_kind_words(kind)}. It is in your workspace; list_files shows it.]"
            )
            continue
        shown = content[: max(budget, 0)]
        budget -= len(shown)
        note = ""
        if len(shown) < len(content):
            note = (
                f"\n[Cut: only the first {len(shown)} of {len(content)} characters are shown "
                f"here; read_file('{path}') reads the whole file.]"
            )
        parts.append(f"Attached file {path}:\n```\n{shown}\n```{note}")
    return "\n\n".join(p for p in parts if p), images


def _model_takes_images(alias: str) -> bool:
    return any(c.alias == alias and c.accepts_images for c in available_models())


def _start_run(chat: ChatSession, *, kind: str = Run.Kind.REPLY) -> Run:
    """A run for ``chat``, launched after the commit (call inside a transaction)."""
    _check_budget(chat)
    if transitions.live_run(chat, lock=True) is not None:
        raise ActionError(_("Wait for the current reply to finish."), "busy")
    with _within_limits():
        quotas.check_new_run(chat.owner_id)
    run = transitions.new_run(chat, kind=kind)
    launch_on_commit(str(run.pk))
    return run


def _check_budget(chat: ChatSession) -> None:
    """Chat runs spend the same monthly budget as the relay (chat/relay/limits.py)."""
    from chat.relay import limits

    try:
        limits.check_run(chat.owner_id)
    except limits.Refused as exc:
        raise ActionError(_(exc.message), "over_budget") from None


# --- versions and branches -------------------------------------------------------------------
# Editing a message or regenerating a reply starts a branch (chat.core.branches): the log
# keeps every version, the page and the model see the active path. A run writes to the
# branch current when it started, so nothing branches or switches while a run is live.

BUSY_BRANCHING = gettext_noop(
    "Wait for the current reply to finish, or stop it, before changing versions."
)


def _lock_idle(chat: ChatSession) -> None:
    """Hold the chat's row for the branch change; refuse while a run is live."""
    ChatSession.objects.select_for_update().filter(pk=chat.pk).values_list("pk").first()
    if transitions.live_run(chat, lock=True) is not None:
        raise ActionError(_(BUSY_BRANCHING), "busy")


def _path_message(chat: ChatSession, shape, seq: int) -> dict | None:
    """The payload of message ``seq`` when it is on the active path."""
    if not shape.path().contains(seq):
        return None
    return (
        ChatEvent.objects.filter(chat=chat, channel=ChatEvent.Channel.DISPLAY, seq=seq, kind="msg")
        .values_list("payload", flat=True)
        .first()
    )


def _drop_inputs_off_path(chat: ChatSession) -> None:
    """Messages still waiting for a run but not on the new path are not taken by one."""
    path = store.branch_shape(chat.pk).path()
    waiting = QueuedInput.objects.filter(chat=chat, consumed=False)
    off = [
        pk for pk, seq in waiting.values_list("pk", "display_seq") if not path.contains(seq or 0)
    ]
    if off:
        QueuedInput.objects.filter(pk__in=off).update(consumed=True)


def _answered_message(chat: ChatSession, shape, before: int) -> int:
    """The user message a reply at ``before`` answers: the newest on the path before it that
    a run took before the reply was written (else the newest, which no run took yet)."""
    on_path = store.on_path(shape.path())
    display = ChatEvent.objects.filter(chat=chat, channel=ChatEvent.Channel.DISPLAY, seq__lt=before)
    users = list(
        display.filter(on_path, kind="msg", payload__role="user")
        .exclude(payload__has_key="sender_name")
        .order_by("-seq")
        .values_list("seq", flat=True)[:50]
    )
    if not users:
        raise ActionError(_("There is no message to answer yet."), "empty")
    taken = set(
        display.filter(on_path, kind="input_taken", payload__input_seq__in=users).values_list(
            "payload__input_seq", flat=True
        )
    )
    return next((seq for seq in users if seq in taken), users[0])


def _is_reply(chat: ChatSession, shape, seq: int) -> bool:
    """Event ``seq`` is on the active path and ends a reply (a message of the assistant, or
    how a run ended: an error, a stop)."""
    if not shape.path().contains(seq):
        return False
    row = (
        ChatEvent.objects.filter(chat=chat, channel=ChatEvent.Channel.DISPLAY, seq=seq)
        .values_list("kind", "payload")
        .first()
    )
    if row is None:
        return False
    kind, payload = row
    return kind in ("error", "cancelled") or (kind == "msg" and payload.get("role") == "assistant")


def regenerate(user, chat_id, seq: int | None = None) -> str:
    """A new version of the reply at ``seq`` (the newest when None), in its place.

    The chat forks right after the user message the reply answers; the earlier versions
    stay in the log, one switch away.
    """
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        _lock_idle(chat)
        shape = store.branch_shape(chat.pk)
        if seq is None:
            seq = store.last_display_seq(chat.pk) + 1
        elif not _is_reply(chat, shape, seq):
            raise ActionError(_("There is no such reply to regenerate."), "not_found")
        answered = _answered_message(chat, shape, seq)
        following = store.display_events_after(chat.pk, answered, 1, shape=shape)
        if not following:
            raise ActionError(_("There is no reply to regenerate yet."), "empty")
        marker = store.context_marker(chat.pk, answered)
        context = store.context_until(chat.pk, marker) if marker else store.load_context(chat.pk)
        run = _start_run(chat)
        rows = store.fork(chat.pk, parent=shape.active, at=following[0].seq, context=context)
        _drop_inputs_off_path(chat)
        ring(chat.pk, rows)
    return str(run.pk)


def edit_message(user, chat_id, seq: int, text: str, client_id: str) -> SendResult:
    """Send ``text`` in place of the message at ``seq``: the chat goes on from there on a
    new branch; the earlier version and what followed it stay, one switch away."""
    text = _checked_text(text)
    client_id = _checked_client_id(client_id)
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    existing = _sent_before(chat, client_id)
    if existing:
        return existing
    with transaction.atomic():
        _lock_idle(chat)
        shape = store.branch_shape(chat.pk)
        payload = _path_message(chat, shape, seq)
        if not payload or payload.get("role") != "user" or payload.get("sender_name"):
            raise ActionError(_("There is no such message of yours to edit."), "not_found")
        marker = store.context_marker(chat.pk, seq)
        context = (
            store.context_until(chat.pk, marker - 1) if marker else store.load_context(chat.pk)
        )
        ring(chat.pk, store.fork(chat.pk, parent=shape.active, at=seq, context=context))
        _drop_inputs_off_path(chat)
        return _record_send(user, chat, text, client_id, True, None)


def edit_last_message(user, chat_id, text: str, client_id: str) -> SendResult:
    """:func:`edit_message` for the newest message of the person on the active path."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    shape = store.branch_shape(chat.pk)
    last = _answered_message(chat, shape, store.last_display_seq(chat.pk) + 1)
    return edit_message(user, chat.pk, last, text, client_id)


def switch_version(user, chat_id, base: int, index: int) -> int:
    """Show version ``index`` (from 0) of the messages after event ``base``, with what
    followed it when last shown; every open page of the chat follows. Returns the branch."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        _lock_idle(chat)
        shape = store.branch_shape(chat.pk)
        target = shape.switch_target(base, index)
        if target is None:
            raise ActionError(_("There is no such version."), "not_found")
        if target == shape.active:
            return target
        context = store.context_until(chat.pk, shape.left_ctx[target])
        ring(chat.pk, store.switch_branch(chat.pk, to=target, context=context))
        _drop_inputs_off_path(chat)
    return target


def request_compaction(user, chat_id) -> str:
    """ "Compact now": a run that only compacts the context."""
    chat = access_chat(user, chat_id, ChatAction.WRITE)
    with transaction.atomic():
        if not store.load_context(chat.pk):
            raise ActionError(_("There is nothing to compact yet: the chat is empty."), "empty")
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
            raise ActionError(_("There is no such tool call waiting for approval."), "not_found")
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


# --- API keys ------------------------------------------------------------------------------------


def new_api_key(user, name: str = "") -> tuple[ApiKey, str]:
    """A new API key of ``user`` and its raw value (shown once), within their key limit."""
    with transaction.atomic(), _within_limits():
        quotas.check_new_api_key(user)
        return apikeys.create_api_key(user, name)


# --- the relay --------------------------------------------------------------------------------------


def record_relay_exchange(user, session_key: str, user_text: str, reply_text: str, model: str):
    """Append a relayed request's user message and its reply to the chat named after
    ``session_key`` (made on first use), display and context alike, in one transaction;
    the doorbell rings on commit, so an open page shows it live. Returns the chat."""
    from chat.core.channels import LiveChannels
    from chat.models import RelaySession

    with transaction.atomic():
        link = (
            RelaySession.objects.select_related("chat")
            .filter(user=user, session_key=session_key)
            .first()
        )
        if link is None:
            chat = store.create_chat(user, title=session_key[:200], model=model)
            link = RelaySession.objects.create(user=user, session_key=session_key, chat=chat)
        chat = link.chat
        context = store.load_context(chat.pk)
        channels = LiveChannels(context=list(context))
        channels.push_both(ChatMessage(role="user", content=user_text))
        channels.push_both(ChatMessage(role="assistant", content=reply_text))
        rows = store.append_display_messages(chat.pk, channels.display)
        store.persist_context(chat.pk, channels.context, len(context))
        ring(chat.pk, rows)
    return chat
