"""§5 of issue 14: re-rendering a growing reply has a bounded cost."""

from __future__ import annotations

import time

from chat.presentation import markdown
from chat.presentation.markdown import StreamingMarkdown, render_markdown_uncached


def stream(text: str, piece: int = 20) -> tuple[float, str, StreamingMarkdown]:
    renderer = StreamingMarkdown()
    html = ""
    started = time.process_time()
    for end in range(piece, len(text) + piece, piece):
        html = renderer.render(text[:end])
    return time.process_time() - started, html, renderer


def test_the_pathological_link_reply_costs_little_and_falls_back_to_plain_text():
    text = "[a](" * 2048  # 8 KB, no blank line: one block that keeps growing
    spent, html, renderer = stream(text)
    # Unbounded, this cost 12 s of CPU here (15 s in the measure).
    assert spent < 2.0, spent
    assert renderer.last_plain
    assert 'class="plain-stream"' in html and "[a](" * 10 in html
    assert "<a " not in html.split('class="plain-stream"')[1]  # escaped text, no markup
    # The written message is rendered whole, once, not from the plain fallback.
    assert renderer.render_final(text) is None


def test_a_cpu_budget_also_ends_rendering(monkeypatch):
    monkeypatch.setattr(markdown, "STREAM_RENDER_CPU_SECONDS", 0.0)
    renderer = StreamingMarkdown()
    renderer.render("Some *text*")
    assert renderer.plain
    assert 'class="plain-stream"' in renderer.render("Some *text* and more [x](")


def test_the_budget_does_not_depend_on_how_busy_the_machine_is(monkeypatch):
    """The same stream gives the same pages, however slow each render is."""
    text = "[a](" * 1024
    _spent, quick, _r = stream(text)
    real = markdown.StreamingMarkdown._render_tail

    def slow(self, tail):
        time.sleep(0.001)
        return real(self, tail)

    monkeypatch.setattr(markdown.StreamingMarkdown, "_render_tail", slow)
    _spent, slowed, _r = stream(text)
    assert slowed == quick


def test_ordinary_replies_render_as_before():
    text = "# Title\n\nSome **bold** text and `code`.\n\n- one\n- two\n\n```python\nx = 1\n```\n"
    _spent, html, renderer = stream(text, piece=7)
    assert not renderer.plain and not renderer.last_plain
    assert html == render_markdown_uncached(text)


def test_plain_fallback_escapes_html():
    renderer = StreamingMarkdown()
    renderer.plain = True
    html = renderer.render("<script>alert(1)</script>\nline two")
    assert "<script>" not in html and "&lt;script&gt;" in html and "<br>" in html
