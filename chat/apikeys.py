"""API keys: shown once at creation, stored as a SHA-256, sent as ``Authorization: Bearer``."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone

from chat.models import ApiKey

KEY_PREFIX = "lyk_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def create_api_key(user, name: str = "") -> tuple[ApiKey, str]:
    """A new key and its raw value; the raw value is never stored or shown again."""
    raw = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        user=user, name=name[:100], prefix=raw[: len(KEY_PREFIX) + 6], key_hash=hash_key(raw)
    )
    return key, raw


def authenticate_key(raw: str):
    """The active user owning ``raw``, or None."""
    key = authenticate_api_key(raw)
    return None if key is None else key.user


def authenticate_api_key(raw: str) -> ApiKey | None:
    """The active key ``raw`` (with its active user), or None."""
    if not raw or not raw.startswith(KEY_PREFIX) or len(raw) > 200:
        return None
    key = (
        ApiKey.objects.select_related("user")
        .filter(key_hash=hash_key(raw), revoked_at__isnull=True)
        .first()
    )
    if key is None or not key.user.is_active:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


def revoke_api_key(user, key_id) -> bool:
    """Revoke one of ``user``'s keys; False when there is no such active key."""
    if not str(key_id).isdigit():
        return False  # a forged form value, not a key id (would be a 500 otherwise)
    return bool(
        ApiKey.objects.filter(pk=key_id, user=user, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    )
