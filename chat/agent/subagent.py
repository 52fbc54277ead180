"""Sub-agents: the ``delegate`` tool hands a self-contained task to a nested loop.

A sub-agent works on its own message list with the parent loop's tools minus
``delegate``, and reports back in text. It uses the parent only through
:class:`DelegatingLoop` (which :class:`chat.agent.loop.AgentLoop` implements): the
provider, the tools and their effective policies, the host's channels, and the
parent's usage counter and tool runner.

Pure Python: no Django here.
"""

from __future__ import annotations

from typing import Any, Protocol

from chat.agent.registry import ApprovalPolicy, ToolOutcome, ToolRegistry
from chat.core.channels import LiveChannels
from chat.core.eventlog import sanitize
from chat.core.messages import ChatMessage, Role, ToolCall, assistant, tool_result
from chat.core.prompts import SUB_AGENT_PROMPT
from chat.llm.types import ChatRequest, Provider, ProviderError, StreamEnd

DELEGATE = "delegate"
SUB_AGENT_MAX_ROUNDS = 8
DELEGATE_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": DELEGATE,
        "description": "Hand a self-contained task to a sub-agent, which works on it with "
        "the same tools (except delegate) and returns a report.",
        "parameters": {
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "What the sub-agent should do."},
                "label": {
                    "type": "string",
                    "description": "A short name for the sub-agent, e.g. 'research'.",
                },
            },
            "required": ["task"],
        },
    },
}


class SubAgentHost(Protocol):
    """The part of the run's host a sub-agent writes to."""

    channels: LiveChannels

    async def commit(self) -> None: ...

    def granted(self, tool_name: str) -> bool: ...


class DelegatingLoop(Protocol):
    """What a sub-agent uses of the loop that started it."""

    @property
    def host(self) -> SubAgentHost: ...

    @property
    def provider(self) -> Provider: ...

    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def model(self) -> str: ...

    def policy(self, name: str) -> ApprovalPolicy:
        """The tool's effective policy in this run (overrides included)."""
        ...

    def count_usage(self, end: StreamEnd, request: list[ChatMessage], prompt: str = "") -> None:
        """Add a provider call's tokens to the run's usage."""
        ...

    async def execute_tool(self, call: ToolCall) -> ToolOutcome:
        """Run a tool call in the run's workspace, with the run's timeout."""
        ...


class SubAgent:
    """A nested loop on its own message list, with the parent's tools minus delegate.

    Its messages enter the chat labelled ``SubAgent@<label>``: clean in display,
    wrapped in context and held back while the parent's delegate call is open.
    Tools that need approval are refused: a sub-agent cannot stop to ask.
    """

    def __init__(self, parent: DelegatingLoop, *, label: str, task_id: str) -> None:
        self.parent = parent
        self.sender = f"SubAgent@{label}"
        self.task_id = task_id

    async def run(self, task: str) -> tuple[str, bool]:
        """(report, ok): the sub-agent's last text, and False when it failed."""
        parent = self.parent
        messages: list[ChatMessage] = [ChatMessage(role=Role.USER, content=task)]
        tools = [t.spec() for t in parent.tools if self._may_run(t.name)]
        text = ""
        for _round in range(SUB_AGENT_MAX_ROUNDS):
            request = ChatRequest(
                model=parent.model,
                messages=sanitize(messages),
                system_prompt=SUB_AGENT_PROMPT,
                tools=tools,
                thinking=False,
            )
            try:
                end = await parent.provider.complete(request)
            except ProviderError as exc:
                return f"Sub-agent failed: {exc.message}", False
            parent.count_usage(end, request.messages, SUB_AGENT_PROMPT)
            text = end.text
            if text.strip():
                await self._say(text)
            if not end.tool_calls:
                return text or "[Sub-agent finished with no text output]", True
            messages.append(assistant(text, tool_calls=end.tool_calls))
            for call in end.tool_calls:
                await self._show_call(call)
                content = await self._run_tool(call)
                messages.append(tool_result(call.id, content))
                parent.host.channels.push_display_only(
                    tool_result(call.id, content, sender_name=self.sender)
                )
                await parent.host.commit()
        return text or "[Sub-agent ran out of steps]", bool(text)

    def _may_run(self, name: str) -> bool:
        """AUTO tools, and ASK tools the user allowed for the chat; a grant never lifts DENY."""
        policy = self.parent.policy(name)
        return policy is ApprovalPolicy.AUTO or (
            policy is ApprovalPolicy.ASK and self.parent.host.granted(name)
        )

    async def _say(self, text: str) -> None:
        self.parent.host.channels.push_labelled(assistant(text, sender_name=self.sender))
        await self.parent.host.commit()

    async def _show_call(self, call: ToolCall) -> None:
        channels = self.parent.host.channels
        channels.push_display_only(assistant("", tool_calls=[call], sender_name=self.sender))
        # Context gets a note, not a structured call: the parent never sees the sub-agent's
        # tool protocol, only that it used a tool.
        channels.push_labelled(
            assistant(f"[called tool {call.name}]", sender_name=self.sender),
            display=False,
        )
        await self.parent.host.commit()

    async def _run_tool(self, call: ToolCall) -> str:
        parent = self.parent
        if (
            call.name == DELEGATE
            or call.name not in parent.tools
            or parent.policy(call.name) is ApprovalPolicy.DENY
        ):
            return f"Error: the tool {call.name!r} is not available to sub-agents."
        if not self._may_run(call.name):
            return (
                f"Error: {call.name} needs the user's approval, which sub-agents cannot ask for. "
                "Report back and let the main assistant do it."
            )
        outcome = await parent.execute_tool(call)
        return outcome.content
