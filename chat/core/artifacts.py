"""Artifacts without Django: what a file is, a safe name to download it under, and the
substantial code blocks of a reply.

* :func:`detect_kind` looks at the content first (magic bytes, UTF-8, the markup it
  starts with) and uses the name only to tell code from markdown from text. A name
  never makes content an image, HTML or SVG on its own.
* :func:`safe_filename` turns any name (a model's path, an upload's name) into one a
  browser and the main file systems accept: no folders, no control characters, no
  reserved names, at most :data:`MAX_FILENAME_BYTES` bytes.
* :func:`extract_code_blocks` finds the fenced blocks of a written reply that are
  worth keeping: five lines or more, or named in their info string
  (```` ```python title=app.py ````).

Pure Python: no Django import here or anywhere under ``chat.core``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from enum import StrEnum

MAX_FILENAME_BYTES = 150
MIN_BLOCK_LINES = 5
TEXT_SNIFF_BYTES = 4096


class Kind(StrEnum):
    CODE = "code"
    MARKDOWN = "markdown"
    TEXT = "text"
    HTML = "html"
    SVG = "svg"
    IMAGE = "image"
    PDF = "pdf"
    BINARY = "binary"


TEXT_KINDS = frozenset({Kind.CODE, Kind.MARKDOWN, Kind.TEXT, Kind.HTML, Kind.SVG})
PREVIEW_KINDS = frozenset({Kind.HTML, Kind.SVG})


@dataclass(frozen=True, slots=True)
class Detected:
    kind: Kind
    language: str  # a Pygments lexer alias ("python", "markdown", "text"), "" for binary
    mime: str  # the Content-Type the server sends for it, whatever the name says


# Extension -> language (a Pygments alias). Only the name's last suffix counts.
LANGUAGES: dict[str, str] = {
    "py": "python",
    "pyi": "python",
    "js": "javascript",
    "mjs": "javascript",
    "cjs": "javascript",
    "ts": "typescript",
    "tsx": "tsx",
    "jsx": "jsx",
    "json": "json",
    "css": "css",
    "scss": "scss",
    "sh": "bash",
    "bash": "bash",
    "zsh": "bash",
    "rb": "ruby",
    "go": "go",
    "rs": "rust",
    "java": "java",
    "kt": "kotlin",
    "c": "c",
    "h": "c",
    "cpp": "cpp",
    "cc": "cpp",
    "hpp": "cpp",
    "cs": "csharp",
    "php": "php",
    "sql": "sql",
    "yaml": "yaml",
    "yml": "yaml",
    "toml": "toml",
    "ini": "ini",
    "cfg": "ini",
    "xml": "xml",
    "html": "html",
    "htm": "html",
    "svg": "xml",
    "swift": "swift",
    "r": "r",
    "lua": "lua",
    "pl": "perl",
    "hs": "haskell",
    "ex": "elixir",
    "exs": "elixir",
    "erl": "erlang",
    "scala": "scala",
    "dart": "dart",
    "vue": "html",
    "dockerfile": "docker",
    "makefile": "make",
    "mk": "make",
    "tex": "latex",
    "diff": "diff",
    "patch": "diff",
    "md": "markdown",
    "markdown": "markdown",
    "txt": "text",
    "csv": "text",
    "log": "text",
}
# Info-string language -> the extension an unnamed block is saved under.
EXTENSIONS: dict[str, str] = {
    "python": "py",
    "py": "py",
    "javascript": "js",
    "js": "js",
    "typescript": "ts",
    "ts": "ts",
    "json": "json",
    "bash": "sh",
    "sh": "sh",
    "shell": "sh",
    "console": "sh",
    "html": "html",
    "css": "css",
    "sql": "sql",
    "yaml": "yaml",
    "yml": "yaml",
    "toml": "toml",
    "rust": "rs",
    "go": "go",
    "java": "java",
    "c": "c",
    "cpp": "cpp",
    "c++": "cpp",
    "ruby": "rb",
    "php": "php",
    "markdown": "md",
    "md": "md",
    "xml": "xml",
    "svg": "svg",
    "diff": "diff",
    "text": "txt",
    "txt": "txt",
}

_IMAGE_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
_SVG_START = re.compile(
    rb"^\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*(?:<!DOCTYPE\s+svg[^>]*>\s*)?<svg[\s>]",
    re.I | re.S,
)
_HTML_START = re.compile(rb"^\s*(?:<!--.*?-->\s*)*<(?:!DOCTYPE\s+html|html[\s>])", re.I | re.S)
_HTML_TAGS = re.compile(rb"<(?:html|head|body|div|p|script|style|h1|table|span)[\s>]", re.I)


def extension(name: str) -> str:
    base = name.rsplit("/", 1)[-1].lower()
    if base in ("dockerfile", "makefile"):
        return base
    return base.rsplit(".", 1)[-1] if "." in base.strip(".") else ""


def image_mime(data: bytes) -> str | None:
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def is_text(data: bytes) -> bool:
    """UTF-8 without NUL bytes (a cut at the sniff limit may split a character)."""
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the end of a prefix is still text.
        return exc.start >= len(data) - 3 and exc.reason == "unexpected end of data"
    return True


def detect_kind(name: str, data: bytes, *, language_hint: str = "") -> Detected:
    """The kind, language and served type of ``data``, from its content first."""
    if (mime := image_mime(data)) is not None:
        return Detected(Kind.IMAGE, "", mime)
    if data.startswith(b"%PDF-"):
        return Detected(Kind.PDF, "", "application/pdf")
    head = data[:TEXT_SNIFF_BYTES]
    if not is_text(head if len(data) > TEXT_SNIFF_BYTES else data):
        return Detected(Kind.BINARY, "", "application/octet-stream")
    ext = extension(name)
    if _SVG_START.match(head):
        return Detected(Kind.SVG, "xml", "image/svg+xml")
    named_html = ext in ("html", "htm")
    if _HTML_START.match(head) or (named_html and _HTML_TAGS.search(head)):
        return Detected(Kind.HTML, "html", "text/html; charset=utf-8")
    language = LANGUAGES.get(ext, "")
    if language in ("", "text"):
        language = _language_alias(language_hint) or language
    if language == "markdown":
        return Detected(Kind.MARKDOWN, "markdown", "text/markdown; charset=utf-8")
    if language and language != "text":
        return Detected(Kind.CODE, language, "text/plain; charset=utf-8")
    return Detected(Kind.TEXT, "text", "text/plain; charset=utf-8")


def _language_alias(hint: str) -> str:
    hint = hint.strip().lower()
    if not hint:
        return ""
    ext = EXTENSIONS.get(hint)
    if ext is not None:
        return LANGUAGES.get(ext, hint)
    return hint if re.fullmatch(r"[a-z0-9+#-]{1,30}", hint) else ""


# --- safe names -------------------------------------------------------------------------------

_UNSAFE_CHARS = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_RESERVED = re.compile(r"^(?:con|prn|aux|nul|com[0-9]|lpt[0-9])(?:\..*)?$", re.I)


def safe_filename(name: str, *, fallback: str = "file") -> str:
    """A file name safe to send in ``Content-Disposition`` and to write anywhere.

    The last component of a path only; control and format characters go, characters
    Windows refuses become ``_``, leading dots and trailing dots or spaces go (no
    hidden files, no ``..``), reserved device names get a ``_`` in front, and a long
    name is cut to :data:`MAX_FILENAME_BYTES` bytes of UTF-8 keeping its extension.
    """
    name = unicodedata.normalize("NFC", str(name or ""))
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp"))
    name = _UNSAFE_CHARS.sub("_", name)
    name = " ".join(name.split())  # every run of white space one plain space
    name = name.lstrip(". ").rstrip(". ")
    if not name:
        return fallback
    if _RESERVED.match(name):
        name = f"_{name}"
    return _cut_name(name)


def _cut_name(name: str) -> str:
    if len(name.encode("utf-8")) <= MAX_FILENAME_BYTES:
        return name
    stem, dot, ext = name.rpartition(".")
    if not dot or len(ext) > 16 or not stem:
        stem, ext = name, ""
    suffix = f".{ext}" if ext else ""
    room = MAX_FILENAME_BYTES - len(suffix.encode("utf-8"))
    cut = stem.encode("utf-8")[:room].decode("utf-8", "ignore").rstrip(". ")
    return f"{cut or 'file'}{suffix}"


def safe_path(path: str, *, fallback: str = "file") -> str:
    """A relative path (for a zip entry) of safe components: no ``..``, no absolute path."""
    parts = [
        safe_filename(part, fallback="")
        for part in str(path or "").replace("\\", "/").split("/")
        if part not in ("", ".", "..")
    ]
    parts = [part for part in parts if part]
    return "/".join(parts) or fallback


# --- code blocks ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CodeBlock:
    content: str  # without the fences; ends with a newline when it has lines
    language: str  # the info string's language word, lower case ("" when none)
    name: str | None  # the file name the info string gives, if any
    index: int  # the block's position among the reply's fenced blocks

    @property
    def lines(self) -> int:
        return len(self.content.splitlines())

    def default_name(self, prefix: str) -> str:
        """A name for an unnamed block: ``<prefix>.<extension of its language>``."""
        ext = EXTENSIONS.get(self.language, "") or (
            self.language if re.fullmatch(r"[a-z0-9]{1,8}", self.language) else "txt"
        )
        return f"{prefix}.{ext}"


_FENCE_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_NAME_ATTR = re.compile(
    r"""(?:^|\s)(?:title|file|filename|name|path)\s*=\s*(?:"([^"]*)"|'([^']*)'|(\S+))""", re.I
)
_FILE_WORD = re.compile(r"^[\w][\w.+-]*(?:/[\w.+-]+)*\.[A-Za-z0-9]{1,10}$")


