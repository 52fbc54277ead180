"""Fetch-with-permission for chats. Nothing reads a chat by id any other way.

Chat knows only owners. Other apps (classroom: a teacher watching a student)
grant extra access by registering a policy, so chat never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection
from django.http import Http404

from chat import rows
from chat.models import Artifact, ArtifactVersion, ChatSession


class ChatAction(StrEnum):
    VIEW = "view"  # read the chat and follow it live
    WRITE = "write"  # send messages, approve tools, cancel, switch model
    MANAGE = "manage"  # rename, delete


ChatPolicy = Callable[[Any, ChatSession, ChatAction], bool]
_policies: list[ChatPolicy] = []
_owner_limits: dict[str, ChatPolicy] = {}


def register_chat_policy(policy: ChatPolicy) -> None:
    """A policy returns True to grant ``action`` on ``chat`` to ``user``."""
    if policy not in _policies:
        _policies.append(policy)


def register_owner_limit(kind: str, limit: ChatPolicy) -> None:
    """What the owner of a chat of ``kind`` may do (say, a student removed from a class
    keeps reading their class chat but no longer writes in it). Plain chats have none."""
    _owner_limits[kind] = limit


class ViewHow(StrEnum):
    """How someone who is not the owner read a chat (what an observer records)."""

    PAGE = "page"  # the chat page (or a page of its older messages)
    SOCKET = "socket"  # the chat's live socket
    EXPORT = "export"  # a transcript download
    API = "api"  # an API read (a run's status, the artifact list)
    ARTIFACT = "artifact"  # an artifact's page, content, preview or zip


ViewObserver = Callable[[Any, ChatSession, ViewHow], None]
_view_observers: list[ViewObserver] = []


def register_view_observer(observer: ViewObserver) -> None:
    """``observer(user, chat, how)`` is called by :func:`note_view` for every read of a
    chat by someone who is not its owner (the classroom audits a teacher's reads)."""
    if observer not in _view_observers:
        _view_observers.append(observer)


def note_view(user, chat: ChatSession | str, how: ViewHow) -> None:
    """Tell the observers that ``user`` read ``chat`` (after a successful VIEW access).

    Every caller that lets someone read a chat calls it: pages, exports, the socket, the
    API, the artifact views. The owner reading their own chat is nobody's business.
    """
    if not _view_observers or not getattr(user, "is_authenticated", False):
        return
    if not isinstance(chat, ChatSession):
        chat = ChatSession.objects.only("id", "owner_id", "kind").get(pk=chat)
    if chat.owner_id == user.pk:
        return
    for observer in _view_observers:
        observer(user, chat, how)


def can_access_chat(user, chat: ChatSession, action: ChatAction = ChatAction.VIEW) -> bool:
    if not user.is_authenticated or not user.is_active:
        return False
    if chat.owner_id == user.pk:
        limit = _owner_limits.get(chat.kind)
        return limit is None or limit(user, chat, action)
    return any(policy(user, chat, action) for policy in _policies)


def access_chat(user, chat_id, action: ChatAction = ChatAction.VIEW) -> ChatSession:
    """The chat, if ``user`` may perform ``action`` on it; otherwise 404 (never 403:
    another user's chat must look exactly like a chat that does not exist)."""
    try:
        chat = _chat_with_owner(chat_id)
    except (ValidationError, ValueError, TypeError):
        raise Http404("No such chat") from None
    if chat is None or not can_access_chat(user, chat, action):
        raise Http404("No such chat")
    return chat


def _chat_with_owner(chat_id) -> ChatSession | None:
    """The chat with its owner (``select_related("owner")``), in one written-out statement:
    every send asks it on the database thread, where building it through the ORM cost
    more than running it (chat/rows.py)."""
    owner_model = ChatSession._meta.get_field("owner").related_model
    assert isinstance(owner_model, type)
    chat_fields = rows.fields_of(ChatSession)
    sql = (
        f"SELECT {rows.select_list(ChatSession, 'c')}, {rows.select_list(owner_model, 'u')} "
        f"FROM {rows.table(ChatSession)} c INNER JOIN {rows.table(owner_model)} u "
        f"ON u.{rows.column(owner_model, 'pk')} = c.{rows.column(ChatSession, 'owner')} "
        f"WHERE c.{rows.column(ChatSession, 'pk')} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [rows.prep(ChatSession, "pk", chat_id)])
        row = cursor.fetchone()
    if row is None:
        return None
    chat = rows.instance(ChatSession, row[: len(chat_fields)])
    owner = rows.instance(owner_model, row[len(chat_fields) :])
    ChatSession._meta.get_field("owner").set_cached_value(chat, owner)  # type: ignore[attr-defined]
    return chat


def access_artifact(user, artifact_id, action: ChatAction = ChatAction.VIEW) -> Artifact:
    """The artifact (with its chat), if ``user`` may ``action`` its chat; otherwise 404.

    An artifact of a chat the user cannot see answers exactly like one that does not
    exist, for every page, preview, download, zip and API route.
    """
    try:
        artifact = Artifact.objects.select_related("chat", "chat__owner").get(pk=artifact_id)
    except (Artifact.DoesNotExist, ValidationError, ValueError):
        raise Http404("No such artifact") from None
    if not can_access_chat(user, artifact.chat, action):
        raise Http404("No such artifact")
    return artifact


def access_version(
    user, artifact_id, number, action: ChatAction = ChatAction.VIEW
) -> ArtifactVersion:
    """Version ``number`` of an artifact, fetched with the artifact's chat permission."""
    artifact = access_artifact(user, artifact_id, action)
    try:
        version = artifact.versions.get(number=int(number))
    except (ArtifactVersion.DoesNotExist, ValueError, TypeError):
        raise Http404("No such version") from None
    version.artifact = artifact
    return version
