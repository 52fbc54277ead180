"""Two languages (issue 15 §7): the browser's language picks English or Simplified
Chinese, the picker switches, English stays the default, and a Chinese chat's runs
render and answer in Chinese."""

from __future__ import annotations

import pytest
from django.utils import translation

from chat.core.prompts import CHINESE_LINE
from chat.live.language import scope_language
from chat.models import ChatSession
from chat.runhost.setup import setup_for
from tests.runhost.conftest import runner_state, runtime  # noqa: F401
from tests.runhost.helpers import display, new_chat, send, settle

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def english_after():
    """A request in Chinese leaves Chinese active in the test's thread: not for the next."""
    yield
    translation.deactivate()


def test_no_accept_language_is_english(alice_client):
    page = alice_client.get("/").content.decode()
    assert '<html lang="en">' in page
    assert "Start a chat" in page and "开始对话" not in page


def test_a_chinese_browser_gets_chinese(alice_client):
    page = alice_client.get("/", HTTP_ACCEPT_LANGUAGE="zh-CN,zh;q=0.9,en;q=0.8").content.decode()
    assert '<html lang="zh-hans">' in page
    assert "开始对话" in page and "你的对话" in page
    assert 'aria-label="语言"' in page  # the picker, named in the page's language


def test_the_picker_switches_and_the_choice_sticks(alice_client):
    answer = alice_client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/classes/"})
    assert answer.status_code == 302 and answer["Location"] == "/classes/"
    assert "<h1>班级</h1>" in alice_client.get("/classes/").content.decode()
    alice_client.post("/i18n/setlang/", {"language": "en", "next": "/"})
    page = alice_client.get("/classes/", HTTP_ACCEPT_LANGUAGE="zh-CN").content.decode()
    assert "<h1>Classes</h1>" in page  # the picker's choice wins over the browser's


def test_the_login_page_has_the_picker(client):
    page = client.get("/login/", HTTP_ACCEPT_LANGUAGE="zh-CN").content.decode()
    assert "登录 Lyceum" in page and 'action="/i18n/setlang/"' in page
    assert client.post("/i18n/setlang/", {"language": "en", "next": "/login/"}).status_code == 302


def test_errors_of_actions_follow_the_page(alice_client):
    answer = alice_client.post(
        "/chats/start/", {"message": "   ", "model": "demo"}, HTTP_ACCEPT_LANGUAGE="zh-CN"
    )
    assert "消息是空的。" in answer.content.decode()


def test_a_socket_takes_the_cookie_then_the_browser_language():
    assert scope_language({"headers": [(b"accept-language", b"zh-CN,zh;q=0.9")]}) == "zh-hans"
    assert scope_language({"headers": [(b"accept-language", b"fr-FR, de")]}) == "en"
    assert scope_language({"headers": []}) == "en"
    chosen = {"cookies": {"django_language": "en"}, "headers": [(b"accept-language", b"zh")]}
    assert scope_language(chosen) == "en"


def test_a_chat_takes_the_language_of_its_creator(alice):
    from chat import actions

    with translation.override("zh-hans"):
        chinese = actions.new_chat(alice, model="demo")
    english = actions.new_chat(alice, model="demo")
    assert ChatSession.objects.get(pk=chinese.pk).language == "zh-hans"
    assert CHINESE_LINE in setup_for(ChatSession.objects.get(pk=chinese.pk)).system_prompt
    assert CHINESE_LINE not in setup_for(ChatSession.objects.get(pk=english.pk)).system_prompt


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime", "runner_state")
async def test_the_demo_model_answers_a_chinese_chat_in_chinese(alice):
    with translation.override("zh-hans"):
        chat = await new_chat(alice)
    await send(alice, chat, "hello there")
    await settle()
    # Explicit: a chat takes the language active where it is made, and an earlier
    # test's run may have left another one active in the database thread.
    with translation.override("en"):
        english = await new_chat(alice)
    await send(alice, english, "hello there")
    await settle()
    from channels.db import database_sync_to_async

    events = await database_sync_to_async(display)(chat)
    replies = [e.payload["content"] for e in events if e.payload.get("role") == "assistant"]
    assert replies and "我是 Lyceum 的离线演示模型" in replies[-1]
    events = await database_sync_to_async(display)(english)
    replies = [e.payload["content"] for e in events if e.payload.get("role") == "assistant"]
    assert replies and "I am Lyceum's offline demo model" in replies[-1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("runtime", "runner_state")
async def test_chinese_written_in_an_english_chat_is_answered_in_chinese(alice):
    chat = await new_chat(alice)
    await send(alice, chat, "请计算 12*7")
    await settle()
    from channels.db import database_sync_to_async

    events = await database_sync_to_async(display)(chat)
    replies = [e.payload["content"] for e in events if e.payload.get("role") == "assistant"]
    assert replies[-1] == "结果是 84。"
