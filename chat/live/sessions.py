"""Sessions that end everywhere: a socket lives only as long as the login it opened with.

A socket's ``scope["user"]`` is read once, at connect, from the session cookie; the
socket may stay open for a day. So every action and every access re-check reads the
session again (:func:`session_user`): it must still exist, still name the same user,
and its auth hash must still match (a password change elsewhere changes it), and the
user must still be active.

That alone would leave a socket that only watches reading on until its next re-check,
so logout, a password change and a deactivation also ring the user's group
(``user.<id>`` on the live layer, :func:`ring_user`): each of the user's sockets checks
its session at once and closes (4401 when the session has ended, 4403 when the user
was deactivated). The bell is a hint like every doorbell; the per-action check is the
rule.
"""

from __future__ import annotations

import logging
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user, get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, pre_save

from chat.live.doorbell import group_send_soon
from chat.live.layers import live_layer

logger = logging.getLogger(__name__)

CLOSE_SESSION_ENDED = 4401
CLOSE_DEACTIVATED = 4403
SESSION_CHECK = "user.session_check"


def user_group(user_id: Any) -> str:
    return f"user.{user_id}"


def session_user(scope: dict[str, Any]) -> tuple[Any | None, int]:
    """``(user, 0)`` while the socket's login still holds; ``(None, close code)`` otherwise.

    The user is read again from the database, so its fields (``is_active``) are fresh.
    Call from a sync thread (it queries the database).
    """
    opened_as = scope.get("user")
    session = scope.get("session")
    key = getattr(session, "session_key", None)
    if opened_as is None or not opened_as.is_authenticated or not key:
        return None, CLOSE_SESSION_ENDED
    unchanged = _unchanged_since_last_check(scope, key, opened_as)
    if unchanged is not None:
        return unchanged, 0
    # A fresh store: the scope's session was loaded (and cached) at connect.
    store = import_module(settings.SESSION_ENGINE).SessionStore(key)
    user = get_user(SimpleNamespace(session=store))  # type: ignore[arg-type]
    if user.is_authenticated and user.pk == opened_as.pk:
        _remember_check(scope, key, user)
        return user, 0
    scope.pop(_CHECKED, None)
    if (
        store.get("_auth_user_id") == str(opened_as.pk)
        and get_user_model().objects.filter(pk=opened_as.pk, is_active=False).exists()
    ):
        return None, CLOSE_DEACTIVATED
    return None, CLOSE_SESSION_ENDED


# What the last full check saw: (session data, password hash, the user it returned). The
# full check decodes the session and compares its auth hash with the user's password hash;
# while neither the session's stored data nor the user's password hash has changed (and
# the user is still active), its answer still holds, and one statement tells.
_CHECKED = "lyceum.session_checked"


def _unchanged_since_last_check(scope: dict[str, Any], key: str, opened_as: Any) -> Any | None:
    checked = scope.get(_CHECKED)
    if checked is None or settings.SESSION_ENGINE != "django.contrib.sessions.backends.db":
        return None
    from django.contrib.sessions.models import Session
    from django.db import connection
    from django.utils import timezone

    session_data, password, user = checked
    users = get_user_model()._meta
    sessions = Session._meta
    q = connection.ops.quote_name
    assert users.pk is not None and sessions.db_table and users.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT s.{q('session_data')}, u.{q('password')} "
            f"FROM {q(sessions.db_table)} s, {q(users.db_table)} u "
            f"WHERE s.{q('session_key')} = %s AND s.{q('expire_date')} > %s "
            f"AND u.{q(str(users.pk.column))} = %s AND u.{q('is_active')}",
            [key, timezone.now(), opened_as.pk],
        )
        row = cursor.fetchone()
    if row is None or row[0] != session_data or row[1] != password:
        return None
    return user


def _remember_check(scope: dict[str, Any], key: str, user: Any) -> None:
    from django.contrib.sessions.models import Session

    data = Session.objects.filter(session_key=key).values_list("session_data", flat=True).first()
    if data is not None:
        scope[_CHECKED] = (data, user.password, user)


def ring_user(user_id: Any) -> None:
    """After the commit, ask every socket of ``user_id`` to check its session now."""
    layer = live_layer()
    if layer is None or user_id is None:
        return
    message = {"type": SESSION_CHECK}
    transaction.on_commit(lambda: group_send_soon(layer, user_group(user_id), message))


# --- what ends sessions -------------------------------------------------------------------


def _on_logout(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    if user is not None:
        ring_user(user.pk)


def _on_user_save(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """A changed password or a deactivation: the user's other logins end."""
    if raw or instance.pk is None:
        return
    update_fields = kwargs.get("update_fields")
    if update_fields is not None and not {"password", "is_active"} & set(update_fields):
        return  # a login's last_login, say: nothing that ends a session
    before = sender.objects.filter(pk=instance.pk).values("password", "is_active").first() or {}
    if before and (
        before["password"] != instance.password or before["is_active"] != instance.is_active
    ):
        ring_user(instance.pk)


def _on_user_delete(sender: Any, instance: Any, **kwargs: Any) -> None:
    ring_user(instance.pk)


def connect_signals() -> None:
    user_model = get_user_model()
    user_logged_out.connect(_on_logout, dispatch_uid="lyceum-sockets-logout")
    pre_save.connect(_on_user_save, sender=user_model, dispatch_uid="lyceum-sockets-user-save")
    post_delete.connect(
        _on_user_delete, sender=user_model, dispatch_uid="lyceum-sockets-user-delete"
    )
