"""What one user may hold and do: chats, messages per minute, replies at once, API keys,
stored files. The limits are settings (0: none); each refusal says what to do.

Counts (chats, running replies, keys, bytes) are read under a lock of that user and kind,
inside the caller's transaction, so two requests at once cannot both take the last place. The
message rate is a bucket of ``chat/relay/limits.py`` (Redis, or a locked counter row).
Callers turn :class:`OverLimit` into their own error (``actions.ActionError``,
``artifacts.ArtifactError``).
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils.translation import gettext, ngettext

from chat.relay import limits

MB = 1024 * 1024


class OverLimit(Exception):
    """Over one of the user's limits, with a message for them."""

    def __init__(self, message: str, code: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.retry_after = message, code, retry_after


def _lock(what: str, user_id: Any) -> None:
    """Serialise one kind of counted write of one user (inside the caller's transaction).

    A row of its own per kind, not the user's row: the storage check runs inside a run's
    last transaction (a reply's code blocks) and the run check inside a send's, each holding
    other rows already; one lock taken last by one kind of check cannot close a cycle.
    """
    from chat.models import UsageCounter

    scope = f"lock:{what}:{user_id}"
    rows = UsageCounter.objects.select_for_update().filter(scope=scope, period="lock")
    if rows.values_list("pk").first() is not None:
        return
    try:
        with transaction.atomic():
            UsageCounter.objects.create(scope=scope, period="lock")
    except IntegrityError:
        pass  # made by a request at the same time
    rows.values_list("pk").get()


def check_new_chat(user: Any) -> None:
    limit = settings.LYCEUM_MAX_CHATS_PER_USER
    if not limit:
        return
    from chat.models import ChatSession

    _lock("chats", user.pk)
    if ChatSession.objects.filter(owner_id=user.pk).count() >= limit:
        raise OverLimit(
            gettext(
                "You have %(limit)d chats, the most one person may keep. "
                "Delete chats you no longer need to start new ones."
            )
            % {"limit": limit},
            "too_many_chats",
        )


def take_message(user: Any) -> None:
    """One message from the user's bucket (a repeated client id is not a new message)."""
    rate = settings.LYCEUM_MESSAGES_PER_MINUTE
    if not rate:
        return
    try:
        limits.take(limits.Policy(f"messages:{user.pk}", rate, rate, 0))
    except limits.Refused as exc:
        raise OverLimit(
            ngettext(
                "You are sending messages too fast (at most %(rate)d a minute). "
                "Try again in %(wait)d second.",
                "You are sending messages too fast (at most %(rate)d a minute). "
                "Try again in %(wait)d seconds.",
                exc.retry_after,
            )
            % {"rate": rate, "wait": exc.retry_after},
            "rate_limited",
            exc.retry_after,
        ) from None


def check_new_run(owner_id: Any) -> None:
    """Before a reply starts in one of the owner's chats: how many run at once."""
    limit = settings.LYCEUM_MAX_RUNNING_PER_USER
    if not limit:
        return
    from chat.models import Run
    from chat.runhost.transitions import LIVE

    _lock("runs", owner_id)
    if Run.objects.filter(chat__owner_id=owner_id, status__in=LIVE).count() >= limit:
        raise OverLimit(
            ngettext(
                "You already have %(limit)d reply in progress, the most at once. "
                "Wait for it to finish, or stop it, and send again.",
                "You already have %(limit)d replies in progress in your chats, the most at "
                "once. Wait for one to finish, or stop one, and send again.",
                limit,
            )
            % {"limit": limit},
            "too_many_runs",
            5,
        )


def check_new_api_key(user: Any) -> None:
    limit = settings.LYCEUM_MAX_API_KEYS
    if not limit:
        return
    from chat.models import ApiKey

    _lock("keys", user.pk)
    if ApiKey.objects.filter(user_id=user.pk, revoked_at__isnull=True).count() >= limit:
        raise OverLimit(
            gettext(
                "You have %(limit)d active API keys, the most one person may hold. "
                "Revoke one you no longer use to create another."
            )
            % {"limit": limit},
            "too_many_keys",
        )


def storage_used(owner_id: Any) -> int:
    """Bytes of every version of every file in the owner's chats."""
    from chat.models import ArtifactVersion

    total = ArtifactVersion.objects.filter(artifact__chat__owner_id=owner_id).aggregate(
        total=Sum("size")
    )["total"]
    return int(total or 0)


def check_storage(chat_id: Any, size: int) -> None:
    """Before ``size`` more bytes are stored in ``chat_id``: its owner's quota."""
    quota_mb = settings.LYCEUM_STORAGE_QUOTA_MB
    if not quota_mb:
        return
    from chat.models import ChatSession

    owner_id = ChatSession.objects.filter(pk=chat_id).values_list("owner_id", flat=True).first()
    if owner_id is None:
        return
    _lock("storage", owner_id)
    used = storage_used(owner_id)
    if used + size > quota_mb * MB:
        raise OverLimit(
            gettext(
                "Your files would take %(total)s, over your storage quota of %(quota)s. "
                "Delete chats or files you no longer need."
            )
            % {"total": _megabytes(used + size), "quota": _megabytes(quota_mb * MB)},
            "over_quota",
        )


def _megabytes(size: int) -> str:
    return gettext("%(mb)s MB") % {"mb": f"{math.ceil(size * 10 / MB) / 10:g}"}
