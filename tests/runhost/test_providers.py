"""Providers and models: aliases, switching model, disabled models, environment models and
the API key kept out of the record.
"""

from __future__ import annotations

import json

import pytest
from django.http import Http404

from chat import actions, catalog
from chat.models import Provider, ProviderModel, Run
from tests.fakeopenai import Script
from tests.runhost.helpers import (
    API_KEY,
    adb,
    assert_nothing_live,
    check_chat,
    display,
    events_of,
    new_chat,
    run_row,
    send,
    settle,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("runner_state"),
]


async def test_the_provider_sees_the_model_id_never_the_alias(alice, agent, runtime, fake_model):
    chat = await new_chat(alice, "fake-model")
    sent = await send(alice, chat, "hello")
    await settle()
    (request,) = fake_model.chat_requests()
    assert request.json["model"] == "gpt-fake"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.model) == (Run.Status.COMPLETED, "fake-model")
    assert events_of(await adb(display)(chat), run.pk, "run_start")[0]["model"] == "fake-model"


async def test_switching_model_mid_chat_applies_to_the_next_request(
    alice, bob, agent, runtime, fake_model
):
    provider = await adb(Provider.objects.get)(name="fake")
    await adb(ProviderModel.objects.create)(
        provider=provider, alias="fake-other", model_id="gpt-other", context_window=8000
    )
    chat = await new_chat(alice, "fake-model")
    await send(alice, chat, "one")
    await settle()
    assert await adb(actions.switch_model)(alice, chat.pk, "fake-other") == "fake-other"
    sent = await send(alice, chat, "two")
    await settle()
    assert [r.json["model"] for r in fake_model.chat_requests()] == ["gpt-fake", "gpt-other"]
    assert (await adb(run_row)(sent.run_id)).model == "fake-other"
    with pytest.raises(Http404):
        await adb(actions.switch_model)(bob, chat.pk, "fake-model")
    await adb(check_chat)(chat)


def test_disabled_models_and_providers_are_rejected(alice, agent, fake_model):
    provider = Provider.objects.get(name="fake")
    ProviderModel.objects.create(provider=provider, alias="off", model_id="m", enabled=False)
    aliases = {c.alias for c in catalog.available_models()}
    assert "fake-model" in aliases and "off" not in aliases
    chat = actions.new_chat(alice, model="fake-model")
    for alias in ("off", "no-such-model"):
        with pytest.raises(actions.ActionError) as error:
            actions.new_chat(alice, model=alias)
        assert error.value.code == "unknown_model"
        with pytest.raises(actions.ActionError) as error:
            actions.switch_model(alice, chat.pk, alias)
        assert error.value.code == "unknown_model"
    Provider.objects.filter(pk=provider.pk).update(enabled=False)
    with pytest.raises(actions.ActionError) as error:
        actions.new_chat(alice, model="fake-model")
    assert error.value.code == "unknown_model"


async def test_a_chat_whose_model_was_disabled_fails_its_next_run_cleanly(
    alice, agent, runtime, fake_model
):
    chat = await new_chat(alice, "fake-model")
    await adb(ProviderModel.objects.filter(alias="fake-model").update)(enabled=False)
    sent = await send(alice, chat, "hello?")
    await settle()
    run = await adb(run_row)(sent.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "bad_request")
    assert "fake-model" in run.error_message
    assert fake_model.chat_requests() == []
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


async def test_a_model_disabled_in_the_admin_is_refused_at_the_next_run_start_at_once(
    alice, agent, runtime, fake_model
):
    """Run starts keep the whitelist and the provider's row in memory for a few seconds
    (``catalog.resolve_model``); a save in this process drops them at once."""
    chat = await new_chat(alice, "fake-model")
    first = await send(alice, chat, "hello")
    await settle()
    assert (await adb(run_row)(first.run_id)).status == Run.Status.COMPLETED

    def disable() -> None:
        row = ProviderModel.objects.get(alias="fake-model")
        row.enabled = False
        row.save()

    await adb(disable)()
    second = await send(alice, chat, "again")
    await settle()
    run = await adb(run_row)(second.run_id)
    assert (run.status, run.error_category) == (Run.Status.FAILED, "bad_request")
    await adb(check_chat)(chat)
    await adb(assert_nothing_live)()


def test_a_provider_saved_in_the_admin_is_read_again_at_the_next_run_start(agent, fake_model):
    resolved = catalog.resolve_model("fake-model")
    provider = Provider.objects.get(name="fake")
    provider.base_url = provider.base_url.rstrip("/") + "/other/"
    provider.save()
    again = catalog.resolve_model("fake-model")
    assert again.provider is not resolved.provider


def test_environment_bootstrap_lists_the_configured_models(settings, fake_openai, transactional_db):
    catalog._env_models.cache_clear()
    settings.LYCEUM_OPENAI_BASE_URL = fake_openai.base_url
    settings.LYCEUM_OPENAI_API_KEY = "sk-env-key-0123456789"
    settings.LYCEUM_OPENAI_MODELS = ["env-a", "env-b"]
    choices = {c.alias: c for c in catalog.available_models()}
    assert {"env-a", "env-b", "demo", "demo-fast"} <= set(choices)
    assert choices["env-a"].provider_name == catalog.ENV_PROVIDER
    assert fake_openai.requests == []  # a configured list needs no request

    settings.LYCEUM_OPENAI_MODELS = []
    aliases = [c.alias for c in catalog.available_models()]
    assert aliases[:2] == ["fake-model", "fake-reasoner"]  # the server's /models list
    (listing,) = fake_openai.requests
    assert listing.path.endswith("/models")
    assert listing.headers["authorization"] == "Bearer sk-env-key-0123456789"
    catalog._env_models.cache_clear()


async def test_a_run_on_an_environment_model_reaches_the_server(alice, agent, runtime, fake_openai):
    catalog._env_models.cache_clear()
    runtime.LYCEUM_OPENAI_BASE_URL = fake_openai.base_url
    runtime.LYCEUM_OPENAI_API_KEY = "sk-env-key-0123456789"
    runtime.LYCEUM_OPENAI_MODELS = []
    try:
        chat = await new_chat(alice, "fake-reasoner")
        sent = await send(alice, chat, "hello")
        await settle()
    finally:
        catalog._env_models.cache_clear()
    (request,) = fake_openai.chat_requests()
    assert request.json["model"] == "fake-reasoner"
    assert request.headers["authorization"] == "Bearer sk-env-key-0123456789"
    assert (await adb(run_row)(sent.run_id)).status == Run.Status.COMPLETED


async def test_the_api_key_never_reaches_the_run_record_or_the_events(
    alice, agent, runtime, fake_model
):
    echo = {"error": {"message": f"Incorrect API key provided: {API_KEY}", "code": "bad_key"}}
    fake_model.enqueue(
        Script(status=400, error_body=echo),
        Script(
            tokens=["Part ", "one "],
            stream_error={"error": {"message": f"bad {API_KEY}"}},
            fault_after=2,
        ),
    )
    chat = await new_chat(alice, "fake-model")
    first = await send(alice, chat, "one")
    await settle()
    second = await send(alice, chat, "two")
    await settle()
    for run_id in (first.run_id, second.run_id):
        run = await adb(run_row)(run_id)
        assert run.status == Run.Status.FAILED
        assert run.error_message and API_KEY[:8] not in run.error_message
        assert "[redacted]" in run.error_message
    everything = json.dumps([e.payload for e in await adb(display)(chat)])
    assert API_KEY not in everything and API_KEY[-12:] not in everything
    await adb(check_chat)(chat)
