"""Provider keys at rest: encrypted, and re-encrypted by ``manage.py rotate_provider_keys``."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from chat.models import Provider, ProviderKey
from chat.relay import secrets

pytestmark = pytest.mark.django_db


def test_round_trip_and_clear_values_still_work(settings):
    settings.LYCEUM_PROVIDER_KEY_SECRET = "first-secret"
    stored = secrets.encrypt("sk-live-abcdef0123456789")
    assert stored.startswith("enc:") and "sk-live" not in stored
    assert secrets.decrypt(stored) == "sk-live-abcdef0123456789"
    assert secrets.decrypt("sk-plain") == "sk-plain"  # stored before encryption came in


def test_rotate_command_moves_every_key_to_the_new_secret(settings):
    settings.LYCEUM_PROVIDER_KEY_SECRET = "old-secret"
    provider = Provider.objects.create(
        name="p", base_url="http://127.0.0.1:9/v1", api_key="sk-clear-key-1"
    )
    pooled = ProviderKey.objects.create(provider=provider, secret=secrets.encrypt("sk-pool-key-2"))
    settings.LYCEUM_PROVIDER_KEY_SECRET = "new-secret"
    with pytest.raises(secrets.UndecryptableKey):
        secrets.decrypt(ProviderKey.objects.get(pk=pooled.pk).secret)
    call_command("rotate_provider_keys", old_secret="old-secret")
    provider.refresh_from_db()
    pooled.refresh_from_db()
    assert secrets.is_encrypted(provider.api_key) and secrets.is_encrypted(pooled.secret)
    assert secrets.decrypt(provider.api_key) == "sk-clear-key-1"
    assert secrets.decrypt(pooled.secret) == "sk-pool-key-2"
