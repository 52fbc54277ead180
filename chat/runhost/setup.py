"""How a run of a chat is set up: its system prompt, its speakers, its tools.

The default comes from the chat's agent. Other apps set up the runs of their kinds
of chat by registering a function for that kind (the classroom registers one for
``ChatSession.Kind.CLASSROOM``: the scene, the guardrail and the cast), so chat
never imports them. A setup function runs on the database thread, in the
transaction that claims the run, and may read what it needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection

from chat import rows
from chat.core.prompts import language_line
from chat.models import ChatSession, Run

DEFAULT_MAX_ROUNDS = 12


@dataclass
class RunSetup:
    system_prompt: str = ""
    speakers: list[str] = field(default_factory=list)  # a cast; empty: the main agent
    roles: dict[str, str] = field(default_factory=dict)  # speaker -> what they are, for the cast
    tools: list[str] | None = None  # tool names; None: the agent's
    tool_policies: dict[str, str] | None = None
    max_rounds: int = DEFAULT_MAX_ROUNDS


RunSetupFactory = Callable[[ChatSession], RunSetup]
_setups: dict[str, RunSetupFactory] = {}


def register_run_setup(kind: str, factory: RunSetupFactory) -> None:
    """Set up the runs of chats of ``kind`` with ``factory`` (an app's ``ready()``)."""
    _setups[kind] = factory


def setup_for(chat: ChatSession) -> RunSetup:
    setup = _setup_of_kind(chat)
    line = language_line(chat.language)
    if line:  # the model answers in the chat's language
        setup.system_prompt = f"{setup.system_prompt}\n\n{line}".strip()
    return setup


def _setup_of_kind(chat: ChatSession) -> RunSetup:
    factory = _setups.get(chat.kind)
    if factory is not None:
        return factory(chat)
    agent = chat.agent
    if agent is None:
        return RunSetup()
    return RunSetup(
        system_prompt=agent.system_prompt,
        speakers=list(agent.personas or []),
        tools=list(agent.tools) if agent.tools is not None else None,
        tool_policies=dict(agent.tool_policies or {}),
        max_rounds=agent.max_rounds,
    )


# --- after a run ends ----------------------------------------------------------------------------

RunFinishedHook = Callable[[Run, str], None]
_finished: dict[str, RunFinishedHook] = {}


def register_run_finished(kind: str, hook: RunFinishedHook) -> None:
    """Call ``hook(run, status)`` when a run of a chat of ``kind`` ends.

    Called inside the transaction that writes the run's end (``transitions.finish_run``),
    after its last messages and context: what the hook writes comes after them, before
    any next run of the chat can start (the classroom moderates the replies there and
    writes a teacher's message held while the run was live). Rings only on commit.
    """
    _finished[kind] = hook


def run_finished(run: Run, status: str) -> None:
    if not _finished:
        return
    # Written out (chat/rows.py): every run's end asks it on the one database thread.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {rows.column(ChatSession, 'kind')} FROM {rows.table(ChatSession)} "
            f"WHERE {rows.column(ChatSession, 'pk')} = %s",
            [rows.prep(ChatSession, "pk", run.chat_id)],
        )
        found = cursor.fetchone()
    kind = found[0] if found else None
    hook = _finished.get(kind or "")
    if hook is not None:
        hook(run, status)
