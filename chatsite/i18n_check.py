"""Every string of the interface has a Simplified Chinese translation: ``make i18n-check``.

Extracts the messages of the project as ``make messages`` would (Django's
``makemessages``, GNU xgettext underneath), but in a temporary copy, so the committed
catalog is never touched, and reports, as ``file:line: msgid``:

* every message with no Chinese translation (new, untranslated or fuzzy), and
* a compiled catalog (``.mo``) that does not match its ``.po``.

Run it as ``python -m chatsite.i18n_check``; it exits 1 when anything is missing.
``make messages`` then brings the catalog up to date; translate the empty ``msgstr``
lines of ``locale/zh_Hans/LC_MESSAGES/django.po`` and run ``make messages`` again.
"""

from __future__ import annotations

import gettext
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE = "zh_Hans"
# What holds the project's strings (Python and templates); a copy of it is extracted.
SOURCES = ("chat", "classroom", "chatsite", "templates", "manage.py")
# Passed to makemessages by `make messages` too (see the Makefile).
IGNORE = ("*/migrations/*", "*/management/*")


@dataclass(frozen=True)
class Missing:
    where: str  # "file:line" of the first place the text is used
    msgid: str
    why: str  # "untranslated", "fuzzy" or "stale .mo"

    def __str__(self) -> str:
        return f"{self.where}: {self.why}: {self.msgid!r}"


def catalog_path(root: Path = ROOT, domain: str = "django") -> Path:
    return root / "locale" / LANGUAGE / "LC_MESSAGES" / f"{domain}.po"


def makemessages_args(*, location: str) -> list[str]:
    args = ["makemessages", "-l", LANGUAGE, "--no-obsolete", f"--add-location={location}"]
    return args + [f"--ignore={pattern}" for pattern in IGNORE]


def extract(root: Path = ROOT) -> Path:
    """The project's catalog merged with every message the sources use now, in a
    temporary copy (with line numbers); the caller removes its folder."""
    work = Path(tempfile.mkdtemp(prefix="lyceum-i18n-"))
    for name in SOURCES:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, work / name)
    if (root / "locale").exists():
        shutil.copytree(root / "locale", work / "locale")
    subprocess.run(
        [sys.executable, "manage.py", *makemessages_args(location="full")],
        cwd=work,
        check=True,
        capture_output=True,
        env=_env(),
    )
    return work


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("DEBUG", "1")  # settings start without a SECRET_KEY
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


_ENTRY = re.compile(r"\n\n")
_FIELD = re.compile(r'^(msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?) ((?:".*"\n?)+)', re.M)
_UNESCAPE = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _text(quoted: str) -> str:
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', quoted)
    return re.sub(r"\\(.)", lambda m: _UNESCAPE.get(m.group(1), m.group(1)), "".join(parts))


@dataclass
class Entry:
    msgid: str
    msgstrs: list[str]
    fuzzy: bool
    where: str


def read_po(path: Path) -> list[Entry]:
    entries = []
    for block in _ENTRY.split(path.read_text(encoding="utf-8")):
        fields = {name: _text(value) for name, value in _FIELD.findall(block + "\n")}
        if not fields.get("msgid"):
            continue  # the header
        comments = [line for line in block.splitlines() if line.startswith("#")]
        locations = [c[3:].split()[0] for c in comments if c.startswith("#: ")]
        entries.append(
            Entry(
                msgid=fields["msgid"],
                msgstrs=[v for k, v in fields.items() if k.startswith("msgstr")],
                fuzzy=any(c.startswith("#,") and "fuzzy" in c for c in comments),
                where=locations[0] if locations else str(path),
            )
        )
    return entries


def untranslated(po: Path) -> list[Missing]:
    found = []
    for entry in read_po(po):
        if entry.fuzzy:
            found.append(Missing(entry.where, entry.msgid, "fuzzy"))
        elif not entry.msgstrs or not all(entry.msgstrs):
            found.append(Missing(entry.where, entry.msgid, "untranslated"))
    return found


def stale_mo(po: Path) -> list[Missing]:
    """Messages whose compiled translation differs from the ``.po`` (or no ``.mo``)."""
    mo = po.with_suffix(".mo")
    if not mo.exists():
        return [Missing(str(mo.relative_to(ROOT) if mo.is_relative_to(ROOT) else mo), "", "no .mo")]
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "fresh.mo"
        subprocess.run(["msgfmt", "--check-format", "-o", str(fresh), str(po)], check=True)
        want = _catalog(fresh)
    have = _catalog(mo)
    where = str(po.relative_to(ROOT)) if po.is_relative_to(ROOT) else str(po)
    keys = sorted({k for k in (*want, *have) if k}, key=str)
    return [Missing(where, str(k), "stale .mo") for k in keys if want.get(k) != have.get(k)]


def _catalog(mo: Path) -> dict:
    with mo.open("rb") as handle:
        return dict(gettext.GNUTranslations(handle)._catalog)  # type: ignore[attr-defined]


def check(root: Path = ROOT) -> list[Missing]:
    work = extract(root)
    try:
        missing = untranslated(catalog_path(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if catalog_path(root).exists():
        missing += stale_mo(catalog_path(root))
    return missing


def main() -> int:
    if shutil.which("msgfmt") is None or shutil.which("xgettext") is None:
        print("GNU gettext is missing: `make gettext` (or apt-get install gettext).")
        return 2
    missing = check()
    for item in missing:
        print(item)
    if missing:
        print(
            f"\n{len(missing)} message(s) without a Simplified Chinese translation. Run "
            "`make messages`, translate the empty msgstr lines of "
            f"{catalog_path().relative_to(ROOT)}, then `make messages` again."
        )
        return 1
    print("Every message has a Simplified Chinese translation.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
