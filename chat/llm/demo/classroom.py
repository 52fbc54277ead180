"""The demo model's classroom mode: one reply spoken by one to three personas.

It triggers when the system prompt lists a cast (``chat.core.voices.CAST_HEADER``),
and answers with ``<Name>…</Name>`` segments that name the current scene (the line
starting with :data:`SCENE_TITLE_PREFIX`, which the classroom writes into its prompt).
Deterministic: who speaks depends only on what the student typed (whole words,
case-insensitive; the first row that matches wins):

| the student types | who answers |
| --- | --- |
| `unparseable` | plain text with no tags (the parser falls back to the AI teacher) |
| `stranger` | a segment of a name not in the cast (dropped) and the AI teacher |
| `everyone`, `discuss`, `debate` | three voices: the AI teacher and two others |
| `hint`, `help`, `stuck` | the AI teacher and the teaching assistant |
| `answer`, `solution` | the AI teacher alone, guiding without giving the answer |
| `long` | the AI teacher alone, at length (try Stop) |
| anything else | two voices: the AI teacher and an AI classmate |

Chosen by :mod:`chat.llm.demo.rules` when the prompt names a current scene.
"""

from __future__ import annotations

import re

from chat.core.voices import cast_from_prompt

SCENE_TITLE_PREFIX = "Current scene: "
NO_SCENE = "our lesson"


def _has_word(pattern: str, text: str) -> bool:
    return re.search(rf"\b(?:{pattern})\b", text, re.I) is not None


def _quote(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return (flat[:limit].rsplit(" ", 1)[0] or flat[:limit]) + "…"


def in_classroom(prompt: str) -> bool:
    """Whether the prompt is a classroom's (it names the current scene)."""
    return any(line.startswith(SCENE_TITLE_PREFIX) for line in prompt.splitlines())


def scene_title(prompt: str) -> str:
    for line in prompt.splitlines():
        if line.startswith(SCENE_TITLE_PREFIX):
            return line[len(SCENE_TITLE_PREFIX) :].strip() or NO_SCENE
    return NO_SCENE


def _roles(prompt: str, names: list[str]) -> dict[str, str]:
    """Each cast member's role, read from the cast lines ("- Name: AI teacher…")."""
    roles: dict[str, str] = {}
    for line in prompt.splitlines():
        if not line.startswith("- "):
            continue
        name, _, rest = line[2:].partition(":")
        name, rest = name.strip(), rest.lower().split(".", 1)[0]  # the role, not the prompt
        if name not in names or name in roles:
            continue
        if "assistant" in rest:
            roles[name] = "assistant"
        elif "classmate" in rest or "student" in rest:
            roles[name] = "student"
        elif "teacher" in rest:
            roles[name] = "teacher"
    return roles


def _pick(names: list[str], roles: dict[str, str], role: str, skip: list[str]) -> str | None:
    for name in names:
        if roles.get(name) == role and name not in skip:
            return name
    for name in names:  # nobody in that role: anyone not speaking yet
        if name not in skip:
            return name
    return None


def _lines(speaker: str, role: str, scene: str, quote: str, index: int) -> str:
    if role == "teacher" or index == 0:
        return (
            f"Good question for “{scene}”. You said “{quote}”: before I explain, what do you "
            "already know about it, and where would you start?"
        )
    if role == "assistant":
        return (
            f"A hint for “{scene}”: split “{quote}” into smaller steps and check each one. "
            "Tell me your first step and I'll check it with you."
        )
    if index == 1:
        return f"I was wondering about “{quote}” too! In “{scene}” I think the key idea is the first step."
    return f"I see it differently: in “{scene}” I would try an example first, then the rule."


def reply(system_prompt: str, text: str) -> tuple[str, str] | None:
    """(reasoning, tagged text) for a cast prompt; None for any other prompt."""
    names = cast_from_prompt(system_prompt)
    if not names:
        return None
    roles = _roles(system_prompt, names)
    scene = scene_title(system_prompt)
    quote = _quote(text or "…")
    teacher = _pick(names, roles, "teacher", [])
    assert teacher is not None
    if _has_word("unparseable", text):
        body = f"Plain words about “{scene}” with no speaker tags at all: “{quote}”."
        return f"Answering without tags in “{scene}”.", body
    if _has_word("stranger", text):
        body = (
            f"<Stranger>I am not in this class.</Stranger>"
            f"<{teacher}>{_lines(teacher, 'teacher', scene, quote, 0)}</{teacher}>"
        )
        return f"A stranger and {teacher} in “{scene}”.", body
    if _has_word("answer|solution", text):
        said = (
            f"I won't give you the final answer in “{scene}”, but I'll guide you: what is the "
            "first thing the question asks for? Try it and show me."
        )
        return f"{teacher} guides without answering in “{scene}”.", f"<{teacher}>{said}</{teacher}>"
    if _has_word("long", text):
        sentences = [
            f"Step {n} of “{scene}”: we look at “{quote}” again, from another side."
            for n in range(1, 41)
        ]
        return f"{teacher} explains at length.", f"<{teacher}>{' '.join(sentences)}</{teacher}>"
    speakers = [teacher]
    if _has_word("everyone|discuss|debate", text):
        wanted = ["student", "student"]
    elif _has_word("hint|help|stuck", text):
        wanted = ["assistant"]
    else:
        wanted = ["student"]
    for role in wanted:
        if (name := _pick(names, roles, role, speakers)) is not None:
            speakers.append(name)
    body = "\n".join(
        f"<{name}>{_lines(name, roles.get(name, ''), scene, quote, index)}</{name}>"
        for index, name in enumerate(speakers)
    )
    return f"Answering as {', '.join(speakers)} in “{scene}”.", body
