"""§5 Setting up providers without traps (issue 15): the admin's provider and agent forms
check every field with a clear message and never lose a key; Test connection and Fetch
models answer in plain words; tool policies are one select per tool."""

from __future__ import annotations

import html
import importlib
import re
import socket

import pytest
from django.apps import apps
from django.urls import reverse

from chat.admin_forms import ProviderForm
from chat.models import Agent, Provider, ProviderKey, ProviderModel
from chat.relay import secrets

pytestmark = pytest.mark.django_db

KEY = "sk-test-0123456789abcdef"
ADD = "admin:chat_provider_add"


@pytest.fixture
def admin_client(client, make_user):
    user = make_user("root", staff=True)
    user.is_superuser = True
    user.save()
    client.force_login(user)
    return client


def _text(response) -> str:
    return html.unescape(response.content.decode())


def _form_errors(response) -> str:
    return " ".join(
        str(e) for errors in response.context["adminform"].form.errors.values() for e in errors
    )


def _provider_data(**overrides):
    data = {
        "name": "openai-main",
        "kind": "openai",
        "base_url": "https://api.example.com/v1",
        "api_key": KEY,
        "enabled": "on",
        # the two inlines, empty
        "models-TOTAL_FORMS": "0",
        "models-INITIAL_FORMS": "0",
        "keys-TOTAL_FORMS": "0",
        "keys-INITIAL_FORMS": "0",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def _token(response) -> str:
    match = re.search(r'name="api_key__pending" value="([^"]*)"', response.content.decode())
    assert match, "the form carries the pending key's token"
    return match[1]


def _provider(name="p", base_url="https://api.example.com/v1", key=KEY, **extra) -> Provider:
    return Provider.objects.create(
        name=name, kind="openai", base_url=base_url, api_key=secrets.encrypt(key), **extra
    )


# --- the provider form ------------------------------------------------------------------------


def test_the_name_rule_is_said_before_saving(admin_client):
    page = _text(admin_client.get(reverse(ADD)))
    assert "Letters, digits, hyphens and underscores only" in page
    assert 'pattern="[-a-zA-Z0-9_]+"' in page  # the browser checks it while typing
    assert "starting with http:// or https://" in page


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "Open AI"}, "Use only letters, digits, hyphens and underscores (no spaces)"),
        ({"base_url": "ftp://files.example.com"}, "starting with http:// or https://"),
        ({"base_url": "api.openai.com/v1"}, "starting with http:// or https://"),
        ({"base_url": "https://user:pw@api.example.com/v1"}, "Put the key in the API key field"),
        ({"base_url": "https://api.example.com/v1?x=1"}, "cannot have a query"),
        ({"base_url": "https://api.example.com:99999/v1"}, "The port in the address is not valid"),
        ({"base_url": ""}, "An OpenAI-compatible provider needs its base URL"),
        ({"api_key": ""}, "Enter the provider's API key, or tick “No key”"),
        ({"no_key": "on"}, "Enter a key or tick “No key”, not both."),
        ({"api_key": "sk bad key"}, "That key has spaces or characters an API key never has"),
    ],
)
def test_each_field_says_what_is_wrong(admin_client, overrides, message):
    response = admin_client.post(reverse(ADD), _provider_data(**overrides))
    assert response.status_code == 200
    assert message in _form_errors(response)
    assert not Provider.objects.exists()


def test_a_taken_name_is_refused_in_words(admin_client):
    _provider(name="openai-main")
    response = admin_client.post(reverse(ADD), _provider_data())
    assert "Another provider already has this name." in _form_errors(response)


def test_the_key_survives_a_failed_save_without_reaching_the_page(admin_client):
    failed = admin_client.post(reverse(ADD), _provider_data(base_url="ftp://nope"))
    assert failed.status_code == 200
    page = failed.content.decode()
    assert KEY not in page and KEY[-12:] not in page  # never echoed, not even in part
    assert "A new key was entered and is kept" in _text(failed)
    token = _token(failed)
    assert token

    saved = admin_client.post(reverse(ADD), _provider_data(api_key="", api_key__pending=token))
    assert saved.status_code == 302, _form_errors(saved)
    provider = Provider.objects.get(name="openai-main")
    assert secrets.is_encrypted(provider.api_key)
    assert secrets.decrypt(provider.api_key) == KEY


