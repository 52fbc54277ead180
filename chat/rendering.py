"""Markdown for model output: rendered on the server, then sanitised.

Model output is untrusted. markdown-it runs with raw HTML disabled, code is
highlighted by Pygments, external images become plain links (never loaded),
and nh3 cleans the final HTML with a small allow-list, so whatever slips past
the renderer cannot carry script, event handlers or dangerous URLs.
"""

from __future__ import annotations

import html
from functools import lru_cache

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

ALLOWED_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "code", "del", "div", "em", "h1", "h2", "h3",
    "h4", "h5", "h6", "hr", "i", "kbd", "li", "ol", "p", "pre", "s", "span", "strong",
    "sub", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "*": {"class"},
    "a": {"href", "title"},
    "td": {"align"},
    "th": {"align"},
    "ol": {"start"},
    "code": {"data-lang"},
    "pre": {"data-lang"},
}
URL_SCHEMES = {"http", "https", "mailto"}
_FORMATTER = HtmlFormatter(nowrap=True)


def _highlight(code: str, lang: str, _attrs: str) -> str:
    try:
        lexer = get_lexer_by_name(lang) if lang else None
    except ClassNotFound:
        lexer = None
    language = html.escape(lang or "text", quote=True)
    body = highlight(code, lexer, _FORMATTER) if lexer else html.escape(code)
    return (
        f'<pre class="code highlight" data-lang="{language}">'
        f'<code data-lang="{language}">{body}</code></pre>\n'
    )


def _render_image_as_link(_renderer, tokens, idx, _options, _env) -> str:
    token = tokens[idx]
    src = html.escape(token.attrGet("src") or "", quote=True)
    alt = html.escape(token.content or "image")
    # External images are never loaded: they would leak the reader's IP and that
    # the chat was opened. The reader can follow the link on purpose.
    return f'<a class="blocked-image" href="{src}" title="Image not loaded">[image: {alt}]</a>'


@lru_cache(maxsize=1)
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "highlight": _highlight})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("image", _render_image_as_link)
    return md


def sanitize_html(fragment: str) -> str:
    return nh3.clean(
        fragment,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


RENDER_CACHE_SIZE = 4096


def render_markdown_uncached(text: str) -> str:
    """Markdown → safe HTML (sanitised after rendering)."""
    return sanitize_html(_markdown().render(text or ""))


# Stored messages never change, and highlighting plus sanitising was most of a chat
# page's render time and of a resync's (bench_longchat). A reply still being written
# changes with every snapshot: it goes through the uncached function, so it cannot
# push stored messages out of this cache.
render_markdown = lru_cache(maxsize=RENDER_CACHE_SIZE)(render_markdown_uncached)


class StreamingMarkdown:
    """Renders a reply that grows at its end, re-rendering only its last block.

    A streamed reply is pushed several times a second; rendering (and highlighting and
    sanitising) the whole text each time cost O(length) per push. Appending text can
    only change the last top-level block (a paragraph growing, a list gaining an item,
    a fence still open), so every top-level block before it is rendered once and kept.
    The exception is a link reference defined after its use, which the written
    message (rendered whole) shows right.
    """

    def __init__(self) -> None:
        self._stable_source = ""
        self._stable_html = ""

    def render(self, text: str) -> str:
        if not text.startswith(self._stable_source):  # not a continuation: start over
            self._stable_source = self._stable_html = ""
        tail = text[len(self._stable_source) :]
        md = _markdown()
        env: dict = {}
        tokens = md.parse(tail, env)
        last_start = _last_top_level_start(tokens)
        if last_start:  # blocks before the last one are final
            cut = _line_offset(tail, tokens[last_start].map[0])
            self._stable_source += tail[:cut]
            self._stable_html += sanitize_html(
                md.renderer.render(tokens[:last_start], md.options, env)
            )
            tokens = tokens[last_start:]
        return self._stable_html + sanitize_html(md.renderer.render(tokens, md.options, env))


def _last_top_level_start(tokens) -> int:
    """Index of the token opening the last top-level block (0 if there is one or none)."""
    for index in range(len(tokens) - 1, 0, -1):
        token = tokens[index]
        if token.level == 0 and token.nesting >= 0 and token.map is not None:
            return index
    return 0


def _line_offset(text: str, line: int) -> int:
    offset = 0
    for _ in range(line):
        offset = text.index("\n", offset) + 1
    return offset
