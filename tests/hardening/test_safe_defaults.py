"""§3 of issue 14: safe defaults (debug pages mask secrets, no-store on the key page,
a provider key never follows a base URL change)."""

from __future__ import annotations

import re
import sys

import pytest
from django.test import RequestFactory
from django.urls import reverse
from django.views.debug import ExceptionReporter

from chat.admin import ProviderForm
from chat.models import Provider


def _report(settings_overrides: dict, settings) -> str:
    for name, value in settings_overrides.items():
        setattr(settings, name, value)

    def view(api_key: str, raw: str) -> None:
        raise RuntimeError("boom")

    mark = "".join(["SEN", "TINEL"])  # built, so the source line shown does not hold it
    try:
        view(f"sk-{mark}-provider-key", f"lyk_{mark}apikey123")
    except RuntimeError:
        info = sys.exc_info()
    request = RequestFactory().get("/")
    return ExceptionReporter(request, *info).get_traceback_html()


def test_the_debug_page_masks_urls_with_passwords_and_keys_in_frames(settings):
    html = _report(
        {
            "DATABASE_URL": "postgres://lyceum:DBSENTINEL@db:5432/lyceum",
            "REDIS_URL": "redis://:REDISSENTINEL@redis:6379/0",
            "CHANNEL_LAYERS": {
                "default": {
                    "BACKEND": "x",
                    "CONFIG": {"hosts": [{"address": "redis://:LAYERSENTINEL@redis:6379"}]},
                }
            },
            "SOMETHING": ["redis://u:LISTSENTINEL@h/0"],
        },
        settings,
    )
    for sentinel in (
        "DBSENTINEL",
        "REDISSENTINEL",
        "LAYERSENTINEL",
        "LISTSENTINEL",
        "SENTINEL-provider",
        "SENTINELapikey",
    ):
        assert sentinel not in html, sentinel


@pytest.mark.django_db
def test_the_api_key_page_is_never_cached(alice_client):
    created = alice_client.post(reverse("api_keys"), {"name": "laptop"})
    assert created.status_code == 302  # post, redirect, get: a refresh makes no second key
    response = alice_client.get(created["Location"])
    secret = re.search(r"lyk_[A-Za-z0-9_-]{20,}", response.content.decode())
    assert secret, "the new key is shown once, on this page"
    assert response["Cache-Control"] == "no-store"
    again = alice_client.get(created["Location"])
    assert secret[0] not in again.content.decode()


@pytest.mark.django_db
def test_changing_a_providers_base_url_needs_the_key_again():
    provider = Provider.objects.create(
        name="p", kind="openai", base_url="https://api.example.com/v1", api_key="sk-old"
    )
    data = {"name": "p", "kind": "openai", "base_url": "https://evil.example/v1", "enabled": True}
    form = ProviderForm(data=data, instance=provider)
    assert not form.is_valid()
    assert "api_key" in form.errors
    form = ProviderForm(data={**data, "api_key": "sk-new"}, instance=provider)
    assert form.is_valid(), form.errors.as_json()
    # The same URL with the key left empty is fine (the admin keeps the stored key).
    same = {**data, "base_url": "https://api.example.com/v1"}
    form = ProviderForm(data=same, instance=Provider.objects.get(pk=provider.pk))
    assert form.is_valid(), form.errors.as_json()