def test_a_pending_key_token_is_good_only_for_its_admin(admin_client, client, make_user):
    token = _token(admin_client.post(reverse(ADD), _provider_data(base_url="ftp://nope")))
    other = make_user("other-admin", staff=True)
    other.is_superuser = True
    other.save()
    client.force_login(other)
    response = client.post(reverse(ADD), _provider_data(api_key="", api_key__pending=token))
    assert "Enter the provider's API key" in _form_errors(response)
    forged = client.post(reverse(ADD), _provider_data(api_key="", api_key__pending="enc:x"))
    assert "Enter the provider's API key" in _form_errors(forged)
    assert not Provider.objects.exists()


def test_a_provider_is_never_saved_without_a_key_by_accident(admin_client):
    response = admin_client.post(reverse(ADD), _provider_data(api_key=""))
    assert "Enter the provider's API key" in _form_errors(response)
    local = admin_client.post(reverse(ADD), _provider_data(name="local", api_key="", no_key="on"))
    assert local.status_code == 302
    assert Provider.objects.get(name="local").api_key == ""


def test_editing_other_fields_keeps_the_stored_key(admin_client):
    provider = _provider()
    url = reverse("admin:chat_provider_change", args=[provider.pk])
    page = _text(admin_client.get(url))
    assert "A key is stored (not shown)" in page
    assert KEY not in page and provider.api_key not in page
    response = admin_client.post(url, _provider_data(name="p", api_key="", enabled=None))
    assert response.status_code == 302, _form_errors(response)
    provider.refresh_from_db()
    assert not provider.enabled
    assert secrets.decrypt(provider.api_key) == KEY


def test_a_new_base_url_needs_the_key_again(admin_client):
    provider = _provider()
    url = reverse("admin:chat_provider_change", args=[provider.pk])
    moved = _provider_data(name="p", base_url="https://elsewhere.example/v1", api_key="")
    response = admin_client.post(url, moved)
    assert response.status_code == 200
    assert "The base URL changed: enter the key again" in _form_errors(response)
    provider.refresh_from_db()
    assert provider.base_url == "https://api.example.com/v1"

    response = admin_client.post(url, {**moved, "api_key": "sk-new-9876543210"})
    assert response.status_code == 302
    provider.refresh_from_db()
    assert provider.base_url == "https://elsewhere.example/v1"
    assert secrets.decrypt(provider.api_key) == "sk-new-9876543210"


def test_pool_keys_do_not_follow_a_new_base_url_until_entered_again(admin_client):
    provider = _provider()
    kept = ProviderKey.objects.create(provider=provider, label="a", secret=secrets.encrypt("sk-a1"))
    other = ProviderKey.objects.create(
        provider=provider, label="b", secret=secrets.encrypt("sk-b2")
    )
    url = reverse("admin:chat_provider_change", args=[provider.pk])
    data = _provider_data(name="p", base_url="https://elsewhere.example/v1", api_key="sk-new-1")
    # Key "a" is entered again in the same submit; key "b" only has its label changed.
    data.update(
        {
            "keys-TOTAL_FORMS": "2",
            "keys-INITIAL_FORMS": "2",
            "keys-0-id": str(kept.pk),
            "keys-0-provider": str(provider.pk),
            "keys-0-label": "a",
            "keys-0-enabled": "on",
            "keys-0-secret": "sk-a-again-777",
            "keys-1-id": str(other.pk),
            "keys-1-provider": str(provider.pk),
            "keys-1-label": "b renamed",
            "keys-1-enabled": "on",
            "keys-1-secret": "",
        }
    )
    assert admin_client.post(url, data).status_code == 302
    kept.refresh_from_db()
    other.refresh_from_db()
    assert kept.enabled and secrets.decrypt(kept.secret) == "sk-a-again-777"
    assert not other.enabled and other.label == "b renamed"
    assert other.last_error == "The provider's base URL changed: enter this key again."
    # What the pool would send to the new address: never key "b".
    provider.refresh_from_db()
    sent = {
        secrets.decrypt(k.secret)
        for k in ProviderKey.objects.filter(provider=provider, enabled=True)
    }
    assert sent == {"sk-a-again-777"}


