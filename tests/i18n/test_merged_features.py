"""Features merged after the translation (co-teachers, join code expiry, sign-in
lockout, budgets, versions) speak Chinese on a Chinese page, and the relay keeps its
OpenAI-shaped errors in English."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import translation

from chat import actions as chat_actions
from chat import store, throttle
from chat.models import RelayLimit, Run
from chat.relay import limits, ttlcache
from classroom import actions as class_actions

pytestmark = pytest.mark.django_db

ZH = {"HTTP_ACCEPT_LANGUAGE": "zh-CN,zh;q=0.9"}


@pytest.fixture(autouse=True)
def english_after():
    yield
    translation.deactivate()


def test_the_class_page_shows_co_teachers_and_code_expiry_in_chinese(client, make_user):
    owner = make_user("tess", teacher=True)
    room = class_actions.create_classroom(owner, title="Algebra", model="demo-fast")
    client.force_login(owner)
    page = client.get(reverse("class_detail", args=[room.pk]), **ZH).content.decode()
    assert "协同教师" in page and "添加协同教师" in page and "用户名或邮箱" in page
    assert "有效期" in page and "直到重新生成" in page and "7 天" in page
    assert "Co-teachers" not in page


def test_a_locked_sign_in_says_so_in_chinese(settings, make_user):
    settings.REDIS_URL = ""
    settings.LYCEUM_LOGIN_ATTEMPTS = 2
    settings.LYCEUM_LOGIN_LOCKOUT_MINUTES = 15
    throttle.forget()
    ttlcache.clear()
    make_user("lin")
    browser = Client(REMOTE_ADDR="10.0.0.9")
    for _ in range(2):
        browser.post("/login/", {"username": "lin", "password": "wrong"}, **ZH)
    answer = browser.post("/login/", {"username": "lin", "password": "wrong"}, **ZH)
    assert answer.status_code == 429
    assert "登录失败次数过多。请在 15 分钟后重试。" in answer.content.decode()


def test_a_spent_budget_is_refused_in_the_page_language_and_english_for_the_relay(alice, settings):
    from chat.llm.types import Usage
    from chat.relay.usage import record_run_usage

    settings.REDIS_URL = ""
    ttlcache.clear()
    RelayLimit.objects.create(user=alice, monthly_tokens=100)
    chat = store.create_chat(alice, title="t", model="demo")
    limits.check_run(alice.pk)
    run = Run.objects.create(chat=chat, model="demo")
    record_run_usage(run, Usage(input_tokens=60, output_tokens=40), Run.Status.COMPLETED)
    with pytest.raises(limits.Refused) as relay:
        limits.check_run(alice.pk)
    assert relay.value.message.startswith("The monthly token budget is spent")
    with translation.override("zh-hans"), pytest.raises(chat_actions.ActionError) as caught:
        chat_actions.send_message(alice, chat.pk, "one more", "client-1")
    assert caught.value.message.startswith("本月的 token 预算已用完")
