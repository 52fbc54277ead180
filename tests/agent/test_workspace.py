"""The per-chat workspace: path confinement, size limits, and file operations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chat.agent.workspace import EditResult, FileEntry, Workspace, WorkspaceError, WriteResult


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path / "chat-1")


# --- confinement --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("..", "'..' is not allowed"),
        ("../secret", "'..' is not allowed"),
        ("../../etc/passwd", "'..' is not allowed"),
        ("a/../../b", "'..' is not allowed"),
        ("a/b/../c", "'..' is not allowed"),
        ("/etc/passwd", "Absolute paths are not allowed"),
        ("//server/share", "Absolute paths are not allowed"),
        ("notes\x00.md", "NUL byte"),
        ("notes\n.md", "control characters"),
        ("a\tb", "control characters"),
        ("a\x7fb", "control characters"),
        ("..\\..\\x", "Backslashes are not allowed"),
        ("a\\b.txt", "Backslashes are not allowed"),
        ("C:\\x", "Backslashes"),
        ("C:/Windows/x", "Drive letters are not allowed"),
        ("c:x", "Drive letters are not allowed"),
        ("x" * 256, "longer than 255 bytes"),
        ("é" * 128, "longer than 255 bytes"),  # 256 bytes in UTF-8
        ("/".join(["d" * 200] * 6), "longer than 1024 bytes"),
        (".", "does not name a file"),
        ("./", "does not name a file"),
    ],
)
def test_resolve_refuses_unsafe_paths(ws: Workspace, path: str, message: str) -> None:
    with pytest.raises(WorkspaceError, match=message):
        ws.resolve(path)
    with pytest.raises(WorkspaceError):
        ws.write(path, "x")
    assert not ws.root.exists()  # nothing was created, not even the root


def test_resolve_refuses_non_string(ws: Workspace) -> None:
    with pytest.raises(WorkspaceError, match="must be a string"):
        ws.resolve(None)  # type: ignore[arg-type]


def test_resolve_accepts_and_normalises_relative_paths(ws: Workspace) -> None:
    root = ws.root.resolve()
    assert ws.resolve("notes.md") == root / "notes.md"
    assert ws.resolve("./src//app.py") == root / "src" / "app.py"
    assert ws.resolve("x" * 255) == root / ("x" * 255)
    assert ws.resolve("...") == root / "..."  # just a name, not a parent reference
    assert ws.resolve("~/x") == root / "~" / "x"  # no home expansion


def test_symlink_escape_is_refused(tmp_path: Path, ws: Workspace) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    ws.root.mkdir()
    (ws.root / "link").symlink_to(outside, target_is_directory=True)
    (ws.root / "file-link").symlink_to(outside / "secret.txt")

    for path in ("link/secret.txt", "file-link", "link/new.txt"):
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            ws.resolve(path)
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        ws.read("file-link")
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        ws.write("link/new.txt", "pwned")
    assert not (outside / "new.txt").exists()
    assert (outside / "secret.txt").read_text() == "top secret"
    assert ws.list() == []  # symlinks are never listed


def test_symlink_inside_the_root_is_followed(ws: Workspace) -> None:
    ws.write("real/data.txt", "inside")
    (ws.root / "alias").symlink_to(ws.root / "real", target_is_directory=True)
    assert ws.read("alias/data.txt") == "inside"


def test_root_that_is_itself_a_symlink_works(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    real.mkdir()
    (tmp_path / "link-root").symlink_to(real, target_is_directory=True)
    ws = Workspace(tmp_path / "link-root")
    ws.write("a.txt", "ok")
    assert (real / "a.txt").read_text() == "ok"


# --- write --------------------------------------------------------------------------------


def test_root_is_created_lazily_on_first_write(ws: Workspace) -> None:
    assert not ws.root.exists()
    assert ws.list() == []
    assert not ws.root.exists()
    ws.write("a.txt", "hi")
    assert ws.root.is_dir()


def test_write_reports_created_then_overwrote(ws: Workspace) -> None:
    assert ws.write("docs/notes.md", "héllo") == WriteResult("docs/notes.md", 6, created=True)
    assert ws.write("docs/notes.md", "bye") == WriteResult("docs/notes.md", 3, created=False)
    assert (ws.root / "docs" / "notes.md").read_text(encoding="utf-8") == "bye"


def test_write_normalises_the_reported_path(ws: Workspace) -> None:
    assert ws.write("./a//b.txt", "x").path == "a/b.txt"


def test_write_size_limit(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "w", max_file_bytes=10)
    assert ws.write("ok.txt", "x" * 10).bytes_written == 10
    with pytest.raises(WorkspaceError, match="11 bytes; the limit is 10 bytes"):
        ws.write("big.txt", "x" * 11)
    with pytest.raises(WorkspaceError, match="limit is 10 bytes"):
        ws.write("multibyte.txt", "é" * 6)  # 12 bytes
    assert [entry.path for entry in ws.list()] == ["ok.txt"]


def test_default_limits() -> None:
    ws = Workspace("/nonexistent")
    assert (ws.max_file_bytes, ws.max_files) == (1024 * 1024, 500)


def test_file_count_limit_allows_overwrites(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "w", max_files=2)
    ws.write("a.txt", "1")
    ws.write("b/c.txt", "2")
    with pytest.raises(WorkspaceError, match="already holds 2 files"):
        ws.write("d.txt", "3")
    assert ws.write("a.txt", "overwrite is fine").created is False
    ws.edit("b/c.txt", "2", "two")
    assert ws.file_count() == 2


def test_write_refuses_directory_and_file_as_parent(ws: Workspace) -> None:
    ws.write("dir/a.txt", "x")
    with pytest.raises(WorkspaceError, match="is a directory"):
        ws.write("dir", "x")
    with pytest.raises(WorkspaceError, match="parent of it is a file"):
        ws.write("dir/a.txt/b.txt", "x")


def test_write_refuses_non_text(ws: Workspace) -> None:
    with pytest.raises(WorkspaceError, match="must be text"):
        ws.write("a.bin", b"bytes")  # type: ignore[arg-type]


# --- read ---------------------------------------------------------------------------------


def test_read_round_trips_unicode(ws: Workspace) -> None:
    text = "line 1\nκόσμε 🌍\n"
    ws.write("u.txt", text)
    assert ws.read("u.txt") == text


def test_read_missing_file_names_existing_ones(ws: Workspace) -> None:
    with pytest.raises(WorkspaceError, match="does not exist. The workspace is empty"):
        ws.read("nope.txt")
    ws.write("a.txt", "x")
    ws.write("b/c.txt", "y")
    with pytest.raises(
        WorkspaceError, match=r"'nope.txt' does not exist. Existing files: a.txt, b/c.txt"
    ):
        ws.read("nope.txt")


def test_read_refuses_directories_and_binary(ws: Workspace) -> None:
    ws.write("dir/a.txt", "x")
    with pytest.raises(WorkspaceError, match="is a directory"):
        ws.read("dir")
    (ws.root / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(WorkspaceError, match="not a UTF-8 text file"):
        ws.read("img.png")
    (ws.root / "nul.bin").write_bytes(b"abc\x00def")
    with pytest.raises(WorkspaceError, match="NUL bytes"):
        ws.read("nul.bin")


def test_read_refuses_oversized_file_put_there_by_someone_else(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "w", max_file_bytes=4)
    ws.root.mkdir()
    (ws.root / "big.txt").write_text("12345")
    with pytest.raises(WorkspaceError, match="larger than the 4-byte limit"):
        ws.read("big.txt")


# --- edit ---------------------------------------------------------------------------------


def test_edit_replaces_unique_occurrence(ws: Workspace) -> None:
    ws.write("a.py", "x = 1\ny = 2\n")
    assert ws.edit("a.py", "y = 2", "y = 3") == EditResult("a.py", 12)
    assert ws.read("a.py") == "x = 1\ny = 3\n"


def test_edit_not_found_changes_nothing(ws: Workspace) -> None:
    ws.write("a.py", "x = 1\n")
    with pytest.raises(WorkspaceError, match="was not found in 'a.py'"):
        ws.edit("a.py", "x=1", "x = 2")
    assert ws.read("a.py") == "x = 1\n"


def test_edit_ambiguous_match_changes_nothing(ws: Workspace) -> None:
    ws.write("a.txt", "ab ab ab")
    with pytest.raises(WorkspaceError, match="occurs 3 times in 'a.txt'; nothing was changed"):
        ws.edit("a.txt", "ab", "cd")
    assert ws.read("a.txt") == "ab ab ab"
    ws.edit("a.txt", "ab ab ab", "cd")
    assert ws.read("a.txt") == "cd"


def test_edit_refuses_empty_old_identical_and_missing_file(ws: Workspace) -> None:
    ws.write("a.txt", "abc")
    with pytest.raises(WorkspaceError, match="must not be empty"):
        ws.edit("a.txt", "", "x")
    with pytest.raises(WorkspaceError, match="identical"):
        ws.edit("a.txt", "b", "b")
    with pytest.raises(WorkspaceError, match="does not exist"):
        ws.edit("other.txt", "a", "b")
    with pytest.raises(WorkspaceError, match="'..' is not allowed"):
        ws.edit("../a.txt", "a", "b")


def test_edit_respects_size_limit(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "w", max_file_bytes=5)
    ws.write("a.txt", "abc")
    with pytest.raises(WorkspaceError, match="limit is 5 bytes"):
        ws.edit("a.txt", "b", "bbbbb")
    assert ws.read("a.txt") == "abc"


# --- list ---------------------------------------------------------------------------------


def test_list_is_sorted_with_sizes(ws: Workspace) -> None:
    ws.write("b.txt", "bb")
    ws.write("a/z.txt", "z")
    ws.write("a/b/c.txt", "ccc")
    ws.write("é.txt", "é")
    assert ws.list() == [
        FileEntry("a/b/c.txt", 3),
        FileEntry("a/z.txt", 1),
        FileEntry("b.txt", 2),
        FileEntry("é.txt", 2),
    ]
    path, size = ws.list()[0]  # plain tuples for callers that unpack
    assert (path, size) == ("a/b/c.txt", 3)


def test_list_skips_directories_and_fifo(ws: Workspace) -> None:
    ws.write("a.txt", "x")
    (ws.root / "empty-dir").mkdir()
    os.mkfifo(ws.root / "pipe")
    assert ws.list() == [FileEntry("a.txt", 1)]