def test_a_base_url_changed_in_code_stops_the_pool_keys_too(admin_client):
    provider = _provider()
    key = ProviderKey.objects.create(provider=provider, label="a", secret=secrets.encrypt("sk-a1"))
    provider.base_url = "https://api.example.com/v1/"  # the same address
    provider.save()
    key.refresh_from_db()
    assert key.enabled
    provider.base_url = "https://evil.example/v1"
    provider.save()
    key.refresh_from_db()
    assert not key.enabled


def test_the_form_keeps_working_for_code_that_builds_it(admin_client):
    provider = _provider()
    form = ProviderForm(
        data={"name": "p", "kind": "openai", "base_url": "https://api.example.com/v1/"},
        instance=provider,
    )
    assert form.is_valid(), form.errors.as_json()  # a trailing slash is the same address
    assert secrets.decrypt(form.save().api_key) == KEY


def test_a_pool_key_is_kept_across_a_failed_save_too(admin_client):
    provider = _provider()
    url = reverse("admin:chat_provider_change", args=[provider.pk])
    data = _provider_data(name="p", base_url="ftp://nope", api_key="")
    data.update(
        {"keys-TOTAL_FORMS": "1", "keys-0-label": "spare", "keys-0-secret": "sk-pool-42424242"}
    )
    failed = admin_client.post(url, data)
    assert failed.status_code == 200
    assert "sk-pool-42424242" not in failed.content.decode()
    token = re.search(r'name="keys-0-secret__pending" value="([^"]+)"', failed.content.decode())
    assert token
    data.update({"base_url": "https://api.example.com/v1", "keys-0-secret": ""})
    data["keys-0-secret__pending"] = token[1]
    assert admin_client.post(url, data).status_code == 302
    assert secrets.decrypt(ProviderKey.objects.get(label="spare").secret) == "sk-pool-42424242"


# --- Test connection ---------------------------------------------------------------------------


def _test_connection(admin_client, provider) -> str:
    url = reverse("admin:chat_provider_test_connection", args=[provider.pk])
    response = admin_client.post(url, follow=True)
    assert response.status_code == 200
    return " ".join(str(m) for m in response.context["messages"])


def test_test_connection_says_how_many_models(admin_client, fake_openai):
    fake_openai.api_key = KEY
    provider = _provider(base_url=fake_openai.base_url)
    message = _test_connection(admin_client, provider)
    assert message == "Connected: 2 models available."
    request = fake_openai.requests[-1]
    assert (request.method, request.path) == ("GET", "/v1/models")
    assert request.headers["authorization"] == f"Bearer {KEY}"


def test_test_connection_names_a_refused_key_and_never_shows_it(admin_client, fake_openai):
    fake_openai.api_key = "sk-the-right-one-000000"
    provider = _provider(base_url=fake_openai.base_url)
    url = reverse("admin:chat_provider_test_connection", args=[provider.pk])
    response = admin_client.post(url, follow=True)
    assert " ".join(str(m) for m in response.context["messages"]) == (
        "The provider refused the key (401)."
    )
    assert KEY not in response.content.decode()


def test_test_connection_names_a_refused_connection(admin_client):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    provider = _provider(base_url=base)
    assert (
        _test_connection(admin_client, provider) == f"Could not reach {base}: connection refused."
    )


def test_test_connection_gives_up_after_the_timeout(admin_client, fake_openai, settings):
    settings.LYCEUM_PROVIDER_CHECK_TIMEOUT = 0.3
    fake_openai.models_delay = 3
    provider = _provider(base_url=fake_openai.base_url)
    assert _test_connection(admin_client, provider) == (
        f"{fake_openai.base_url} did not answer: timed out after 0.3 s."
    )


