"""Provider keys encrypted at rest (Fernet, a key derived from a setting).

The key is derived from ``LYCEUM_PROVIDER_KEY_SECRET`` (``SECRET_KEY`` when unset).
Values are stored as ``enc:<fernet token>``; a value without the prefix is a key stored
in clear before encryption came in: it still works, and ``manage.py rotate_provider_keys``
encrypts it. Rotating the secret: set the new one, keep the old in
``LYCEUM_PROVIDER_KEY_SECRET_OLD`` (or pass ``--old-secret``), run the command.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

PREFIX = "enc:"


class UndecryptableKey(Exception):
    """A stored key that the configured secret cannot decrypt (rotated without the command)."""


def _fernet_for(secret: str) -> Fernet:
    digest = hashlib.sha256(b"lyceum-provider-keys\x00" + secret.encode("utf-8")).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


@lru_cache(maxsize=4)
def _fernets(secret: str, old: str) -> MultiFernet:
    fernets = [_fernet_for(secret)]
    if old:
        fernets.append(_fernet_for(old))
    return MultiFernet(fernets)


def _current() -> MultiFernet:
    return _fernets(
        settings.LYCEUM_PROVIDER_KEY_SECRET or settings.SECRET_KEY,
        settings.LYCEUM_PROVIDER_KEY_SECRET_OLD,
    )


def is_encrypted(value: str) -> bool:
    return value.startswith(PREFIX)


def encrypt(raw: str) -> str:
    if not raw:
        return ""
    return PREFIX + _current().encrypt(raw.encode("utf-8")).decode("ascii")


@lru_cache(maxsize=256)
def _decrypt(value: str, secret: str, old: str) -> str:
    try:
        return _fernets(secret, old).decrypt(value[len(PREFIX) :].encode("ascii")).decode("utf-8")
    except (InvalidToken, ValueError):
        raise UndecryptableKey(
            "a provider key cannot be decrypted with the configured secret"
        ) from None


def decrypt(value: str) -> str:
    """The clear key of a stored value (a value stored in clear is returned as it is)."""
    if not is_encrypted(value):
        return value
    return _decrypt(
        value,
        settings.LYCEUM_PROVIDER_KEY_SECRET or settings.SECRET_KEY,
        settings.LYCEUM_PROVIDER_KEY_SECRET_OLD,
    )


def rotate(value: str, old_secret: str = "") -> str:
    """``value`` encrypted with the current secret (decrypting with the old one if needed)."""
    if not value:
        return value
    if not is_encrypted(value):
        return encrypt(value)
    secret = settings.LYCEUM_PROVIDER_KEY_SECRET or settings.SECRET_KEY
    fernets = _fernets(secret, old_secret or settings.LYCEUM_PROVIDER_KEY_SECRET_OLD)
    try:
        token = fernets.rotate(value[len(PREFIX) :].encode("ascii"))
    except InvalidToken:
        raise UndecryptableKey("a provider key cannot be decrypted with either secret") from None
    return PREFIX + token.decode("ascii")
