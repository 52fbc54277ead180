"""The default agent every deployment starts with (also made by migration 0003)."""

from __future__ import annotations

from chat.models import Agent

DEFAULT_SLUG = "assistant"
DEFAULT_PROMPT = (
    "You are Lyceum's assistant: helpful, precise and friendly. Answer in Markdown. "
    "Use your tools when they help: calculator for arithmetic, current_time for the date, "
    "the file tools to write, edit, read and list files in this chat's workspace, and "
    "delegate to hand a self-contained task to a sub-agent."
)
DEFAULT_TOOLS = [
    "calculator",
    "current_time",
    "write_file",
    "edit_file",
    "read_file",
    "list_files",
    "delegate",
]


def default_agent() -> Agent:
    """The default agent; made again if an admin deleted every agent."""
    agent = Agent.objects.filter(is_default=True).first() or Agent.objects.first()
    if agent is None:
        agent, _ = Agent.objects.get_or_create(
            slug=DEFAULT_SLUG,
            defaults={
                "name": "Assistant",
                "system_prompt": DEFAULT_PROMPT,
                "tools": DEFAULT_TOOLS,
                "is_default": True,
            },
        )
    return agent
