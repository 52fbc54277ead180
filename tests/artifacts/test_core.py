"""Pure artifact rules: kind detection, safe download names, code blocks of a reply."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from chat.core.artifacts import (
    MAX_FILENAME_BYTES,
    Kind,
    detect_kind,
    extract_code_blocks,
    parse_info,
    safe_filename,
    safe_path,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 20

# --- kind detection ---------------------------------------------------------------------


def test_kinds_come_from_the_content():
    assert detect_kind("app.py", b"print('hi')\n").kind == Kind.CODE
    assert detect_kind("app.py", b"print('hi')\n").language == "python"
    assert detect_kind("notes.md", b"# Notes\n").kind == Kind.MARKDOWN
    assert detect_kind("notes.txt", b"plain\n").kind == Kind.TEXT
    assert detect_kind("x", PNG) == detect_kind("photo.png", PNG)
    assert detect_kind("x", PNG).mime == "image/png"
    assert detect_kind("doc", b"%PDF-1.7\n...").kind == Kind.PDF
    assert detect_kind("page.html", b"<!doctype html><p>hi").kind == Kind.HTML
    assert detect_kind("anything.txt", b"<!DOCTYPE html><html><body>").kind == Kind.HTML
    assert detect_kind("pic.svg", b'<?xml version="1.0"?>\n<svg xmlns="x"></svg>').kind == Kind.SVG
    assert detect_kind("data.bin", b"\x00\x01\x02").kind == Kind.BINARY


def test_a_name_alone_never_makes_an_image_html_or_svg():
    assert detect_kind("evil.png", b"<script>alert(1)</script>").kind != Kind.IMAGE
    assert detect_kind("evil.png", b"<script>alert(1)</script>").mime.startswith("text/plain")
    assert detect_kind("evil.svg", b"just words").kind == Kind.CODE  # xml source, not an SVG
    assert detect_kind("evil.html", b"just words").kind == Kind.CODE
    assert detect_kind("evil.html", b"just words").mime.startswith("text/plain")
    # An image with a text name is still an image; binary named .txt is binary.
    assert detect_kind("notes.txt", PNG).kind == Kind.IMAGE
    assert detect_kind("notes.txt", b"\xff\xfe\x00\x00").kind == Kind.BINARY


def test_info_string_language_for_unnamed_content():
    detected = detect_kind("snippet-3-1.txt", b"fn main() {}\n", language_hint="rust")
    assert (detected.kind, detected.language) == (Kind.CODE, "rust")


@given(st.binary(max_size=300), st.text(max_size=40))
def test_detection_never_fails_and_serves_html_only_for_markup(data, name):
    detected = detect_kind(name, data)
    if detected.mime.startswith("text/html"):
        assert b"<" in data
    if detected.kind == Kind.IMAGE:
        assert detected.mime.startswith("image/") and detected.mime != "image/svg+xml"


# --- safe names --------------------------------------------------------------------------


def test_safe_names_for_downloads():
    assert safe_filename("notes.md") == "notes.md"
    assert safe_filename("../../etc/passwd") == "passwd"
    assert safe_filename("..\\..\\win.ini") == "win.ini"
    assert safe_filename("a\r\nContent-Type: text/html.txt") == "html.txt"
    assert safe_filename('quo"te;.txt') == "quo_te;.txt"
    assert safe_filename("..") == "file"
    assert safe_filename("") == "file"
    assert safe_filename(".htaccess") == "htaccess"
    assert safe_filename("CON.txt") == "_CON.txt"
    assert safe_filename("r\u202etxt.exe") == "rtxt.exe"  # no right-to-left override
    assert safe_filename("Ünïcode — ok.md") == "Ünïcode — ok.md"
    long = "é" * 300 + ".py"
    cut = safe_filename(long)
    assert cut.endswith(".py") and len(cut.encode()) <= MAX_FILENAME_BYTES


def test_safe_paths_for_zip_entries():
    assert safe_path("src/app.py") == "src/app.py"
    assert safe_path("../../etc/passwd") == "etc/passwd"
    assert safe_path("/abs/x") == "abs/x"
    assert safe_path("a/./b/../c") == "a/b/c"
    assert safe_path("") == "file"


@given(st.text(max_size=400))
def test_any_name_becomes_a_safe_one(name):
    safe = safe_filename(name)
    assert safe and "/" not in safe and "\\" not in safe
    assert len(safe.encode("utf-8")) <= MAX_FILENAME_BYTES
    assert not safe.startswith(".")
    assert not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in safe)
    assert not any(ch in safe for ch in '<>:"|?*')
    assert safe == unicodedata.normalize("NFC", safe)
    path = safe_path(name)
    assert ".." not in path.split("/") and not path.startswith("/")


# --- code blocks -------------------------------------------------------------------------

FIVE = "".join(f"line {i}\n" for i in range(5))


def test_substantial_blocks_only():
    text = f"Short:\n```python\nx = 1\n```\nLong:\n```python\n{FIVE}```\n"
    (block,) = extract_code_blocks(text)
    assert (block.language, block.name, block.content) == ("python", None, FIVE)
    assert block.default_name("snippet-7-2") == "snippet-7-2.py"


def test_named_blocks_count_whatever_their_length():
    for info in ("python title=app.py", 'python file="app.py"', "python:app.py", "app.py"):
        (block,) = extract_code_blocks(f"```{info}\nprint(1)\n```\n")
        assert block.name == "app.py", info
        assert block.content == "print(1)\n"
    assert parse_info("js title='src/a b.js'") == ("js", "src/a b.js")
    assert parse_info("python") == ("python", None)
    assert parse_info("") == ("", None)


def test_duplicates_are_kept_once_and_a_later_named_block_wins():
    text = (
        f"```python\n{FIVE}```\n\nagain:\n```python\n{FIVE}```\n"
        "```py title=a.py\nold\n```\n```py title=a.py\nnew\n```\n"
    )
    blocks = extract_code_blocks(text)
    assert [(b.name, b.content) for b in blocks] == [(None, FIVE), ("a.py", "new\n")]


def test_fences_follow_commonmark():
    text = "~~~~sh\n" + FIVE + "```\nstill inside\n~~~~\n"  # a shorter other fence is content
    (block,) = extract_code_blocks(text)
    assert block.content == FIVE + "```\nstill inside\n"
    open_at_end = f"```python\n{FIVE}"
    assert extract_code_blocks(open_at_end)[0].content == FIVE
    assert extract_code_blocks("``` not a fence ` here\n" + FIVE) == []


block_body = st.lists(
    st.text(alphabet="abcdefghij =()+:#\t", min_size=0, max_size=20), min_size=5, max_size=9
)


@given(
    st.lists(block_body, min_size=1, max_size=4),
    st.lists(st.integers(min_value=1, max_value=400), max_size=30),
)
def test_a_block_split_across_stream_chunks_is_found_once_in_the_final_text(bodies, cuts):
    text = "Here you go.\n\n"
    for body in bodies:
        text += "```python\n" + "\n".join(body) + "\n```\n\nAnd more.\n\n"
    # The stream delivers it in arbitrary chunks; the reply written is their join.
    chunks, start = [], 0
    for cut in sorted(set(cuts)):
        chunks.append(text[start:cut])
        start = cut
    chunks.append(text[start:])
    final = "".join(chunks)
    assert final == text
    found = extract_code_blocks(final)
    contents = ("\n".join(body) + "\n" for body in bodies)
    distinct = list(dict.fromkeys(c for c in contents if c.strip()))
    assert sorted(b.content for b in found) == sorted(distinct)
    assert len({b.content for b in found}) == len(found)
    # Any prefix (a snapshot mid-stream) never yields a block that is not in the end text
    # at the same place, except the one still open.
    for chunk_end in range(0, len(text), max(1, len(text) // 7)):
        partial = extract_code_blocks(text[:chunk_end])
        assert len(partial) <= len(fenced_count(text)) + 1


def fenced_count(text: str) -> list[int]:
    return [i for i, line in enumerate(text.split("\n")) if line.startswith("```python")]
