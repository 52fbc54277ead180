"""In Chromium: hostile model output stays inert, and another user's chat stays closed.

The XSS check watches what a browser would do with the output (dialogs, console
errors, requests to other hosts) and what ended up in the DOM, both as the reply
streams in over the socket and on a reload (the server-rendered page).
"""

from __future__ import annotations

import base64
import re
import socket
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, expect

from chat.models import Provider, ProviderModel
from tests.browser import test_browser_chat as chat_ui
from tests.browser.test_browser_chat import messages, new_chat, replies, send, wait_replies
from tests.conftest import login
from tests.fakeopenai import FakeToolCall, Script

# The live server fixtures of the chat tests (settings are set before the server forks).
serve = chat_ui.serve

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# A larger corpus than the demo's, sent by a fake OpenAI-compatible model as its reply.
CORPUS = "\n\n".join(
    [
        "Start of the fake corpus.",
        "<script>alert('script')</script>",
        "<script src=http://example.invalid/evil.js></script>",
        "<img src=x onerror=alert('img')>",
        '<img src="http://example.invalid/raw.png">',
        '<img srcset="http://example.invalid/set.png 2x">',
        "![tracker](http://example.invalid/pixel.png)",
        "![inline](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+)",
        "[js link](javascript:alert('md'))",
        "[js entity](jav&#x09;ascript:alert('tab'))",
        "<a href=\"javascript:alert('raw')\">raw js link</a>",
        '<a href="#" onclick="alert(\'click\')">click me</a>',
        "<svg onload=alert('svg')><circle r=5></circle></svg>",
        "<svg><animate onbegin=alert('animate') attributeName=x dur=1s></animate></svg>",
        '<iframe src="http://example.invalid/frame"></iframe>',
        "<iframe srcdoc=\"<script>alert('srcdoc')</script>\"></iframe>",
        "<style>body { display: none } * { background: url(http://example.invalid/bg.png) }</style>",
        '<div style="background:url(http://example.invalid/div.png)">styled</div>',
        '<link rel="stylesheet" href="http://example.invalid/evil.css">',
        '<link rel="prefetch" href="http://example.invalid/prefetch">',
        "[data link](data:text/html;base64,"
        + base64.b64encode(b"<script>alert(1)</script>").decode()
        + ")",
        '<object data="http://example.invalid/obj.swf"></object>',
        '<embed src="http://example.invalid/embed.swf">',
        '<video poster="http://example.invalid/poster.png" src="http://example.invalid/v.mp4"></video>',
        '<audio src="http://example.invalid/a.mp3" autoplay></audio>',
        "<body onload=\"alert('body')\">",
        "<input autofocus onfocus=\"alert('focus')\">",
        "<details open ontoggle=\"alert('toggle')\"><summary>x</summary></details>",
        '<form action="http://example.invalid/steal"><button>send</button></form>',
        '<meta http-equiv="refresh" content="0;url=http://example.invalid/">',
        '<base href="http://example.invalid/">',
        "<marquee onstart=alert('marquee')>m</marquee>",
        '<a href="http://example.invalid/" target="_blank">raw HTML is text</a>',
        "[a normal link stays a link](http://example.invalid/page)",
        "End of the fake corpus.",
    ]
)
HOSTILE = "<img src=x onerror=alert('title')><script>alert('title')</script>"


def _console_errors_and_requests(page: Page):
    dialogs: list[str] = []
    console: list[tuple[str, str]] = []
    requests: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: console.append((m.type, m.text)))
    page.on("request", lambda r: requests.append(r.url))
    page.on("websocket", lambda ws: requests.append(ws.url.replace("ws://", "http://", 1)))
    return dialogs, console, requests


def _assert_inert_dom(page: Page) -> None:
    area = messages(page)
    for tag in ("script", "iframe", "object", "embed", "style", "link", "meta", "base",
                "img", "svg", "video", "audio", "marquee"):  # fmt: skip
        assert area.locator(tag).count() == 0, f"a <{tag}> reached the messages"
    output = area.locator(".msg.assistant .bubble")  # the page's own forms are elsewhere
    for tag in ("form", "input", "textarea", "details"):
        assert output.locator(tag).count() == 0, f"a <{tag}> reached a reply"
    assert page.locator("iframe").count() == 0
    on_attributes = area.locator("*").evaluate_all(
        "els => els.flatMap(e => [...e.attributes].map(a => a.name)"
        ".filter(n => n.toLowerCase().startsWith('on')))"
    )
    assert on_attributes == []
    hrefs = area.locator("a[href]").evaluate_all("els => els.map(e => e.getAttribute('href'))")
    assert hrefs, "the corpus has links; they should stay (made safe)"
    for href in hrefs:
        scheme = urlsplit(href.strip()).scheme.lower()
        assert scheme in ("", "http", "https", "mailto"), href
    styled = area.locator("[style]").count()
    assert styled == 0
    expect(page.locator("body")).to_be_visible()