def parse_info(info: str) -> tuple[str, str | None]:
    """(language, file name) from a fence's info string.

    Accepted: ``python``, ``python title=app.py``, ``python file="src/app.py"``,
    ``python:app.py``, ``app.py`` and ``python app.py``.
    """
    info = info.strip()
    if not info:
        return "", None
    name: str | None = None
    attr = _NAME_ATTR.search(info)
    if attr:
        name = next(g for g in attr.groups() if g is not None).strip() or None
        info = (info[: attr.start()] + " " + info[attr.end() :]).strip()
    words = info.split()
    language = ""
    if words:
        first = words[0]
        if ":" in first and name is None:
            first, _, maybe = first.partition(":")
            if _FILE_WORD.match(maybe):
                name = maybe
        if _FILE_WORD.match(first) and name is None and len(words) == 1:
            name = first
            language = LANGUAGES.get(extension(first), "")
        elif "=" not in first:
            language = first.lower()
        if name is None and len(words) > 1 and _FILE_WORD.match(words[1]):
            name = words[1]
    return language[:30], name


def fenced_blocks(text: str) -> list[CodeBlock]:
    """Every fenced code block of ``text`` (CommonMark fences), in order.

    A fence left open runs to the end of the text, as CommonMark reads it.
    """
    blocks: list[CodeBlock] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opened = _FENCE_OPEN.match(lines[i])
        if opened is None or (opened["fence"][0] == "`" and "`" in opened["info"]):
            i += 1
            continue
        fence, indent = opened["fence"], len(opened["indent"])
        language, name = parse_info(opened["info"])
        body: list[str] = []
        i += 1
        while i < len(lines):
            line = lines[i]
            stripped = line.lstrip(" ")
            if (
                len(line) - len(stripped) <= 3
                and stripped.startswith(fence[0] * len(fence))
                and not stripped.rstrip().strip(fence[0])
            ):
                break
            body.append(_dedent(line, indent))
            i += 1
        if i >= len(lines) and body and not body[-1]:
            body.pop()  # an open fence at the end: the text's last line break is not content
        i += 1  # past the closing fence (or the end)
        content = "\n".join(body) + ("\n" if body else "")
        blocks.append(CodeBlock(content, language, name, len(blocks)))
    return blocks


def _dedent(line: str, indent: int) -> str:
    removable = len(line) - len(line.lstrip(" "))
    return line[min(indent, removable) :]


def extract_code_blocks(text: str, *, min_lines: int = MIN_BLOCK_LINES) -> list[CodeBlock]:
    """The substantial fenced blocks of a reply, each once.

    Substantial: named in its info string, or ``min_lines`` lines or more. A block
    repeated in the reply (same content, no name) is kept once, where it first
    appears; a later block with the name of an earlier one replaces it (the last
    version is what the reply means).
    """
    chosen: dict[str, CodeBlock] = {}
    for block in fenced_blocks(text):
        if not block.content.strip():
            continue
        if block.name is None and block.lines < min_lines:
            continue
        if block.name is None:
            chosen.setdefault(f"content:{block.content}", block)
            continue
        key = f"name:{block.name}"
        chosen.pop(key, None)  # keep the latest, in the latest position
        chosen[key] = block
    return list(chosen.values())
