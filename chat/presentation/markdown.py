"""Markdown for model output: rendered on the server, then sanitised.

Model output is untrusted. markdown-it runs with raw HTML disabled, code is
highlighted by Pygments, external images become plain links (never loaded),
and nh3 cleans the final HTML with a small allow-list, so whatever slips past
the renderer cannot carry script, event handlers or dangerous URLs.
"""

from __future__ import annotations

import html
import re
import threading
import time
from collections import OrderedDict
from functools import lru_cache

import nh3
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
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


def highlight_file(path: str, content: str) -> str:
    """A file's content as a highlighted code block, its language guessed from the name."""
    try:
        lexer = get_lexer_for_filename(path, content)
        lang = lexer.aliases[0] if lexer.aliases else ""
    except ClassNotFound:
        lang = ""
    return _highlight(content, lang, "")


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


class HtmlCache:
    """HTML by a text key, least recently used out first.

    Used from the event loop and the database thread alike, hence the lock.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._html: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> str | None:
        with self._lock:
            html = self._html.get(text)
            if html is not None:
                self._html.move_to_end(text)
            return html

    def put(self, text: str, html: str) -> None:
        with self._lock:
            self._html[text] = html
            self._html.move_to_end(text)
            if len(self._html) > self._size:
                self._html.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._html.clear()


# Stored messages never change, and highlighting plus sanitising was most of a chat
# page's render time and of a resync's (bench_longchat).
_rendered = HtmlCache(RENDER_CACHE_SIZE)


def render_markdown(text: str) -> str:
    """Markdown of a stored message → safe HTML, cached by text.

    A reply still being written changes with every snapshot: it goes through
    :class:`StreamingMarkdown`, so it cannot push stored messages out of the cache.
    """
    html = _rendered.get(text)
    if html is None:
        html = render_markdown_uncached(text)
        _rendered.put(text, html)
    return html


def forget_rendered_markdown() -> None:
    _rendered.clear()


def remember_rendered(text: str, html: str) -> None:
    """Keep HTML already made for ``text`` (by a stream's renderer) for its written message."""
    _rendered.put(text, html)


# The work one streamed reply may cost (see StreamingMarkdown): past either bound, the
# block being written is shown as plain text until the reply is written (then rendered whole).
STREAM_TAIL_CHARS = 6000  # a last block longer than this is not re-rendered per snapshot
# CPU time of one stream's re-renders, in all: the thread's own CPU time, not the clock,
# so a busy machine (another process running) does not change what the page shows.
STREAM_RENDER_CPU_SECONDS = 1.0


def _plain_html(text: str) -> str:
    return '<p class="plain-stream">' + html.escape(text).replace("\n", "<br>") + "</p>"


class StreamingMarkdown:
    """Renders a reply that grows at its end, re-rendering only its last block.

    A streamed reply is pushed several times a second; rendering (and highlighting and
    sanitising) the whole text each time cost O(length) per push. Appending text can
    only change the blocks after the last blank line between top-level blocks (a
    paragraph growing, a list gaining an item, a fence still open), so every block
    before that is rendered once and kept.
    And when what was added is plain words (or whole bold, italic or code spans of
    them) continuing the last block's text, it goes straight into that block's HTML
    without rendering at all. A list being written (the last block) is rendered from
    its last item on: the items before it are final while it stays tight (see
    :class:`_GrowingList`), and so is a paragraph a list interrupted; a new item of
    plain words goes in as words do. The one difference from
    rendering the whole text: a link reference defined after its use (the written
    message, rendered whole, shows it right).

    The work is bounded: pathological input (``[a](`` repeated, with no blank line)
    keeps one block growing, and re-parsing it costs more with every snapshot (15 s of
    CPU for 8 KB in 20-character pieces). A last block longer than ``STREAM_TAIL_CHARS``,
    or a stream whose renders have cost ``STREAM_RENDER_CPU_SECONDS`` of CPU, is shown as
    escaped plain text from then on; the written message is rendered once, whole.
    """

    def __init__(self) -> None:
        self._cpu = 0.0  # CPU seconds this stream's re-renders have cost
        self.plain = False  # over budget: the rest of this stream as plain text
        self.last_plain = False  # the last render showed its last block as plain text
        self._stable_source = ""
        self._stable_html = ""
        self._tail_source = ""
        self._tail_html = ""
        self._insert_at: int | None = None  # where appended words go in _tail_html
        self._space_first = False  # ... and whether they must start with a space
        self._last: tuple[str, str] | None = None  # the last text rendered, and its HTML
        self._list: _GrowingList | None = None  # the last block, a list: its final items
        self._paragraph_last = False  # the tail's last block is a top-level paragraph

    def render(self, text: str) -> str:
        # The same text again: the final render of a reply whose last snapshot held all
        # of it (each finished persona's of a class reply).
        if self._last is None or self._last[0] != text:
            self._last = (text, self._render(text))
        return self._last[1]

    def _render(self, text: str) -> str:
        done = self._stable_source + self._tail_source
        if self._insert_at is not None and text.startswith(done):
            added = text[len(done) :]
            if self._appendable(added, done):
                return self._stable_html + self._append_words(added)
            if self._list is not None and (html := self._append_items(added, done)):
                return self._stable_html + html
        if not text.startswith(self._stable_source):  # not a continuation: start over
            self._stable_source = self._stable_html = ""
            self._list, self._paragraph_last = None, False
        tail = text[len(self._stable_source) :]
        self.last_plain = self.plain or len(tail) > STREAM_TAIL_CHARS
        if self.last_plain:
            self._insert_at = None
            return self._stable_html + _plain_html(tail)
        started = time.thread_time()
        try:
            return self._render_tail(tail)
        finally:
            self._cpu += time.thread_time() - started
            if self._cpu > STREAM_RENDER_CPU_SECONDS:
                self.plain = True
                self._insert_at = None  # no more appending words to rendered HTML either

    def _render_tail(self, tail: str) -> str:
        md = _markdown()
        if self._paragraph_last and self._list is None:
            self._list = self._list_after_paragraph(tail)
        done = self._list.render(tail) if self._list is not None else None
        if done is not None:
            html, final, final_html, self._paragraph_last = done
            if final:  # the list ended, and the blocks after it up to the last are final
                self._stable_source += tail[:final]
                self._stable_html += final_html
                tail, self._list = tail[final:], None
        else:
            self._list = None
            env: dict = {}
            tokens = md.parse(tail, env)
            last_start = _last_final_boundary(tokens, tail)
            first_line = 0  # of the tail, in the tokens' line numbers
            if last_start:  # the blocks before it are final
                first_line = tokens[last_start].map[0]
                cut = _line_offset(tail, first_line)
                self._stable_source += tail[:cut]
                self._stable_html += sanitize_html(
                    md.renderer.render(tokens[:last_start], md.options, env)
                )
                tokens, tail = tokens[last_start:], tail[cut:]
            html = sanitize_html(md.renderer.render(tokens, md.options, env))
            self._list = _GrowingList.split(tokens, tail, first_line, env, html)
            self._paragraph_last = _ends_with_paragraph(tokens)
        self._tail_source = tail
        self._tail_html = html
        point = _word_insertion_point(tail, self._tail_html)
        self._insert_at, self._space_first = point if point else (None, False)
        return self._stable_html + self._tail_html

    def _append_items(self, added: str, done: str) -> str | None:
        """:meth:`_append_item` for text that brings several lines at once (a push
        after a fast model, or a list of short items): one line at a time, while each
        line is a new item of words. Each step leaves the state as a render of the text
        up to it would (None: the rest must be rendered, from wherever the steps got to).
        """
        html = None
        while "\n" in added:
            first = added.find("\n")
            if added.startswith("\n", first + 1):  # a blank line
                return self._end_list(added, done)
            cut = added.find("\n", first + 1)
            step = added if cut < 0 else added[:cut]
            html = self._append_item(step, done)
            if html is None:
                return None
            done += step
            added = added[len(step) :]
        return html

    def _end_list(self, added: str, done: str) -> str | None:
        """The tail's HTML when ``added`` ends its list: words to the last item, a blank
        line, then a paragraph of one line of words that starts with a letter (None: it
        must be rendered).

        The list's last item being one line of words, the list is tight and stays so: a
        blank line, then an unindented line that is no marker and can never become one
        (a letter first) starts a paragraph after the list. The list is final then, and
        the paragraph is the tail, as a render would leave them.
        """
        assert self._list is not None
        words, _blank, paragraph = added.partition("\n\n")
        if "\n" in words or "\n" in paragraph or not _PARAGRAPH_WORDS.fullmatch(paragraph):
            return None
        last = self._tail_source[len(self._list.source) :] + words
        item = _WORDS_ITEM.fullmatch(last)
        if item is None or (item.group(1) or item.group(2)) != self._list.markup:
            return None
        if words and not self._appendable(words, done):
            return None
        if words:
            self._append_words(words)
        self._stable_source += self._tail_source + "\n\n"
        self._stable_html += self._tail_html
        self._list, self._paragraph_last = None, True
        self._tail_source = paragraph
        self._tail_html = "<p>" + _SPAN.sub(_span_html, paragraph.rstrip(" ")) + "</p>\n"
        point = _word_insertion_point(self._tail_source, self._tail_html)
        self._insert_at, self._space_first = point if point else (None, False)
        return self._tail_html

    def _append_item(self, added: str, done: str) -> str | None:
        """The tail's HTML with a new item of words added to its list without rendering
        (None: it must be rendered), words before it going to the last item.

        Only when the last item is one line of words after its marker, and so is the new
        one, with the same marker, unindented: that line starts a sibling item and
        nothing else, the item before it is final, and the list stays tight.
        """
        assert self._list is not None
        line_end = added.find("\n")
        if line_end < 0 or "\n" in added[line_end + 1 :]:
            return None
        words, line = added[:line_end], added[line_end + 1 :]
        new = _WORDS_ITEM.fullmatch(line)
        if new is None or (new.group(1) or new.group(2)) != self._list.markup:
            return None
        last = self._tail_source[len(self._list.source) :] + words
        item = _WORDS_ITEM.fullmatch(last.lstrip(" "))
        if item is None or len(last) - len(last.lstrip(" ")) > 3:
            return None
        if words and not self._appendable(words, done):
            return None
        if words:
            self._append_words(words)
        close = self._list.close
        self._list.source = self._tail_source + "\n"
        self._list.html = self._tail_html[: -len(close)]
        content = new.group(3).rstrip(" ")
        self._tail_source += "\n" + line
        self._tail_html = self._list.html + "<li>" + _SPAN.sub(_span_html, content) + "</li>\n"
        self._insert_at = len(self._tail_html) - len("</li>\n")
        self._space_first = content[-1] in "*`"
        self._tail_html += close
        return self._tail_html

    def _list_after_paragraph(self, tail: str) -> _GrowingList | None:
        """The tail grown from a paragraph (rendered) into that paragraph and a list
        after it: then the paragraph is final and only the list is rendered.

        A list item whose first line has content interrupts a paragraph, and no text
        added later changes that line into anything that does not (not a setext
        underline: that is dashes alone; not a table's delimiter row: that does not
        start with a marker and a space). The words added to the paragraph's last line
        before the item go in as words do (:meth:`_appendable`), or the tail is
        rendered whole.
        """
        source = self._tail_source
        if not tail.startswith(source):
            return None
        added = tail[len(source) :]
        if source.endswith("\n"):
            words, rest = "", added
        else:
            line_end = added.find("\n")
            if line_end < 0:
                return None
            words, rest = added[:line_end], added[line_end + 1 :]
        marker = _INTERRUPTING_ITEM.match(rest)
        if marker is None or "]:" in tail:  # a link reference: see _GrowingList.split
            return None
        if words:
            done = self._stable_source + source
            if self._insert_at is None or not self._appendable(words, done):
                return None
            self._append_words(words)
        ordered = marker.group(1) is None
        head = "<ol>\n" if ordered else "<ul>\n"
        return _GrowingList(
            tail[: len(tail) - len(rest)],
            self._tail_html + head,
            head.replace("<", "</"),
            "ordered_list_open" if ordered else "bullet_list_open",
            marker.group(2) or marker.group(1),
        )

    def render_final(self, text: str) -> str | None:
        """The HTML of the finished ``text``, as rendering it whole gives (None if it may not).

        Only where a link reference is defined can the two differ (see the class).
        """
        if "]:" in text:  # it may define a link reference (a label may span lines)
            return None
        rendered = self.render(text)
        return None if self.last_plain else rendered  # over budget: render it whole

    def _appendable(self, added: str, done: str) -> bool:
        if not _WORDS_AND_SPANS.fullmatch(added):
            return False
        spaced = added[0] == " " or done[-1:] == " "
        if (added[0] in "*`" or self._space_first) and not spaced:
            return False  # a span must not touch the text before it
        if "*" not in added and "`" not in added:
            return True
        # An unmatched delimiter shown as text could pair with a new span's.
        return "*" not in self._tail_html and "`" not in self._tail_html

    def _append_words(self, added: str) -> str:
        # The block's text ends with the source's last word (or span): markdown drops
        # the spaces after it, and shows them again once a word follows.
        source = self._tail_source
        pending = source[len(source.rstrip(" ")) :]
        words = (pending + added).rstrip(" ")
        html_words = _SPAN.sub(_span_html, words)
        html, at = self._tail_html, self._insert_at or 0
        self._tail_html = html[:at] + html_words + html[at:]
        self._insert_at = at + len(html_words)
        if words:
            self._space_first = words[-1] in "*`"
        self._tail_source = source + added
        return self._tail_html


class _GrowingList:
    """The last block of a streamed reply's tail when it is a tight list: the items
    before its last one are final, only the last one is rendered again.

    A reply's list grows an item at a time, and re-parsing the whole block (the list,
    and the paragraph it interrupted) on each new item was most of a stream's markdown
    time. An item ends where the next one starts, and text added after cannot reach
    back into it, with one exception: a blank line between items, or between two
    blocks of an item, makes the whole list loose (its items' paragraphs shown as
    such). So the text from the last item on is rendered alone, and used only while
    it is a tight list of the same kind by itself (then the whole list stays tight);
    anything else (a loose list, a block after the list, another marker) renders the
    tail whole again. Sanitised item by item: each item is a whole element.
    """

    def __init__(self, source: str, html: str, close: str, kind: str, markup: str):
        self.source = source  # the tail's text before the last item
        self.html = html  # ... as sanitised HTML, the list's opening tag and items left open
        self.close = close  # the list's closing tag
        self.kind = kind  # bullet_list_open or ordered_list_open
        self.markup = markup  # the items' marker ("-", "*", "+"; ".", ")")

    @classmethod
    def split(
        cls, tokens: list, tail: str, first_line: int, env: dict, html: str
    ) -> _GrowingList | None:
        """The tail's last block split before its last item, if it is a tight list
        (checked: the parts give the ``html`` of the whole tail). The blocks before the
        list in the tail are final too: the list's first line interrupted them."""
        if not tokens or tokens[-1].type not in ("bullet_list_close", "ordered_list_close"):
            return None
        if "]:" in tail:  # it may define a link reference: those apply to the whole text
            return None
        if tokens[-1].level != 0:
            return None
        opened = max(i for i, t in enumerate(tokens) if t.level == 0 and t.nesting == 1)
        items = [i for i in range(opened + 1, len(tokens)) if _is_item(tokens[i])]
        if not items or not _tight(tokens[opened + 1 : -1]):
            return None
        last = items[-1]
        md = _markdown()
        render = md.renderer.render
        head = tokens[opened]
        close = f"</{head.tag}>\n"
        before = render(tokens[:opened], md.options, env)
        items_before = _sanitize_items(render(tokens[opened + 1 : last], md.options, env))
        prefix = None
        if items_before is not None:
            prefix = (sanitize_html(before) if before else "") + render([head], md.options, env)
            prefix += items_before
        rest = _sanitize_items(render(tokens[last:-1], md.options, env))
        if prefix is None or rest is None or prefix + rest + close != html:
            return None
        cut = _line_offset(tail, tokens[last].map[0] - first_line)
        return cls(tail[:cut], prefix, close, head.type, tokens[last].markup)

    def render(self, tail: str) -> tuple[str, int, str, bool] | None:
        """The tail's HTML, rendering only the list's last item(s) and what follows it
        (None: render the tail whole). And how much of the tail is final, with its HTML:
        once the list has ended, what is before the tail's last final boundary; and
        whether the tail's last block is a paragraph."""
        if not tail.startswith(self.source):
            return None
        rest = tail[len(self.source) :]
        if "]:" in rest:  # it may define a link reference (see split)
            return None
        if (word_items := self._word_items(rest)) is not None:
            # Lines of words each after the list's own marker (a paragraph's first
            # items, say): tight items of those words, no parse (as _append_item).
            if len(word_items) > 1:  # the items before the last one are final
                self.html += "".join(word_items[:-1])
                self.source += rest[: rest.rfind("\n") + 1]
            return self.html + word_items[-1] + self.close, 0, "", False
        md = _markdown()
        env: dict = {}
        tokens = md.parse(rest, env)
        if not tokens or tokens[0].type != self.kind:
            return None
        close = next(i for i in range(1, len(tokens)) if tokens[i].level == 0)
        if not _tight(tokens[1:close]):
            return None  # a loose list: every item's paragraphs shown
        items = [i for i in range(1, close) if _is_item(tokens[i])]
        if any(tokens[i].markup != self.markup for i in items):
            return None
        last = items[-1]
        rendered = _sanitize_items(md.renderer.render(tokens[last:close], md.options, env))
        if rendered is None:
            return None
        before = len(tail) - len(rest)
        if last > 1:  # items before the last one: final now too
            items_before = _sanitize_items(md.renderer.render(tokens[1:last], md.options, env))
            if items_before is None:
                return None
            self.html += items_before
            self.source += rest[: _line_offset(rest, tokens[last].map[0])]
        html = self.html + rendered + self.close
        if close == len(tokens) - 1:
            return html, 0, "", False
        # Blocks after the list: it has ended. They are rendered as in the whole tail
        # only from a final boundary on (one that text added cannot reach across).
        boundary = _last_final_boundary(tokens, rest)
        if boundary <= close:
            return None
        cut = _line_offset(rest, tokens[boundary].map[0])
        if boundary > close + 1:
            html += sanitize_html(md.renderer.render(tokens[close + 1 : boundary], md.options, env))
        tail_html = sanitize_html(md.renderer.render(tokens[boundary:], md.options, env))
        return tail_html, before + cut, html, _ends_with_paragraph(tokens)

    def _word_items(self, rest: str) -> list[str] | None:
        """The HTML items of ``rest`` when each of its lines is an item of words with the
        list's marker, unindented (None otherwise)."""
        items = []
        for line in rest.split("\n"):
            item = _WORDS_ITEM.fullmatch(line)
            if item is None or (item.group(1) or item.group(2)) != self.markup:
                return None
            items.append("<li>" + _SPAN.sub(_span_html, item.group(3).rstrip(" ")) + "</li>\n")
        return items


# A list item that interrupts a paragraph: a bullet, or the number 1, and content.
_INTERRUPTING_ITEM = re.compile(r" {0,3}(?:([-+*])|0{0,8}1([.)]))[ \t]+[^ \t\n]")


def _ends_with_paragraph(tokens: list) -> bool:
    return len(tokens) >= 3 and tokens[-3].type == "paragraph_open" and tokens[-3].level == 0


def _is_item(token) -> bool:
    return token.type == "list_item_open" and token.level == 1


def _tight(inner: list) -> bool:
    """Whether a list (its tokens inside) is tight, known from its items' paragraphs:
    a list with none shows no difference either way, so it cannot be told."""
    paragraphs = [t for t in inner if t.type == "paragraph_open" and t.level == 2]
    return bool(paragraphs) and all(t.hidden for t in paragraphs)


def _sanitize_items(items: str) -> str | None:
    """Sanitised list items, parsed in a list as they are in the whole HTML (None: the
    list did not stay one)."""
    clean = sanitize_html("<ul>" + items + "</ul>")
    if not (clean.startswith("<ul>") and clean.endswith("</ul>")):
        return None
    return clean[4:-5]


# Words (letters and digits) and spaces, and whole bold, italic or code spans of words
# standing apart from what is around them: nothing markdown or HTML could read another
# way, or that could change what came before.
# (Possessive quantifiers: each piece starts with a different kind of character, so the
# match is linear, never backtracking.)
_WORDS = r"[^\W_]++(?: ++[^\W_]++)*+"
_SPAN = re.compile(rf"\*\*({_WORDS})\*\*|\*({_WORDS})\*|`({_WORDS})`")
_WORDS_AND_SPANS = re.compile(rf"(?: ++|[^\W_]++|(?<![^ ])(?:{_SPAN.pattern})(?![^ ]))++")
_SPAN_TAGS = ("strong", "em", "code")
# A paragraph's first line of words that no text added can turn into anything else: it
# starts with a letter (not a digit, a marker or a space).
_PARAGRAPH_WORDS = re.compile(rf"(?=[^\W\d_])(?:{_WORDS_AND_SPANS.pattern})")

# An item of words (and whole spans of them, as _WORDS_AND_SPANS): a bullet or a number,
# then spaces (fewer than five: more would start indented code) and its words.
_WORDS_ITEM = re.compile(
    rf"(?:([-+*])|\d{{1,9}}([.)])) {{1,4}}(?! )((?:{_WORDS_AND_SPANS.pattern}))"
)


def _span_html(match: re.Match) -> str:
    index = next(i for i, group in enumerate(match.groups()) if group is not None)
    tag = _SPAN_TAGS[index]
    return f"<{tag}>{match.group(index + 1)}</{tag}>"


# A paragraph, list item or heading closing the last block, then its enclosing lists
# and quotes.
_BLOCK_END = re.compile(r"</(?:p|li|h[1-6])>\n?(?:</(?:li|ul|ol|blockquote)>\n?)*\Z")
_CLOSED_SPAN = re.compile(r"</(strong|em|code|del|s|a)>\Z")
_SPAN_CLOSERS = {"strong": "*_", "em": "*_", "code": "`", "del": "~", "s": "~", "a": ")]>"}


def _word_insertion_point(source: str, html: str) -> tuple[int, bool] | None:
    """Where words appended to ``source`` go in ``html``, and whether they must start
    with a space there (None: they must be rendered).

    Only where the block's text ends with the source's last word, or with an inline
    span (bold, code, a link) whose closing delimiter ends the source: then no
    delimiter, escape, entity or closing sequence is left open for the words to complete. After a span the words
    must start with a space: ``__bold__er`` is not bold.
    """
    end = source.rstrip(" ")
    match = _BLOCK_END.search(html) if end else None
    if match is None:
        return None
    before = html[: match.start()]
    if end[-1].isalnum() and before.endswith(end[-1]):
        return match.start(), False
    span = _CLOSED_SPAN.search(before)
    # ... and the source ends with that span's closing delimiter, not with a line of
    # its own after it (a setext underline, a line break).
    if span and end[-1] in _SPAN_CLOSERS[span.group(1)]:
        return match.start(), True
    return None


def _last_final_boundary(tokens, source: str) -> int:
    """Index of the token opening the last block that text added later cannot reach into.

    That is the last top-level block with a blank line before it: text appended to the
    source can turn its last block into something else (a paragraph growing into a
    lazy continuation of the list item above it, say), but never across a blank line.
    Except into a list: a block after a list whose first line may still become a list
    marker ("1" growing into "1. one") would join it as a new item and make the whole
    list loose, so it is not final yet.
    0 when there is no such block.
    """
    lines = source.split("\n")
    openers = [
        i for i, t in enumerate(tokens) if t.level == 0 and t.nesting >= 0 and t.map is not None
    ]
    for position in range(len(openers) - 1, 0, -1):
        start = tokens[openers[position]].map[0]
        if start == 0 or lines[start - 1].strip():
            continue
        after_list = tokens[openers[position - 1]].type in ("bullet_list_open", "ordered_list_open")
        if after_list and _MAY_BECOME_A_MARKER.fullmatch(lines[start]):
            continue
        return openers[position]
    return 0


# A first line that is still (only) the start of a list marker: digits, or a bullet alone.
_MAY_BECOME_A_MARKER = re.compile(r" {0,3}(?:\d{1,9}|[-+*])?")


def _line_offset(text: str, line: int) -> int:
    offset = 0
    for _ in range(line):
        offset = text.index("\n", offset) + 1
    return offset
