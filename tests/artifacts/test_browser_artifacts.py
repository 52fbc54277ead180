"""Artifacts in Chromium: cards and panel live, the artifact page, versions and diff,
downloads, the sandboxed preview, and attachments sent with a message."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.artifacts.test_artifacts import PNG
from tests.browser.test_browser_chat import new_chat
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT_MS = 20_000


@pytest.fixture
def serve(request, settings, tmp_path, agent) -> Callable[[], str]:
    def start() -> str:
        settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
        settings.LYCEUM_DEMO_TOKEN_DELAY = 0.0
        settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.1
        return request.getfixturevalue("live_server_url")

    return start


def open_new_chat(page: Page, base: str) -> None:
    new_chat(page, base, model="demo")


def send(page: Page, text: str) -> None:
    users = page.get_by_role("region", name="Messages").locator(".msg.user")
    before = users.count()
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")
    expect(users).to_have_count(before + 1, timeout=WAIT_MS)


def approve_last(page: Page) -> None:
    button = page.get_by_role("region", name="Messages").get_by_role("button", name="Approve")
    expect(button).to_have_count(1, timeout=WAIT_MS)
    button.click()


def test_files_the_agent_writes_show_up_live_version_diff_download(page: Page, serve, alice):
    base = serve()
    login(page, base, "alice")
    open_new_chat(page, base)
    chat_url = page.url
    panel = page.get_by_role("region", name="Artifacts")
    expect(panel).to_contain_text("show up here")

    send(page, "write file notes.md")
    approve_last(page)
    # The card in the transcript and the panel entry arrive live, without a reload.
    card = page.get_by_role("note", name="File notes.md")
    expect(card).to_contain_text("new file", timeout=WAIT_MS)
    expect(panel.get_by_role("link", name="notes.md")).to_be_visible()
    expect(panel).to_contain_text("1 version")

    send(page, "edit file notes.md")
    approve_last(page)
    expect(panel).to_contain_text("2 versions", timeout=WAIT_MS)
    expect(page.get_by_role("note", name="File notes.md")).to_have_count(2)

    panel.get_by_role("link", name="notes.md").click()
    expect(page.get_by_role("heading", name="notes.md")).to_be_visible()
    expect(page.get_by_text("Version 2 of 2")).to_be_visible()
    expect(page.get_by_role("heading", name="Notes", exact=True)).to_be_visible()  # rendered
    page.get_by_role("link", name="Diff version 1 to version 2").click()
    diff = page.get_by_role("region", name="Diff")
    expect(diff).to_contain_text("-Status: draft")
    expect(diff).to_contain_text("+Status: final")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download", exact=True).click()
    download = download_info.value
    assert download.suggested_filename == "notes.md"
    assert "Status: final" in Path(download.path()).read_text(encoding="utf-8")

    page.goto(chat_url)
    page.locator("body[data-ws=open]").wait_for(timeout=WAIT_MS)
    send(page, "show me some code")
    code_card = page.get_by_role("note", name=re.compile(r"File snippet-\d+-1\.py"))
    expect(code_card).to_be_visible(timeout=WAIT_MS)
    code_card.get_by_role("link").click()
    expect(page.locator("pre.highlight .k").first).to_be_visible()  # Pygments tokens
    page.goto(chat_url)
    with page.expect_download() as zipped:
        page.get_by_role("region", name="Artifacts").get_by_role(
            "link", name="Download all"
        ).click()
    assert zipped.value.suggested_filename.endswith(".zip")


def test_an_html_artifact_previews_without_reaching_the_app(page: Page, serve, alice):
    base = serve()
    login(page, base, "alice")
    open_new_chat(page, base)
    send(page, "write file page.html")
    approve_last(page)
    panel = page.get_by_role("region", name="Artifacts")
    panel.get_by_role("link", name="page.html").click(timeout=WAIT_MS)
    title = page.title()
    frame_element = page.get_by_title("Preview")
    expect(frame_element).to_have_attribute("sandbox", "allow-scripts")
    frame = page.frame_locator('iframe[title="Preview"]')
    verdict = frame.locator("#verdict")
    # The script ran, in an opaque origin: the parent page and the cookies are out of reach.
    expect(verdict).to_contain_text("script ran", timeout=WAIT_MS)
    expect(verdict).to_contain_text("parent blocked")
    expect(verdict).to_contain_text("cookies blocked")
    assert page.title() == title
    assert page.evaluate("document.body.dataset.pwned") is None
    assert page.context.cookies()  # the session cookie is there; the frame could not read it


def test_attachments_are_sent_and_shown(page: Page, serve, alice, tmp_path):
    base = serve()
    login(page, base, "alice")
    open_new_chat(page, base)
    text_file = tmp_path / "todo.txt"
    text_file.write_text("buy milk\n")
    image = tmp_path / "dot.png"
    image.write_bytes(PNG)
    expect(page.get_by_role("button", name="Attach")).to_be_visible()
    with page.expect_file_chooser() as chooser:
        page.get_by_role("button", name="Attach").click()
    chooser.value.set_files([str(text_file), str(image)])
    attached = page.get_by_role("list", name="Files to send")
    expect(attached.get_by_role("listitem")).to_have_count(2, timeout=WAIT_MS)
    send(page, "what do these say?")
    message = page.get_by_role("region", name="Messages").locator(".msg.user").last
    shown = message.get_by_role("list", name="Attachments")
    expect(shown.get_by_role("link", name="todo.txt")).to_be_visible()
    expect(shown.get_by_role("img", name="dot.png")).to_be_visible()
    assert shown.get_by_role("img", name="dot.png").evaluate("img => img.naturalWidth") == 1
    expect(attached.get_by_role("listitem")).to_have_count(0)  # the composer starts afresh
    panel = page.get_by_role("region", name="Artifacts")
    expect(panel.get_by_role("link", name="todo.txt")).to_be_visible()
    expect(panel.get_by_role("link", name="dot.png")).to_be_visible()