def test_without_a_model_list_one_token_is_asked_of_a_whitelisted_model(admin_client, fake_openai):
    fake_openai.models_status = 404
    provider = _provider(base_url=fake_openai.base_url)
    ProviderModel.objects.create(provider=provider, alias="fm", model_id="fake-model")
    message = _test_connection(admin_client, provider)
    assert message == "Connected: fake-model answered (the provider lists no models)."
    sent = fake_openai.chat_requests()[-1].json
    assert sent["model"] == "fake-model" and sent["max_tokens"] == 1


def test_the_demo_provider_has_nothing_to_test(admin_client):
    provider = Provider.objects.create(name="offline", kind="demo")
    assert "offline demo model" in _test_connection(admin_client, provider)


def test_test_connection_is_a_post(admin_client, fake_openai):
    provider = _provider(base_url=fake_openai.base_url)
    url = reverse("admin:chat_provider_test_connection", args=[provider.pk])
    assert admin_client.get(url).status_code == 405
    assert not fake_openai.requests


def test_the_change_page_offers_both_buttons(admin_client):
    provider = _provider()
    page = _text(admin_client.get(reverse("admin:chat_provider_change", args=[provider.pk])))
    assert "Test connection" in page and "Fetch models" in page


# --- Fetch models -------------------------------------------------------------------------------


def test_fetch_models_ticks_the_whitelisted_and_saves_the_ticks(admin_client, fake_openai):
    provider = _provider(base_url=fake_openai.base_url)
    ProviderModel.objects.create(provider=provider, alias="fm", model_id="fake-model")
    url = reverse("admin:chat_provider_fetch_models", args=[provider.pk])
    page = admin_client.get(url).content.decode()
    boxes = dict(re.findall(r'name="model" value="([^"]+)"( checked)?', page))
    assert boxes == {"fake-model": " checked", "fake-reasoner": ""}
    assert "whitelisted as fm" in html.unescape(page)

    response = admin_client.post(
        url, {"offered": ["fake-model", "fake-reasoner"], "model": ["fake-reasoner"]}, follow=True
    )
    message = " ".join(str(m) for m in response.context["messages"])
    assert message == "Whitelisted: fake-reasoner. Removed: fm."
    assert list(ProviderModel.objects.values_list("alias", "model_id")) == [
        ("fake-reasoner", "fake-reasoner")
    ]


def test_fetch_models_names_an_alias_taken_elsewhere_after_the_provider(admin_client, fake_openai):
    provider = _provider(base_url=fake_openai.base_url)
    other = _provider(name="other")
    ProviderModel.objects.create(provider=other, alias="fake-model", model_id="x")
    url = reverse("admin:chat_provider_fetch_models", args=[provider.pk])
    admin_client.post(url, {"offered": ["fake-model"], "model": ["fake-model", "not-offered"]})
    assert set(ProviderModel.objects.filter(provider=provider).values_list("alias", flat=True)) == {
        "p/fake-model"
    }


def test_fetch_models_explains_a_failure(admin_client, fake_openai):
    fake_openai.api_key = "sk-something-else-0000"
    provider = _provider(base_url=fake_openai.base_url)
    url = reverse("admin:chat_provider_fetch_models", args=[provider.pk])
    assert "The provider refused the key (401)." in _text(admin_client.get(url))


# --- the agent form ------------------------------------------------------------------------------


def _agent_data(agent: Agent, **overrides):
    data = {
        "name": agent.name,
        "slug": agent.slug,
        "system_prompt": agent.system_prompt,
        "default_model": "",
        "personas": "",
        "max_rounds": "12",
        "tools": ["calculator", "write_file"],
    }
    data.update(overrides)
    return data


