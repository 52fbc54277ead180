"""§2 of issue 14 in Chromium: a page on another port of the same host cannot open the
chat socket, although the browser sends it the user's session cookie."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chat import actions
from tests.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Opens the socket and reports what happened in the document's title.
PROBE = """
(url) => new Promise((resolve) => {
  const ws = new WebSocket(url);
  ws.onopen = () => { ws.close(); resolve("open"); };
  ws.onclose = (e) => resolve("closed " + e.code);
  setTimeout(() => resolve("timeout"), 5000);
})
"""


@pytest.fixture
def other_port() -> Iterator[str]:
    """A plain page served on another port of 127.0.0.1: the attacker's page."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            body = b"<!doctype html><title>elsewhere</title><p>another site on this host</p>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_port_cannot_open_the_socket(
    page, live_server_url, other_port, alice, agent, settings, tmp_path
):
    settings.LYCEUM_WORKSPACE_ROOT = tmp_path / "workspaces"
    chat = actions.new_chat(alice, model="demo-fast")
    login(page, live_server_url, "alice")
    socket_url = live_server_url.replace("http://", "ws://") + f"/ws/chat/{chat.pk}/"

    # The app's own page opens it (the control) ...
    page.goto(f"{live_server_url}/chat/{chat.pk}/")
    assert page.evaluate(PROBE, socket_url) == "open"

    # ... a page of another port of the same host, with the same cookie, cannot.
    cookies = page.context.cookies(other_port)
    assert any(c["name"] == settings.SESSION_COOKIE_NAME for c in cookies)
    page.goto(other_port)
    assert page.evaluate(PROBE, socket_url) == "closed 1006"
