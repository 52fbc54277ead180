"""How an artifact's text is shown: highlighted code (Pygments) or rendered markdown
(sanitised after rendering, as in chats)."""

from __future__ import annotations

import html

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from chat.presentation.markdown import render_markdown_uncached

_FORMATTER = HtmlFormatter(nowrap=True)


def highlighted(text: str, language: str) -> str:
    """``<pre class="code highlight">`` of ``text``, highlighted when the language is known."""
    try:
        lexer = get_lexer_by_name(language) if language and language != "text" else None
    except ClassNotFound:
        lexer = None
    body = highlight(text, lexer, _FORMATTER) if lexer else html.escape(text)
    lang = html.escape(language or "text", quote=True)
    return f'<pre class="code highlight" data-lang="{lang}"><code data-lang="{lang}">{body}</code></pre>'


def render_markdown_file(text: str) -> str:
    return render_markdown_uncached(text)