def test_tool_policies_are_one_select_per_tool(admin_client, agent):
    agent.tool_policies = {"write_file": "deny", "custom_tool": "ask"}
    agent.save()
    url = reverse("admin:chat_agent_change", args=[agent.pk])
    page = admin_client.get(url).content.decode()
    for tool in ("calculator", "write_file", "edit_file", "delegate"):
        assert f'name="policy_{tool}"' in page
    selected = re.search(r'<select name="policy_write_file".*?</select>', page, re.DOTALL)[0]
    assert re.search(r'<option value="deny" selected>', selected)
    assert "Default: asks the user each time" in html.unescape(page)  # write_file's default

    response = admin_client.post(
        url, _agent_data(agent, policy_write_file="ask", policy_calculator="")
    )
    assert response.status_code == 302, _form_errors(response)
    agent.refresh_from_db()
    # The select's value, and the policy of a tool this form does not show, kept.
    assert agent.tool_policies == {"write_file": "ask", "custom_tool": "ask"}
    assert agent.tools == ["calculator", "write_file"]


def test_a_policy_outside_the_list_is_refused(admin_client, agent):
    url = reverse("admin:chat_agent_change", args=[agent.pk])
    response = admin_client.post(url, _agent_data(agent, policy_write_file="sometimes"))
    assert response.status_code == 200
    assert "Pick one of the listed policies for write_file." in _form_errors(response)
    agent.refresh_from_db()
    assert agent.tool_policies == {}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"slug": "my agent"}, "Use only letters, digits, hyphens and underscores"),
        ({"max_rounds": "0"}, "A run needs at least 1 round."),
        ({"max_rounds": "500"}, "At most 100 rounds."),
        ({"tools": ["calculator", "rm_rf"]}, "Select a valid choice."),
        ({"default_model": "gpt-nothing"}, "Select a valid choice."),
        ({"personas": "Ada\n<Basil>"}, "a name cannot contain <, > or /."),
        ({"personas": "Ada\nada"}, "“ada” is listed twice."),
    ],
)
def test_each_agent_field_says_what_is_wrong(admin_client, agent, overrides, message):
    url = reverse("admin:chat_agent_change", args=[agent.pk])
    response = admin_client.post(url, _agent_data(agent, **overrides))
    assert response.status_code == 200
    assert message in _form_errors(response)


def test_personas_are_one_name_per_line(admin_client, agent):
    url = reverse("admin:chat_agent_change", args=[agent.pk])
    response = admin_client.post(url, _agent_data(agent, personas="Ada\n\n Basil \n"))
    assert response.status_code == 302
    agent.refresh_from_db()
    assert agent.personas == ["Ada", "Basil"]


def test_stored_nonsense_policies_are_cleaned_by_the_migration(agent):
    agent.tool_policies = {"write_file": "sometimes", "calculator": "DENY ", "read_file": 3}
    agent.save()
    migration = importlib.import_module("chat.migrations.0013_agent_tool_policies_cleaned")
    migration.clean_policies(apps, None)
    agent.refresh_from_db()
    assert agent.tool_policies == {"calculator": "deny"}


# --- who may reach it ------------------------------------------------------------------------------


def _sent_to_login(response) -> bool:
    return response.status_code == 302 and "login/?next=/admin/" in response["Location"]


def test_no_one_but_staff_reaches_any_of_it(client, alice, make_user, fake_openai, agent):
    provider = _provider(base_url=fake_openai.base_url)
    urls = [
        reverse(ADD),
        reverse("admin:chat_provider_change", args=[provider.pk]),
        reverse("admin:chat_provider_test_connection", args=[provider.pk]),
        reverse("admin:chat_provider_fetch_models", args=[provider.pk]),
        reverse("admin:chat_agent_change", args=[agent.pk]),
    ]
    for url in urls:  # anonymous, then a plain user: sent to log in
        for response in (client.get(url), client.post(url)):
            assert _sent_to_login(response)
    client.force_login(alice)
    for url in urls:
        for response in (client.get(url), client.post(url, {"model": "fake-model"})):
            assert _sent_to_login(response)
    # Staff without the permission to change providers: refused.
    client.force_login(make_user("helper", staff=True))
    for url in urls[2:4]:
        assert (
            client.post(url, {"offered": ["fake-model"], "model": ["fake-model"]}).status_code
            == 403
        )
    assert not fake_openai.requests
    assert not ProviderModel.objects.exists()
