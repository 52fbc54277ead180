"""The files of a chat that the agent's file tools read and write.

:class:`WorkspaceFiles` is what the tools need (read, write, edit, list); the run host
side chooses the implementation. On the Django side it is the chat's artifacts
(``chat.artifacts.ArtifactWorkspace``: every write a new version, seen by every
process). :class:`Workspace` here is a plain directory, for the loop outside Django
(tests, benchmarks).

Every path the model sends is untrusted. ``Workspace.resolve`` is the single gate: it
turns a model-supplied relative path into a real path under the root or raises
:class:`WorkspaceError` with a message the model can act on. Nothing else in this
module touches the file system with a path that did not come out of ``resolve``.

Pure Python: no Django here (the Django side chooses the root, e.g.
``settings.LYCEUM_WORKSPACE_ROOT / <chat id>``).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

DEFAULT_MAX_FILE_BYTES = 1024 * 1024
DEFAULT_MAX_FILES = 500
MAX_COMPONENT_BYTES = 255  # the usual file-system limit for one name
MAX_PATH_BYTES = 1024

# "C:", "c:\\x", "C:/x": refused even on POSIX so a name never means something else when
# the files are downloaded or unzipped on Windows.
_DRIVE_PREFIX = re.compile(r"^[A-Za-z]:")


class WorkspaceError(Exception):
    """A refused path or a failed file operation, worded for the model to fix its call."""


class FileEntry(NamedTuple):
    path: str  # relative to the workspace root, with forward slashes
    size: int  # bytes


@dataclass(frozen=True, slots=True)
class WriteResult:
    path: str
    bytes_written: int
    created: bool  # False when an existing file was overwritten


@dataclass(frozen=True, slots=True)
class EditResult:
    path: str
    bytes_written: int  # the size of the file after the edit


class WorkspaceFiles(Protocol):
    """What the file tools use. Every method raises :class:`WorkspaceError` with a
    message for the model when it cannot do what was asked. Methods are synchronous:
    tools run them in a worker thread, never on the event loop."""

    def read(self, path: str) -> str: ...

    def write(self, path: str, content: str) -> WriteResult: ...

    def edit(self, path: str, old: str, new: str) -> EditResult: ...

    def list(self) -> list[FileEntry]: ...


def normalize_path(path: str) -> str:
    """A model-supplied relative path checked and normalised (``a//./b`` → ``a/b``)."""
    return "/".join(_split_relative_path(path))


def replace_once(text: str, path: str, old: str, new: str) -> str:
    """``text`` with the one occurrence of ``old`` replaced, or a WorkspaceError."""
    if not old:
        raise WorkspaceError("The text to replace ('old') must not be empty.")
    if old == new:
        raise WorkspaceError("'old' and 'new' are identical; nothing to change.")
    count = text.count(old)
    if count == 0:
        raise WorkspaceError(
            f"The text to replace was not found in {path!r}. It must match exactly, "
            "including whitespace and line breaks; read the file first."
        )
    if count > 1:
        raise WorkspaceError(
            f"The text to replace occurs {count} times in {path!r}; nothing was changed. "
            "Include more surrounding text so it matches exactly once."
        )
    return text.replace(old, new, 1)


def decode_text(path: str, data: bytes) -> str:
    """The text of a file's bytes, or a WorkspaceError saying it is not text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkspaceError(f"{path!r} is not a UTF-8 text file (binary content).") from None
    if "\x00" in text:
        raise WorkspaceError(f"{path!r} is not a text file (it contains NUL bytes).")
    return text


class Workspace:
    """Files of one chat, confined to ``root``. The root is created on the first write."""

    def __init__(
        self,
        root: Path | str,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_files: int = DEFAULT_MAX_FILES,
    ) -> None:
        self.root = Path(root)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    # --- path confinement -------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """Map a model-supplied relative path to a real path inside the root, or raise."""
        parts = _split_relative_path(path)
        real_root = self.root.resolve()
        candidate = real_root.joinpath(*parts).resolve()
        # Catches symlinks (placed by anything other than the agent) pointing outside.
        if not candidate.is_relative_to(real_root) or candidate == real_root:
            raise WorkspaceError(f"Path {path!r} leads outside the workspace.")
        return candidate

    def relative(self, real_path: Path) -> str:
        return real_path.relative_to(self.root.resolve()).as_posix()

    # --- file operations --------------------------------------------------------------

    def write(self, path: str, content: str) -> WriteResult:
        """Create or overwrite a UTF-8 text file; parent directories are created."""
        if not isinstance(content, str):
            raise WorkspaceError("File content must be text.")
        data = content.encode("utf-8")
        self._check_size(path, len(data))
        target = self.resolve(path)
        if target.is_dir():
            raise WorkspaceError(f"{path!r} is a directory, not a file.")
        created = not target.exists()
        if created and self.file_count() >= self.max_files:
            raise WorkspaceError(
                f"The workspace already holds {self.max_files} files, the maximum. "
                "Overwrite or edit an existing file instead."
            )
        self._make_parents(path, target)
        _write_bytes(target, data)
        return WriteResult(path=self.relative(target), bytes_written=len(data), created=created)

    def read(self, path: str) -> str:
        """The text of a UTF-8 file."""
        target = self._existing_file(path)
        size = target.stat().st_size
        if size > self.max_file_bytes:
            raise WorkspaceError(
                f"{path!r} is {size} bytes, larger than the {self.max_file_bytes}-byte limit."
            )
        return decode_text(path, target.read_bytes())

    def edit(self, path: str, old: str, new: str) -> EditResult:
        """Replace the one exact occurrence of ``old`` with ``new``.

        ``old`` must occur exactly once: when it is missing, or present more than once,
        nothing is changed and the error says which, so the model can add surrounding
        text to make the match unique. An empty ``old`` is refused.
        """
        if not old:
            raise WorkspaceError("The text to replace ('old') must not be empty.")
        if old == new:
            raise WorkspaceError("'old' and 'new' are identical; nothing to change.")
        result = self.write(path, replace_once(self.read(path), path, old, new))
        return EditResult(path=result.path, bytes_written=result.bytes_written)

    def list(self) -> list[FileEntry]:
        """Every regular file under the root, sorted by path. Symlinks are not listed."""
        return sorted(self._iter_files())

    def file_count(self) -> int:
        return sum(1 for _ in self._iter_files())

    # --- helpers ----------------------------------------------------------------------

    def _iter_files(self) -> Iterator[FileEntry]:
        real_root = self.root.resolve()
        if not real_root.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(real_root, followlinks=False):
            dirnames.sort()
            base = Path(dirpath)
            for name in filenames:
                full = base / name
                if full.is_symlink() or not full.is_file():
                    continue
                rel = full.relative_to(real_root).as_posix()
                yield FileEntry(rel, full.stat().st_size)

    def _existing_file(self, path: str) -> Path:
        target = self.resolve(path)
        if target.is_dir():
            raise WorkspaceError(f"{path!r} is a directory, not a file.")
        if not target.is_file():
            raise WorkspaceError(f"File {path!r} does not exist. {self._existing_names_hint()}")
        return target

    def _existing_names_hint(self, limit: int = 20) -> str:
        names = [entry.path for entry in self.list()]
        if not names:
            return "The workspace is empty."
        shown = ", ".join(names[:limit])
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        return f"Existing files: {shown}{more}."

    def _check_size(self, path: str, size: int) -> None:
        if size > self.max_file_bytes:
            raise WorkspaceError(
                f"Content for {path!r} is {size} bytes; the limit is "
                f"{self.max_file_bytes} bytes per file."
            )

    def _make_parents(self, path: str, target: Path) -> None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WorkspaceError(
                f"Cannot create {path!r}: a parent of it is a file, not a directory."
            ) from None


def _split_relative_path(path: str) -> list[str]:
    """Validate a relative path and return its components ('.' and empty ones dropped)."""
    if not isinstance(path, str):
        raise WorkspaceError("The path must be a string.")
    if not path.strip():
        raise WorkspaceError("The path is empty; give a relative file name such as 'notes.md'.")
    if "\x00" in path:
        raise WorkspaceError("The path contains a NUL byte.")
    if any(unicodedata.category(ch) == "Cc" for ch in path):
        raise WorkspaceError("The path contains control characters (e.g. a line break or tab).")
    if "\\" in path:
        raise WorkspaceError("Backslashes are not allowed in paths; use '/' between folders.")
    if _DRIVE_PREFIX.match(path):
        raise WorkspaceError(
            "Drive letters are not allowed; give a path relative to the workspace."
        )
    if path.startswith("/"):
        raise WorkspaceError(
            "Absolute paths are not allowed; give a path relative to the workspace."
        )
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise WorkspaceError(f"The path is longer than {MAX_PATH_BYTES} bytes.")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        raise WorkspaceError(f"{path!r} does not name a file.")
    for part in parts:
        if part == "..":
            raise WorkspaceError("'..' is not allowed in workspace paths.")
        if len(part.encode("utf-8")) > MAX_COMPONENT_BYTES:
            raise WorkspaceError(f"A name in the path is longer than {MAX_COMPONENT_BYTES} bytes.")
    return parts


def _write_bytes(target: Path, data: bytes) -> None:
    # O_NOFOLLOW: never write through a symlink swapped in after resolve() checked the path.
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags, 0o644)
    except OSError as exc:
        raise WorkspaceError(f"Cannot write {target.name!r}: {exc.strerror}.") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