def test_xss_corpus_in_model_output_never_runs_or_loads(page, serve, alice, fake_openai):
    fake_openai.respond_with(
        lambda request: Script(text=CORPUS, reasoning=f"Thinking {HOSTILE} about it.")
    )
    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=fake_openai.base_url, api_key="sk-test-secret"
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
    )
    base = serve()
    host = urlsplit(base).netloc
    dialogs, console, requests = _console_errors_and_requests(page)
    login(page, base, "alice")
    new_chat(page, base, model="demo")

    send(page, f"xss {HOSTILE}")  # the user's text (and the chat title) is hostile too
    wait_replies(page, 1)
    demo = replies(page).last
    expect(demo).to_contain_text("Here is an XSS test corpus.")
    expect(demo).to_contain_text("End of the corpus.")
    expect(demo).to_contain_text("<script>alert('in a code block')</script>")  # as text

    page.get_by_label("Model", exact=True).select_option("fake-model")
    expect(messages(page).get_by_role("note").last).to_contain_text("fake-model")
    send(page, "now the bigger corpus")
    wait_replies(page, 2)
    fake = replies(page).last
    expect(fake).to_contain_text("End of the fake corpus.")
    expect(fake.get_by_role("link", name="[image: tracker]")).to_have_count(1)
    expect(fake.get_by_role("link", name="a normal link stays a link")).to_have_count(1)
    _assert_inert_dom(page)

    page.reload()  # the same history rendered by the server
    expect(replies(page)).to_have_count(2)
    expect(page.get_by_role("heading", level=1)).to_contain_text("<img src=x")
    replies(page).last.get_by_text("Thinking", exact=True).click()
    expect(replies(page).last.locator(".reasoning-text")).to_contain_text(HOSTILE)
    _assert_inert_dom(page)
    page.wait_for_timeout(300)  # anything scheduled (onload, onfocus, refresh) would fire

    assert f"{base}/static/js/lyceum.js" in requests  # the listener sees the page's requests
    assert dialogs == []
    errors = [text for kind, text in console if kind == "error"]
    assert errors == [], errors
    foreign = [url for url in requests if urlsplit(url).netloc != host]
    assert foreign == [], foreign


def test_tool_arguments_and_results_are_shown_as_text(page, serve, alice, fake_openai):
    """A hostile tool call (name and arguments) is displayed as text, never markup."""
    fake_openai.enqueue(
        Script(
            text="",
            tool_calls=[
                FakeToolCall(name="calculator", arguments=f'{{"expression": "{HOSTILE}"}}'),
            ],
        ),
        Script(text="The calculator could not read that."),
    )
    provider = Provider.objects.create(
        name="fake", kind="openai", base_url=fake_openai.base_url, api_key="sk-test-secret"
    )
    ProviderModel.objects.create(
        provider=provider, alias="fake-model", model_id="gpt-fake", context_window=8000
    )
    base = serve()
    dialogs, console, requests = _console_errors_and_requests(page)
    login(page, base, "alice")
    new_chat(page, base, model="fake-model")
    send(page, "calculate this")
    wait_replies(page, 1)

    card = messages(page).locator(".tool-card")
    card.get_by_text("Arguments").click()
    expect(card.locator(".args-readable")).to_contain_text("<img src=x onerror=")
    result = messages(page).locator(".msg.tool-result")
    result.get_by_text("Result").click()
    expect(result.locator(".tool-output")).to_be_visible()
    assert messages(page).locator("img, script").count() == 0
    page.reload()
    assert messages(page).locator("img, script").count() == 0
    assert dialogs == []
    assert [text for kind, text in console if kind == "error"] == []


# --- another user's chat --------------------------------------------------------------------


def _handshake_status(base: str, path: str, cookie: str) -> str:
    """Open a WebSocket by hand (as a browser would) and return the HTTP status line."""
    parts = urlsplit(base)
    key = base64.b64encode(b"lyceum-test-key!").decode()
    request = (
        f"GET {path} HTTP/1.1\r\n"
        f"Host: {parts.netloc}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Origin: {base}\r\n"
        f"Cookie: {cookie}\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(request.encode())
        head = b""
        while b"\r\n" not in head:
            chunk = conn.recv(1024)
            if not chunk:
                break
            head += chunk
    return head.split(b"\r\n", 1)[0].decode()


def test_other_users_chat_is_closed_over_http_and_socket(page, serve, alice, bob):
    from chat import actions

    bobs = actions.new_chat(bob, model="demo", title="Bob's secrets")
    base = serve()
    login(page, base, "alice")
    own = new_chat(page, base)
    expect(page.get_by_role("link", name="Bob's secrets")).to_have_count(0)

    response = page.goto(f"{base}/chat/{bobs.pk}/")
    assert response.status == 404
    expect(page.get_by_text("Bob's secrets")).to_have_count(0)
    for path in ("older/?before=5", "export.md", "export.json", "delete/"):
        assert page.goto(f"{base}/chat/{bobs.pk}/{path}").status == 404

    cookies = "; ".join(f"{c['name']}={c['value']}" for c in page.context.cookies())
    assert re.search(r"sessionid=\w+", cookies)
    # The same handshake is accepted for Alice's own chat, so the refusal is the access check.
    assert " 101 " in _handshake_status(base, f"/ws/chat/{own}/", cookies)
    assert " 403 " in _handshake_status(base, f"/ws/chat/{bobs.pk}/", cookies)
    assert " 403 " in _handshake_status(base, f"/ws/chat/{own}/", "")  # not logged in
