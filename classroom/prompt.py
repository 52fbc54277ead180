"""What the model is told in a class chat: the scene, the guardrail and the cast.

One LLM call answers as one to three personas. The run setup registered for chats of
kind ``classroom`` (:func:`class_run_setup`) gives the executor this system prompt and
the cast (the AI teacher first: it is the fallback speaker); the executor appends the
cast's format instructions (``chat.core.voices.cast_instructions``). The history, with
each persona's reply as ``<Name>…</Name>``, is the chat's context channel.
"""

from __future__ import annotations

import re

from django.utils import translation

from chat.llm.demo.classroom import SCENE_TITLE_PREFIX
from chat.models import ChatSession
from chat.runhost.setup import RunSetup
from classroom.models import SCENE_CONTEXT_MAX, Classroom, ClassroomChat, Persona, Scene

OUTLINE_LINE = 160  # characters kept of one outline line
CLIENT_CONTEXT_MAX = 2_000
NO_SCENE_TEXT = "No scene is set yet: talk about the class's subject in general."

_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(?P<text>.+?)\s*#*\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+(?P<text>.+)$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def content_outline(content: str) -> list[str]:
    """Headings, list items and each paragraph's first sentence, in order."""
    lines: list[str] = []
    in_fence = False
    paragraph_open = False
    for raw in content.splitlines():
        if _FENCE.match(raw):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if not raw.strip():
            paragraph_open = False
            continue
        if match := _HEADING.match(raw):
            lines.append(f"# {_clip(match['text'], OUTLINE_LINE)}")
            paragraph_open = False
        elif match := _ITEM.match(raw):
            lines.append(f"- {_clip(match['text'], OUTLINE_LINE)}")
            paragraph_open = False
        elif not paragraph_open:
            first = re.split(r"(?<=[.!?])\s", raw.strip(), maxsplit=1)[0]
            lines.append(_clip(first, OUTLINE_LINE))
            paragraph_open = True
    return lines


def build_scene_context(classroom: Classroom, scene: Scene) -> str:
    """The digest of a scene for the prompt: course, scene title and kind, the outline."""
    course = classroom.title + (f" ({classroom.subject})" if classroom.subject else "")
    head = [f"Course: {course}", f"Scene: {scene.title} ({scene.kind})"]
    outline = content_outline(scene.content)
    text = "\n".join(head + (["Outline:", *outline] if outline else []))
    if len(text) > SCENE_CONTEXT_MAX:
        text = text[: SCENE_CONTEXT_MAX - 1].rsplit("\n", 1)[0] + "\n…"
    return text


def persona_role_line(persona: Persona) -> str:
    """What the cast list says about a persona (its role, then its persona prompt)."""
    prompt = " ".join(persona.prompt.split())
    with translation.override("en"):  # the model's prompt is English whatever the page's
        role = str(persona.get_role_display())
    return f"{role}. {prompt}".strip()


def cast_of(classroom: Classroom) -> list[Persona]:
    """The enabled personas, the AI teacher first (the fallback speaker), then in order."""
    personas = [p for p in classroom.personas.all() if p.enabled]
    return sorted(personas, key=lambda p: (p.role != Persona.Role.TEACHER, p.position, p.pk))


def system_prompt(classroom: Classroom, scene: Scene | None, client_context: str = "") -> str:
    course = classroom.title + (f" ({classroom.subject})" if classroom.subject else "")
    parts = [
        f"You are the AI cast of the class “{course}”, talking with one student in their "
        "own class chat. Each cast member speaks in their own voice, as their persona "
        "describes, and answers the student's last message in the light of the scene.",
        "",
    ]
    if scene is not None:
        parts += [
            f"{SCENE_TITLE_PREFIX}{scene.title}",
            "Scene context:",
            scene.scene_context or build_scene_context(classroom, scene),
        ]
        if scene.guardrail.strip():
            parts += ["", f"Guardrail (every speaker follows it): {scene.guardrail.strip()}"]
    else:
        parts.append(NO_SCENE_TEXT)
    if client_context.strip():
        parts += ["", "What the student is looking at:", _clip(client_context, CLIENT_CONTEXT_MAX)]
    return "\n".join(parts).strip()


def class_run_setup(chat: ChatSession) -> RunSetup:
    """The run setup of a class chat (registered for ``ChatSession.Kind.CLASSROOM``)."""
    link = (
        ClassroomChat.objects.select_related("classroom", "classroom__current_scene")
        .filter(chat_id=chat.pk)
        .first()
    )
    if link is None:  # a class chat whose class is gone: a plain, tool-less chat
        return RunSetup(tools=[], max_rounds=1)
    classroom = link.classroom
    cast = cast_of(classroom)
    return RunSetup(
        system_prompt=system_prompt(classroom, classroom.current_scene, link.client_scene_context),
        speakers=[p.name for p in cast],
        roles={p.name: persona_role_line(p) for p in cast},
        tools=[],
        tool_policies={},
        max_rounds=1,
    )
