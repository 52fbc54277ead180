"""Two languages in Chromium (issue 15 §7): a browser set to Chinese gets the interface
in Chinese, the header's picker switches to English and back, and a chat started in
Chinese is answered in Chinese, live."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WAIT_MS = 20_000


@pytest.fixture
def chinese_page(browser):
    context = browser.new_context(locale="zh-CN")  # Accept-Language: zh-CN
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


@pytest.fixture
def base(settings, tmp_path, agent, live_server_url):
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    return live_server_url


def login_in_chinese(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    expect(page.get_by_role("heading", name="登录 Lyceum")).to_be_visible()
    page.get_by_label("用户名").fill(username)
    page.get_by_label("密码", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="登录", exact=True).click()
    page.locator("#who").wait_for()


def test_a_chinese_browser_gets_chinese_and_the_picker_switches(chinese_page, base, alice):
    page = chinese_page
    login_in_chinese(page, base, "alice")
    expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
    expect(page.get_by_role("heading", name="开始对话")).to_be_visible()
    expect(page.get_by_role("textbox", name="开始对话")).to_be_focused()
    expect(page.get_by_role("link", name="班级")).to_be_visible()
    picker = page.get_by_role("combobox", name="语言")
    expect(picker).to_have_value("zh-hans")
    picker.select_option("en")  # switches at once (the button is for pages without JS)
    expect(page.get_by_role("heading", name="Start a chat")).to_be_visible()
    expect(page.locator("html")).to_have_attribute("lang", "en")
    page.reload()  # the choice is kept (a cookie), over the browser's language
    expect(page.get_by_role("heading", name="Start a chat")).to_be_visible()
    page.get_by_role("combobox", name="Language").select_option("zh-hans")
    expect(page.get_by_role("heading", name="开始对话")).to_be_visible()


def test_a_chat_started_in_chinese_is_answered_in_chinese(chinese_page, base, alice):
    page = chinese_page
    login_in_chinese(page, base, "alice")
    page.get_by_label("模型", exact=True).select_option("demo-fast")
    start = page.get_by_role("textbox", name="开始对话")
    start.fill("hello")
    start.press("Enter")
    page.wait_for_url(re.compile(r".*/chat/[0-9a-f-]{36}/$"))
    page.locator("body[data-ws=open]").wait_for(timeout=WAIT_MS)
    messages = page.get_by_role("region", name="消息")
    reply = messages.locator(".msg.assistant .bubble").first
    expect(reply).to_contain_text("我是 Lyceum 的离线演示模型", timeout=WAIT_MS)
    expect(messages.get_by_role("article", name="助手")).to_have_count(1)
    # Live fragments are in Chinese too: the next reply streams in and is labelled so.
    box = page.get_by_role("textbox", name="消息")
    box.fill("请计算 12*7")
    box.press("Enter")
    expect(messages.locator(".msg.assistant .bubble").last).to_have_text(
        "结果是 84。", timeout=WAIT_MS
    )
    expect(page.locator("#run-controls").get_by_role("button", name="重新生成")).to_be_visible()
    # Each reply has its own button; regenerating one shows the version switcher in Chinese.
    expect(messages.get_by_role("button", name="重新生成")).to_have_count(2)
    messages.get_by_role("button", name="重新生成").last.click()
    expect(messages.get_by_role("button", name="上一个版本")).to_be_enabled(timeout=WAIT_MS)
    expect(messages.get_by_role("button", name="下一个版本")).to_be_disabled()
