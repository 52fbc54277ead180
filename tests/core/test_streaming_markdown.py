"""The streamed reply's markdown: rendered block by block, always as the whole text renders."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from chat.presentation import markdown
from chat.presentation.markdown import StreamingMarkdown, render_markdown_uncached
from tests.fakeopenai import bench_script

# Lines that start, continue and end every kind of block the renderer knows. Link
# reference definitions are left out: one defined after its use is the documented case
# where the streamed preview differs (the written message is rendered whole).
LINES = [
    "plain words here", "more *em* and **strong** text", "a `code` span", "~~gone~~ text",
    "", "", "", "- item", "- other item", "* star item", "+ plus item", "1. one", "2) two",
    "10. ten", "  indented continuation", "    indented code", "```py", "```", "~~~", "x = 1",
    "> quoted", "> > nested", "# Heading", "## Sub *heading*", "---", "===", "***",
    "| a | b |", "|---|:-:|", "| 1 | 2 |", "<b>raw html</b>", "<script>alert(1)</script>",
    "[link](http://example.com)", "![img](http://example.com/x.png)", "trailing two  ",
    "back\\\\slash", "&amp; &copy; entities", "3 < 4 > 2",
]  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lines=st.lists(st.sampled_from(LINES), max_size=30),
    steps=st.lists(st.integers(min_value=1, max_value=60), max_size=40),
    final_newline=st.booleans(),
)
# A link, then a line "-" (a setext underline) that grows into a list item.
@example(lines=["[link](http://example.com)", "- item"], steps=[1, 27, 2], final_newline=False)
def test_every_prefix_renders_as_the_whole_text_would(lines, steps, final_newline):
    assert_every_prefix_renders_whole(lines, steps, final_newline)


def assert_every_prefix_renders_whole(lines: list[str], steps: list[int], final_newline: bool):
    """The lines streamed in pieces of ``steps`` characters: each snapshot's HTML is what
    rendering that prefix whole gives."""
    text = "\n".join(lines) + ("\n" if final_newline else "")
    stream = StreamingMarkdown()
    end = 0
    for step in steps:
        end = min(len(text), end + step)
        assert stream.render(text[:end]) == render_markdown_uncached(text[:end])
    assert stream.render(text) == render_markdown_uncached(text)


def test_finished_blocks_are_not_rendered_again(monkeypatch):
    paragraphs = [f"Paragraph {n} with **bold** words and `code`." for n in range(50)]
    stream = StreamingMarkdown()
    text = ""
    for paragraph in paragraphs:
        text += paragraph + "\n\n"
        stream.render(text)
    sanitized: list[str] = []
    real = markdown.sanitize_html
    monkeypatch.setattr(
        markdown, "sanitize_html", lambda html: sanitized.append(html) or real(html)
    )

    html = stream.render(text + "The last one grows")

    assert sum(len(part) for part in sanitized) < 200  # only the growing paragraph
    monkeypatch.undo()
    assert html == render_markdown_uncached(text + "The last one grows")


def test_a_text_that_is_not_a_continuation_starts_over():
    stream = StreamingMarkdown()
    stream.render("First reply.\n\nSecond paragraph")
    assert stream.render("Another reply") == render_markdown_uncached("Another reply")


def test_model_output_stays_sanitised_while_streaming():
    stream = StreamingMarkdown()
    text = "Hello\n\n<img src=x onerror=alert(1)>\n\n[x](javascript:alert(1))\n\n"
    html = ""
    for end in range(1, len(text) + 1):
        html = stream.render(text[:end])
    assert "<img" not in html and 'href="javascript' not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # shown as text


# Pieces a model streams: words (plain ones take the no-render path), spaces, and every
# piece of syntax that could turn words appended after it into something else.
PIECES = [
    "word", "more", "Ünïcode", "日本語", "42", "x1", " ", " ", " ", "  ", "\n", "\n\n",
    "- ", "* ", "1. ", "2) ", "# ", " #", "## ", "> ", "    ", "```", "~~~", "`", "**", "*",
    "_", "__", "~~", "[", "](", ")", "![", "<", ">", "&", "&amp", ";", "#", "\\", ".", ",",
    "|", "---", "===", "-", "=", "+", "\t", "\u00a0", "http://example.com",
    " **bold words**", "**bold**", " *it*", "*it*", " `code`", "`a b`", " **", "** ", " `",
]  # fmt: skip


@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    pieces=st.lists(st.sampled_from(PIECES + LINES + ["\n" + line for line in LINES]), max_size=60),
    cuts=st.lists(st.booleans(), min_size=60, max_size=60),
)
# Words after a line break that follows a bold span.
@example(
    pieces=["word", " **bold words**", "\n", "  indented continuation", "word"],
    cuts=[False, True, True, False, True] + [False] * 55,
)
def test_streamed_piece_by_piece_every_prefix_renders_as_the_whole_text(pieces, cuts):
    # Found this way: a list item whose last line grew from "---" (a rule, after the
    # list) into a lazy continuation of the item; a list item holding only code; words
    # appended after a span when the source had moved on to a new line since.
    stream = StreamingMarkdown()
    text = ""
    for piece, push in zip(pieces, cuts, strict=False):
        text += piece
        if push:
            assert stream.render(text) == render_markdown_uncached(text)
    assert stream.render(text) == render_markdown_uncached(text)


def test_words_and_whole_spans_after_a_word_are_appended_without_rendering(monkeypatch):
    stream = StreamingMarkdown()
    text = "Intro with **bold**.\n\n- item one"
    stream.render(text)
    parsed = _parses(monkeypatch)

    for word in [" and", " two", "  ", "three ", "**bold**", " `code`", " *it* ", "end"]:
        text += word
        html = stream.render(text)

    assert parsed == []
    monkeypatch.undo()
    assert html == render_markdown_uncached(text)
    assert stream.render(text + "*") == render_markdown_uncached(text + "*")  # syntax: rendered


# Lines of lists and of what may follow, end or interrupt one: markers of each kind, empty
# items, nested items and continuations, blank lines (a loose list), rules and setext
# underlines, table rows, pipes after a marker.
LIST_LINES = [
    "- item", "- two words", "- **bold** and `code`", "* star", "+ plus", "1. one", "1) one",
    "2. two", "3) three", "01. zero one", "-", "- ", "*", "- -", "- - -", "- |-", "-|-",
    "  - nested", "   - three spaces", "    - four spaces", "  continued", "lazy line",
    "para words", "a | b", "|---|---|", "| 1 | 2 |", "---", "===", "***", "", "", "",
    "> quote", "- > quoted item", "- ```", "  ```", "```", "  code in item", "# Heading",
    "- [x](http://example.com)", "- <b>raw</b>", "2. - mixed",
]  # fmt: skip


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    lines=st.lists(st.sampled_from(LIST_LINES), max_size=25),
    steps=st.lists(st.integers(min_value=1, max_value=25), max_size=60),
    final_newline=st.booleans(),
)
@example(lines=["- a", "- b", "", "- c"], steps=[4, 4, 1, 3], final_newline=False)
@example(lines=["para", "- a", "- b", "", "after"], steps=[7, 4, 9], final_newline=True)
@example(lines=["a | b", "- |-"], steps=[9, 1], final_newline=False)
def test_a_growing_list_renders_as_the_whole_text_would(lines, steps, final_newline):
    assert_every_prefix_renders_whole(lines, steps, final_newline)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10**6), every=st.integers(1, 8))
def test_the_benchmarks_markdown_replies_render_as_the_whole_text(seed, every):
    """The replies bench_streams streams (paragraphs interrupted by lists), in pushes of
    a few model tokens each."""
    rng = random.Random(seed)
    pieces = [
        piece.replace("{t}", str(1764600000000000 + rng.randrange(10**9)))
        for piece in bench_script(rng.randint(1, 160), markdown=True, stamp=True).tokens
    ]
    stream = StreamingMarkdown()
    text = ""
    for index, piece in enumerate(pieces, 1):
        text += piece
        if index % every == 0:
            assert stream.render(text) == render_markdown_uncached(text)
    assert stream.render(text) == render_markdown_uncached(text)


def test_a_list_growing_item_by_item_parses_only_its_last_item(monkeypatch):
    intro = "Steps, in order, with **bold** words and `code` for every one of them."
    text = intro + "\n" + "\n".join(f"- step {n} of the plan" for n in range(30))
    stream = StreamingMarkdown()
    stream.render(text)
    parsed = _parses(monkeypatch)

    for n in range(30, 35):
        text += f"\n- step {n}"
        html = stream.render(text)
    text += "\n\nAfter the list, a paragraph"
    html = stream.render(text)

    assert parsed and all(len(source) < 60 for source in parsed), parsed
    monkeypatch.undo()
    assert html == render_markdown_uncached(text)
    assert "<p>" not in html.split("<ul>")[1].split("</ul>")[0]  # still a tight list


def test_a_blank_line_between_items_makes_the_streamed_list_loose():
    stream = StreamingMarkdown()
    text = "Intro\n- one\n- two\n- three"
    assert stream.render(text) == render_markdown_uncached(text)
    for piece in ["\n", "\n", "- four", " more"]:
        text += piece
        assert stream.render(text) == render_markdown_uncached(text)
    assert "<li>\n<p>one</p>\n</li>" in stream.render(text)


def test_a_link_reference_in_a_list_applies_to_its_items_while_streaming():
    text = "Links:\n- [a]: http://example.com/one\n- see [a]\n- [a]: http://example.com/two\n- [a] again"
    stream = StreamingMarkdown()
    for end in range(1, len(text) + 1):
        assert stream.render(text[:end]) == render_markdown_uncached(text[:end])
    assert 'href="http://example.com/one"' in stream.render(text)


def test_new_items_of_words_are_appended_without_rendering(monkeypatch):
    stream = StreamingMarkdown()
    text = "Intro words\n- one\n- two"
    stream.render(text)
    parsed = _parses(monkeypatch)

    for piece in [" more", "\n- three **bold**", " and", "\n- four `code`", "\n- five"]:
        text += piece
        html = stream.render(text)

    assert parsed == []
    monkeypatch.undo()
    assert html == render_markdown_uncached(text)
    for piece in ["\n  - nested", "\n- six", "\n\n- loose now", "\n1. other kind"]:
        text += piece  # syntax the fast path leaves to the renderer
        assert stream.render(text) == render_markdown_uncached(text)


def test_several_new_lines_in_one_push_are_appended_without_rendering(monkeypatch):
    """A push that brings more than one line (a fast model, short items): items of
    words, a paragraph's first items, and a list's end with the paragraph after it."""
    stream = StreamingMarkdown()
    text = "Intro words\n- one"
    stream.render(text)
    parsed = _parses(monkeypatch)

    pushes = [
        " more\n- two\n- three **bold**",  # words to the last item, then two new items
        "\n- four `code`\n- five",
        " end\n\nAfter the list",  # the list ends: a paragraph after it
        " more words\n- first **item**\n- second",  # a paragraph's first items
    ]
    shown = []
    for piece in pushes:
        text += piece
        shown.append((text, stream.render(text)))

    assert parsed == []
    monkeypatch.undo()
    for prefix, html in shown:
        assert html == render_markdown_uncached(prefix), prefix
    assert "<p>" not in html.split("<ul>")[1].split("</ul>")[0]  # still a tight list
    for piece in ["\n\n", "  indented", "\n\n1 digits first", "\n- item\n\n- loose"]:
        text += piece  # what the fast paths leave to the renderer
        assert stream.render(text) == render_markdown_uncached(text)


def _parses(monkeypatch) -> list[str]:
    """The sources the markdown parser is given from now on (until ``monkeypatch.undo``)."""
    parsed: list[str] = []
    md = markdown._markdown()
    real_parse = md.parse

    def counting(src, env=None):
        parsed.append(src)
        return real_parse(src, env)

    monkeypatch.setattr(md, "parse", counting)
    return parsed
