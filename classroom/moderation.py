"""Guardrails: the rule list that flags a student's message or a persona's reply.

Pure functions over text (the class's settings passed in): which categories are on,
and the teacher's own words. A hit is a :class:`Hit` (category, severity, reason);
the actions turn hits into ``Flag`` rows. Rules are deliberately simple, whole-word
and case-insensitive: they point the teacher at a message, they judge nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from classroom.models import Flag, FlagCategory

LOW, MEDIUM, HIGH = Flag.Severity.LOW, Flag.Severity.MEDIUM, Flag.Severity.HIGH
WORDS_MAX = 200


def _words(*words: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(words) + r")\b", re.I)


RULES: list[tuple[str, int, str, re.Pattern[str]]] = [
    (
        FlagCategory.SELF_HARM,
        HIGH,
        "possible self-harm",
        _words(
            r"kill myself",
            r"end my life",
            r"hurt myself",
            r"self[- ]harm",
            r"suicid\w*",
            r"want to die",
            r"cut myself",
        ),
    ),
    (
        FlagCategory.VIOLENCE,
        MEDIUM,
        "violence",
        _words(
            r"kill (?:him|her|them|you|everyone)",
            r"shoot\w*",
            r"stab\w*",
            r"beat (?:him|her|them|you) up",
            r"bomb\w*",
            r"weapons?",
            r"gun",
        ),
    ),
    (
        FlagCategory.BULLYING,
        MEDIUM,
        "bullying",
        _words(
            r"you(?:'re| are) (?:stupid|ugly|dumb|worthless|a loser)",
            r"nobody likes you",
            r"loser",
            r"idiot",
            r"shut up",
            r"go away and die",
        ),
    ),
]
EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
PHONE = re.compile(r"(?<![\w+.])(?:\+?\d[\d ().-]{7,}\d)(?!\w)")
ADDRESS = re.compile(
    r"\b\d{1,5}\s+(?:[A-Z][\w'-]*\s+){1,4}"
    r"(?:street|st|road|rd|avenue|ave|lane|ln|drive|dr|boulevard|blvd|way|place|court)\b",
    re.I,
)


@dataclass(frozen=True)
class Hit:
    category: str
    severity: int
    reason: str


def teacher_words(raw: str) -> list[str]:
    words = [" ".join(w.split()) for w in re.split(r"[\n,]", raw or "")]
    return [w for w in words if w][:WORDS_MAX]


def check(text: str, categories: list[str], words: list[str]) -> list[Hit]:
    """The hits of ``text`` (at most one per category), the most severe first."""
    on = set(categories)
    hits: list[Hit] = []
    for category, severity, reason, pattern in RULES:
        if category in on and (match := pattern.search(text)):
            hits.append(Hit(category, severity, f"{reason}: “{match.group(0)}”"))
    if FlagCategory.PERSONAL_DATA in on:
        for what, pattern in (("an email address", EMAIL), ("a phone number", PHONE)):
            if pattern.search(text):
                hits.append(Hit(FlagCategory.PERSONAL_DATA, MEDIUM, f"personal data: {what}"))
                break
        else:
            if ADDRESS.search(text):
                hits.append(Hit(FlagCategory.PERSONAL_DATA, MEDIUM, "personal data: an address"))
    if FlagCategory.TEACHER_WORDS in on and words:
        mine = _words(*(re.escape(w) for w in words)).search(text)
        if mine:
            hits.append(Hit(FlagCategory.TEACHER_WORDS, MEDIUM, f"your word “{mine.group(0)}”"))
    return sorted(hits, key=lambda h: -h.severity)
