"""The direction of imports that docs/architecture.md states, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(package: str) -> dict[str, set[str]]:
    """Every module a package's files import (absolute names), by file."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)  # and what it names: `from chat import store`
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path} imports {name}"
        for path, names in imports_of(package).items()
        for name in sorted(names)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("chat.core", ("django", "channels", "chat.llm", "chat.agent", "chat.models", "httpx")),
        ("chat.llm", ("django", "channels", "chat.agent", "chat.models")),
        ("chat.agent", ("django", "channels", "chat.models", "chat.runhost", "chat.live")),
        ("chat", ("classroom",)),
        ("chat.runhost", ("chat.actions",)),
        ("chat.presentation", ("chat.runhost", "chat.actions")),
    ],
)
def test_imports_go_one_way(package: str, forbidden: tuple[str, ...]):
    assert offenders(package, forbidden) == []


def test_the_check_sees_an_import_it_forbids():
    assert offenders("chat.runhost", ("chat.store",))  # runhost does use the store
