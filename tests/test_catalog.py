"""The catalog keeps one provider per configuration, replaces it when the configuration
changes, and closes them all on request."""

from __future__ import annotations

import pytest

from chat import catalog
from chat.models import Provider, ProviderModel

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fake_provider(fake_openai):
    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=fake_openai.base_url, api_key="sk-one"
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-other", model_id="gpt-other", context_window=8000
    )
    return provider


async def test_one_provider_per_configuration_until_it_changes(fake_provider):
    from channels.db import database_sync_to_async as adb

    first = (await adb(catalog.resolve_model)("fake-model")).provider
    again = (await adb(catalog.resolve_model)("fake-other")).provider
    assert first is again  # two models of one provider share its client and pool

    fake_provider.api_key = "sk-two"
    await adb(fake_provider.save)()
    changed = (await adb(catalog.resolve_model)("fake-model")).provider
    assert changed is not first

    closed = []
    for provider in (first, changed):
        original = provider.aclose

        async def record(provider=provider, original=original) -> None:
            closed.append(provider)
            await original()

        provider.aclose = record
    await catalog.close_providers()
    assert set(map(id, closed)) == {id(first), id(changed)}
    after = (await adb(catalog.resolve_model)("fake-model")).provider
    assert after is not changed  # closed providers are not handed out again
    await catalog.close_providers()
