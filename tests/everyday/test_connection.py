"""§3 Honest connection state: the server stops and starts again under an open chat page
(issue 15). The page says "Reconnecting…" at once, keeps what was typed, holds a message
sent meanwhile, reconnects within about two seconds of the server's return and resyncs."""

from __future__ import annotations

import time
from functools import partial

import pytest
from playwright.sync_api import expect

from chat import actions
from chat.models import ChatSession
from tests.conftest import _fresh_daphne_process_class, login
from tests.everyday.conftest import (
    WAIT_MS,
    composer,
    messages,
    open_new_chat,
    send,
    wait_replies,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


class RestartableServer:
    """A forked Daphne that can be stopped and started again on the same port."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.process = None

    def start(self) -> str:
        from channels.testing.live import make_application
        from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

        process = _fresh_daphne_process_class()(
            "127.0.0.1",
            partial(make_application, static_wrapper=ASGIStaticFilesHandler),
            port=self.port,
        )
        process.start()
        if not process.ready.wait(15):
            process.terminate()
            raise RuntimeError("Daphne did not start within 15 s")
        if process.errors.qsize():
            raise RuntimeError(f"Daphne failed to start: {process.errors.get()}")
        self.process = process
        self.port = process.port.value
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.join(5)
            self.process = None


@pytest.fixture
def restartable(transactional_db, settings, tmp_path, agent):
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    settings.LYCEUM_DEMO_TOKEN_DELAY = 0.01
    settings.LYCEUM_STREAM_PUSH_INTERVAL = 0.1
    settings.LYCEUM_CHECKPOINT_INTERVAL = 0.2
    server = RestartableServer()
    try:
        yield server
    finally:
        server.stop()


def test_server_restart_under_an_open_chat(page, restartable, alice):
    base = restartable.start()
    login(page, base, "alice")
    chat_id = open_new_chat(page, base)
    send(page, "hello")
    wait_replies(page, 1)
    status = page.locator("#connection-state")
    expect(status).to_be_hidden()

    composer(page).fill("typed while the server was away")
    restartable.stop()
    expect(status).to_be_visible(timeout=3_000)
    expect(status).to_contain_text("Reconnecting…")
    expect(page.locator("body")).to_have_attribute("data-ws", "closed")
    expect(composer(page)).to_have_value("typed while the server was away")

    # Sent while down: kept in the box, held, and said so.
    composer(page).press("Enter")
    expect(status).to_contain_text("Your message is kept")
    expect(composer(page)).to_have_value("typed while the server was away")
    # Meanwhile the chat changed elsewhere (another tab renamed it).
    actions.rename_chat(alice, chat_id, "Renamed while away")
    page.wait_for_timeout(2_500)  # let the page's retries reach their slowest pace

    restartable.start()
    back = time.monotonic()
    expect(page.locator("body")).to_have_attribute("data-ws", "open", timeout=WAIT_MS)
    reconnected_after = time.monotonic() - back
    assert reconnected_after < 2.5, f"reconnected {reconnected_after:.1f} s after the server"
    expect(status).to_be_hidden()
    # Resynced: what happened while away is on the page...
    expect(page.locator("#chat-title")).to_have_text("Renamed while away", timeout=WAIT_MS)
    # ...and the held message went out once, and was answered.
    users = messages(page).locator(".msg.user")
    expect(users).to_have_count(2, timeout=WAIT_MS)
    expect(users.last.locator(".bubble")).to_have_text("typed while the server was away")
    wait_replies(page, 2)
    expect(composer(page)).to_have_value("")
    assert ChatSession.objects.get(pk=chat_id).inputs.count() == 2
