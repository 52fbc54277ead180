"""The translation check of `make test` (chatsite/i18n_check.py): it passes on the project
and names, by file and line, a string with no Chinese translation, a fuzzy one, and a
compiled catalog older than its .po."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from chatsite import i18n_check
from chatsite.i18n_check import LANGUAGE, SOURCES, check


def _copy_project(to: Path) -> Path:
    for name in (*SOURCES, "locale"):
        source = i18n_check.ROOT / name
        if source.is_dir():
            shutil.copytree(source, to / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, to / name)
    return to


def _po(root: Path) -> Path:
    return root / "locale" / LANGUAGE / "LC_MESSAGES" / "django.po"


def test_every_string_of_the_interface_has_a_chinese_translation():
    assert [str(m) for m in check()] == []


def test_a_new_untranslated_string_is_listed_with_its_place(tmp_path):
    root = _copy_project(tmp_path)
    (root / "templates" / "brand_new.html").write_text(
        '{% load i18n %}<p>\n{% translate "A sentence nobody translated yet" %}</p>\n'
    )
    missing = check(root)
    assert [(m.where, m.msgid, m.why) for m in missing] == [
        ("templates/brand_new.html:2", "A sentence nobody translated yet", "untranslated")
    ]
    assert str(missing[0]).startswith("templates/brand_new.html:2: untranslated:")


def test_a_fuzzy_translation_counts_as_missing(tmp_path):
    root = _copy_project(tmp_path)
    po = _po(root)
    text = po.read_text(encoding="utf-8")
    marked = text.replace('msgid "Start a chat"', '#, fuzzy\nmsgid "Start a chat"', 1)
    assert marked != text
    po.write_text(marked, encoding="utf-8")
    found = [(m.msgid, m.why) for m in check(root)]
    assert ("Start a chat", "fuzzy") in found


def test_a_translation_left_out_of_the_mo_is_listed(tmp_path):
    root = _copy_project(tmp_path)
    po = _po(root)
    text = po.read_text(encoding="utf-8")
    changed = text.replace('msgstr "开始对话"', 'msgstr "开始聊天"', 1)
    assert changed != text
    po.write_text(changed, encoding="utf-8")  # the .mo is not compiled again
    assert [(m.msgid, m.why) for m in check(root)] == [("Start a chat", "stale .mo")]
    subprocess.run(["msgfmt", "-o", str(po.with_suffix(".mo")), str(po)], check=True)
    assert check(root) == []


@pytest.mark.parametrize("domain", ["django"])
def test_the_committed_catalog_compiles_cleanly(domain):
    po = i18n_check.catalog_path(domain=domain)
    result = subprocess.run(
        ["msgfmt", "--check", "-o", "/dev/null", str(po)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
