"""§5 Setting up providers without traps, in Chromium (issue 15): a validation error does
not empty the key, and Test connection answers in plain words."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from chat.models import Provider
from chat.relay import secrets
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEY = "sk-browser-0123456789abcdef"


def test_the_key_survives_a_validation_error_and_the_connection_is_tested(
    page, serve, make_user, fake_openai
):
    root = make_user("root", staff=True)
    root.is_superuser = True
    root.save()
    Provider.objects.create(name="taken", kind="demo")
    fake_openai.api_key = KEY  # anything else is refused with a 401
    base = serve()
    login(page, base, "root")

    page.goto(f"{base}/admin/chat/provider/add/")
    expect(page.get_by_text("Letters, digits, hyphens and underscores only")).to_be_visible()
    page.get_by_label("Name").fill("taken")
    page.get_by_label("Base URL").fill(fake_openai.base_url)
    page.get_by_label("API key").fill(KEY)
    page.get_by_role("button", name="Save and continue editing").click()

    expect(page.get_by_text("Another provider already has this name.")).to_be_visible()
    key_box = page.get_by_label("API key")
    expect(key_box).to_have_value("")  # the key is not in the page ...
    assert KEY not in page.content()
    expect(page.get_by_text("A new key was entered and is kept")).to_be_visible()  # ... but kept

    page.get_by_label("Name").fill("fake")
    page.get_by_role("button", name="Save and continue editing").click()
    expect(page.get_by_text("was added successfully")).to_be_visible()
    expect(page.get_by_text("A key is stored (not shown)")).to_be_visible()
    assert secrets.decrypt(Provider.objects.get(name="fake").api_key) == KEY

    page.get_by_role("button", name="Test connection").click()
    expect(page.locator(".messagelist")).to_contain_text("Connected: 2 models available.")
    assert fake_openai.requests[-1].headers["authorization"] == f"Bearer {KEY}"

    # A wrong key, saved on purpose: the test says so in words.
    page.get_by_label("API key").fill("sk-wrong-key-000000000000")
    page.get_by_role("button", name="Save and continue editing").click()
    expect(page.get_by_text("was changed successfully")).to_be_visible()
    page.get_by_role("button", name="Test connection").click()
    expect(page.locator(".messagelist")).to_contain_text("The provider refused the key (401).")
