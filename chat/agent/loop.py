"""The agent loop: rounds of request → stream → tools until the model answers in text.

Pure Python (no Django). Everything that touches storage or transports goes
through a :class:`RunHost`, so the loop is tested with an in-memory host and
run in production by the Django host in ``chat.runhost.host``.

A run owns a local message list (the window selected from the context channel
plus everything the run adds); the live channels get every message the run
produces, and the host persists them at safe points. Tool calls that need the
user's approval *suspend* the run: the host stores the pending call and the run
resumes (in any process, after any restart) once every call has an answer.

The ``delegate`` tool runs a :class:`chat.agent.subagent.SubAgent`, which uses the loop
only through its public ``host``, ``provider``, ``tools``, ``model``, ``policy()``,
``count_usage()`` and ``execute_tool()``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from chat.agent import events as ev
from chat.agent.hooks import HookContext, HookEvent, HookRegistry, HookResult
from chat.agent.registry import ApprovalPolicy, ToolContext, ToolOutcome, ToolRegistry
from chat.agent.subagent import DELEGATE, DELEGATE_SPEC, SubAgent
from chat.agent.workspace import WorkspaceFiles
from chat.core import compact
from chat.core.channels import LiveChannels, wrap_for_context
from chat.core.eventlog import sanitize
from chat.core.messages import ChatMessage, Image, Role, ToolCall, assistant, tool_result
from chat.core.prompts import EXPIRED_TEXT, USER_APPENDED_PREFIX, denied_text
from chat.core.tokens import estimate_text_tokens, estimate_tokens
from chat.core.voices import Voices, split_reply
from chat.core.window import WindowLimits
from chat.llm.types import (
    ChatRequest,
    ErrorCategory,
    Provider,
    ProviderError,
    ReasoningDelta,
    Retrying,
    StreamEnd,
    TextDelta,
    Usage,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    approved: bool
    reason: str = ""
    expired: bool = False


@dataclass(frozen=True)
class QueuedText:
    text: str
    display_seq: int
    images: tuple[Image, ...] = ()  # attached images, for models that take them


@dataclass
class LoopConfig:
    model: str  # the provider's model id
    context_window: int = 32_000
    max_rounds: int = 12
    thinking: bool = True
    max_output_tokens: int | None = None
    keep_recent: int = 10
    exempt_tools: frozenset[str] = frozenset()
    compact_ratio: float = 0.8  # auto-compact past this share of the history token budget
    tool_timeout: float = 30.0
    # Speak with several voices (a cast): each text reply is split into one labelled
    # message per speaker (chat.core.voices). None: the main agent speaks.
    voices: Voices | None = None


@dataclass
class LoopOutcome:
    status: str  # "completed" | "suspended"
    text: str = ""
    usage: Usage = field(default_factory=Usage)


class RunHost(Protocol):
    """Storage and transport side of a run (``chat.runhost.host`` implements it with Django)."""

    channels: LiveChannels

    async def emit(self, event: ev.RunEvent) -> None: ...

    async def commit(self) -> None:
        """Persist what the channels gained (display now, context at the safe cut)."""

    async def stream_update(self, text: str, reasoning: str) -> None:
        """The reply being streamed, so far (for live pushes and checkpoints)."""

    async def take_queued(self) -> list[QueuedText]: ...

    async def system_prompt(self) -> str: ...

    async def restore_context(self, messages: list[ChatMessage]) -> None:
        """Context was replaced (compaction): persist a ``restore`` event."""

    async def suspend(self, message: ChatMessage, pending: list[ToolCall], usage: Usage) -> None:
        """Store the tool-call message whose ``pending`` calls wait for approval."""

    def granted(self, tool_name: str) -> bool:
        """True when the user allowed this tool for the rest of the chat."""


@dataclass
class _Round:
    text: str = ""
    reasoning: str = ""


class AgentLoop:
    def __init__(
        self,
        host: RunHost,
        provider: Provider,
        tools: ToolRegistry,
        config: LoopConfig,
        *,
        workspace: WorkspaceFiles,
        chat_id: str,
        hooks: HookRegistry | None = None,
        tool_policies: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        self.provider = provider
        self.tools = tools
        self.config = config
        self.workspace = workspace
        self.chat_id = chat_id
        self.hooks = hooks or HookRegistry()
        self.tool_policies = {k: ApprovalPolicy(v) for k, v in (tool_policies or {}).items()}
        self.window = WindowLimits.for_context_window(
            config.context_window,
            config.max_output_tokens or min(4096, config.context_window // 4),
            keep_recent=config.keep_recent,
            exempt_tools=config.exempt_tools,
        )
        self.messages: list[ChatMessage] = []
        self.usage_in = 0
        self.usage_out = 0
        self.usage_estimated = False
        self.round = _Round()
        self.final_text = ""
        self._pending_queue: list[QueuedText] | None = None
        self._auto_compacted = False

    # --- public entry points ---------------------------------------------------------

    @property
    def partial_text(self) -> str:
        return self.round.text

    @property
    def partial_reasoning(self) -> str:
        return self.round.reasoning

    def usage(self) -> Usage:
        return Usage(self.usage_in, self.usage_out, self.usage_estimated)

    @property
    def model(self) -> str:
        return self.config.model

    async def run(
        self,
        resume: tuple[ChatMessage, dict[str, Decision]] | None = None,
        *,
        first_iteration: int = 1,
    ) -> LoopOutcome:
        """Run rounds until the model answers in text, or suspend for an approval."""
        self.messages = self.window.select(self.host.channels.context)
        if resume is not None:
            message, decisions = resume
            # The tool-call message is in display already; context gets it back now.
            self.host.channels.push_context_only(message)
            self.messages.append(message)
            if await self._process_tool_calls(message, decisions):
                return LoopOutcome("suspended", usage=self.usage())
        for iteration in range(first_iteration, self.config.max_rounds + 1):
            await self.host.emit(
                ev.IterationStart(iteration=iteration, max_iterations=self.config.max_rounds)
            )
            await self._drain_queued(first_round=iteration == first_iteration and resume is None)
            await self._compact_if_needed()
            end = await self._request()
            if end.tool_calls:
                message = assistant(
                    end.text, tool_calls=end.tool_calls, reasoning_content=end.reasoning or None
                )
                await self._push(message)
                self.round = _Round()
                if await self._process_tool_calls(message, {}):
                    return LoopOutcome("suspended", usage=self.usage())
                continue
            text = end.text
            if end.finish_reason == "length" and text:
                text += "\n\n[The reply was cut off at the model's output limit.]"
            await self._push_reply(text, end.reasoning)
            self.round = _Round()
            self.final_text = text
            # The user wrote while we answered: answer that too, if a round is left. On the
            # last round the messages stay queued (for the next run) rather than being taken
            # and dropped.
            if iteration < self.config.max_rounds and await self._has_queued():
                continue
            return LoopOutcome("completed", text=text, usage=self.usage())
        note = f"Stopped after {self.config.max_rounds} steps without a final answer."
        await self._push(assistant(note))
        return LoopOutcome("completed", text=note, usage=self.usage())

    # --- channels ----------------------------------------------------------------------

    async def _push(self, message: ChatMessage) -> None:
        self.host.channels.push_both(message)
        self.messages.append(message)
        await self.host.commit()

    async def _push_reply(self, text: str, reasoning: str) -> None:
        """The model's text answer: the main agent's, or one labelled message per voice."""
        voices = self.config.voices
        if voices is None:
            await self._push(assistant(text, reasoning_content=reasoning or None))
            return
        replies = split_reply(voices, text) or [(voices.fallback, "")]
        for index, (speaker, said) in enumerate(replies):
            message = assistant(
                said,
                sender_name=speaker,
                reasoning_content=(reasoning or None) if index == 0 else None,
                extra={"voice": index},
            )
            self.host.channels.push_labelled(message)
            self.messages.append(message.copy(content=wrap_for_context(speaker, said)))
        await self.host.commit()

    async def _has_queued(self) -> bool:
        queued = await self.host.take_queued()
        if queued:
            self._pending_queue = queued
        return bool(queued)

    async def _drain_queued(self, *, first_round: bool) -> None:
        queued = self._pending_queue or await self.host.take_queued()
        self._pending_queue = None
        for item in queued:
            # Display showed the message when it was sent; context gets it now. Mid-run
            # the model is told it was appended while it worked.
            # Marked with the message's display seq: editing it or regenerating its reply
            # finds the context as it stood there (chat.core.branches).
            message = ChatMessage(
                role=Role.USER,
                content=item.text,
                images=list(item.images) or None,
                extra={"input_seq": item.display_seq} if item.display_seq else {},
            )
            self.host.channels.push_context_only(message)
            shown = item.text if first_round else USER_APPENDED_PREFIX + item.text
            self.messages.append(message.copy(content=shown))
            await self.host.emit(ev.InputTaken(input_seq=item.display_seq))
        if queued:
            await self.host.commit()

    # --- compaction ----------------------------------------------------------------------

    async def compact_now(self) -> bool:
        """Manual "compact now": the same path as automatic compaction."""
        self.messages = list(self.host.channels.context)
        return await self._auto_compact(protected=None)

    async def _compact_if_needed(self) -> None:
        before = await self._hook(HookEvent.PRE_MICRO_COMPACT, messages=self.messages)
        if before and before.action == "stop":
            return
        self.messages, _ = compact.micro_compact(
            self.messages, self.config.keep_recent, self.config.exempt_tools
        )
        after = await self._hook(HookEvent.POST_MICRO_COMPACT, messages=self.messages)
        if after and after.messages is not None:
            self.messages = list(after.messages)
        # A share of the history budget (the window minus the output reserve and a margin),
        # not of the whole window: on small windows the output reserve is a quarter of it,
        # and a list at 80 % of the window would overflow the request before compacting.
        threshold = int(self.window.max_tokens * self.config.compact_ratio)
        if self._auto_compacted or not compact.needs_auto_compact(self.messages, threshold):
            return  # once per run: a summary still over the threshold would loop
        pre = await self._hook(
            HookEvent.PRE_AUTO_COMPACT, messages=self.messages, system_prompt=None
        )
        if pre and pre.action == "stop":
            return
        await self._auto_compact(protected=pre.additional_context if pre else None)

    async def _auto_compact(self, protected: str | None) -> bool:
        if not self.messages:
            return False
        await self.host.emit(ev.Compacting())

        async def summarize(request: list[ChatMessage]) -> str:
            end = await self.provider.complete(
                ChatRequest(
                    model=self.config.model,
                    messages=request,
                    max_tokens=compact.SUMMARY_MAX_OUTPUT_TOKENS,
                    thinking=False,
                )
            )
            self.count_usage(end, request)
            return end.text

        try:
            result = await compact.auto_compact(self.messages, summarize, protected)
        except ProviderError as exc:
            logger.warning("compaction failed, continuing uncompacted: %s", exc)
            return False
        # The kept user messages come from the channel, not the request list: there,
        # mid-run messages carry the "[User appended]" prefix and hooks' injections.
        new_messages = compact.compacted_context(self.host.channels.context, result.summary)
        post = await self._hook(HookEvent.POST_AUTO_COMPACT, messages=new_messages)
        if post and post.messages is not None:
            new_messages = list(post.messages)
        self.messages = list(new_messages)
        self.host.channels.replace_context(new_messages)
        await self.host.restore_context(list(new_messages))
        await self.host.emit(
            ev.Compacted(messages_before=result.messages_before, summary=result.summary)
        )
        self._auto_compacted = True
        return True

    # --- one request -------------------------------------------------------------------

    async def _request(self) -> StreamEnd:
        system_prompt = await self.host.system_prompt()
        hook = await self._hook(
            HookEvent.PRE_LLM_REQUEST, messages=self.messages, system_prompt=system_prompt
        )
        if hook:
            if hook.action == "stop":
                raise ProviderError(ErrorCategory.BAD_REQUEST, "A hook stopped this request.")
            if hook.messages is not None:
                self.messages = list(hook.messages)
            if hook.system_prompt is not None:
                system_prompt = hook.system_prompt
            self.messages.extend(hook.inject_messages)
        self.messages = sanitize(self.messages)
        request = ChatRequest(
            model=self.config.model,
            messages=self.messages,
            system_prompt=system_prompt,
            tools=self._tool_specs(),
            max_tokens=self.config.max_output_tokens,
            thinking=self.config.thinking,
        )
        prompt_tokens = estimate_tokens(self.messages) + estimate_text_tokens(system_prompt)
        await self.host.emit(
            ev.ContextUsage(tokens=prompt_tokens, context_window=self.config.context_window)
        )
        self.round = _Round()
        end: StreamEnd | None = None
        async for chunk in self.provider.stream(request):
            if isinstance(chunk, TextDelta):
                self.round.text += chunk.text
                await self.host.emit(ev.Delta(text=chunk.text))
                await self.host.stream_update(self.round.text, self.round.reasoning)
            elif isinstance(chunk, ReasoningDelta):
                self.round.reasoning += chunk.text
                await self.host.emit(ev.ThinkingDelta(text=chunk.text))
                await self.host.stream_update(self.round.text, self.round.reasoning)
            elif isinstance(chunk, Retrying):
                await self.host.emit(
                    ev.RetryingEvent(
                        attempt=chunk.attempt,
                        max_attempts=chunk.max_attempts,
                        delay=chunk.delay,
                        category=str(chunk.category),
                        message=chunk.message,
                    )
                )
            elif isinstance(chunk, StreamEnd):
                end = chunk
        if end is None:
            raise ProviderError(ErrorCategory.MALFORMED_STREAM, streamed=bool(self.round.text))
        self.count_usage(end, self.messages, system_prompt)
        if end.usage is not None and not end.usage.estimated:
            await self.host.emit(
                ev.ContextUsage(
                    tokens=end.usage.input_tokens + end.usage.output_tokens,
                    context_window=self.config.context_window,
                    measured=True,
                )
            )
        return end

    def count_usage(self, end: StreamEnd, request: list[ChatMessage], prompt: str = "") -> None:
        """Add a provider call's tokens to the run's usage (estimated when not reported)."""
        if end.usage is not None and not end.usage.estimated:
            self.usage_in += end.usage.input_tokens
            self.usage_out += end.usage.output_tokens
            return
        self.usage_estimated = True
        self.usage_in += estimate_tokens(request) + estimate_text_tokens(prompt)
        self.usage_out += estimate_text_tokens(end.text) + estimate_text_tokens(end.reasoning)

    def _tool_specs(self) -> list[dict[str, Any]]:
        specs = [t.spec() for t in self.tools if self.policy(t.name) is not ApprovalPolicy.DENY]
        if self._offers_delegate():
            specs.append(DELEGATE_SPEC)
        return specs

    def _offers_delegate(self) -> bool:
        return self.tool_policies.get(DELEGATE) not in (None, ApprovalPolicy.DENY)

    def policy(self, name: str) -> ApprovalPolicy:
        """A tool's effective policy in this run: the run's overrides, else the registry's."""
        if name in self.tool_policies:
            return self.tool_policies[name]
        if name == DELEGATE:
            return ApprovalPolicy.AUTO if self._offers_delegate() else ApprovalPolicy.DENY
        return self.tools.policy(name) if name in self.tools else ApprovalPolicy.DENY

    # --- tools -------------------------------------------------------------------------

    async def _process_tool_calls(
        self, message: ChatMessage, decisions: dict[str, Decision]
    ) -> bool:
        """Run or refuse each call of ``message``. True when the run must wait for approval."""
        calls = message.tool_calls or []
        pending = [
            call
            for call in calls
            if call.id not in decisions
            and self.policy(call.name) is ApprovalPolicy.ASK
            and not self.host.granted(call.name)
        ]
        if pending:
            await self.host.suspend(message, pending, self.usage())
            return True
        for call in calls:
            content, status = await self._run_call(call, decisions.get(call.id))
            post = await self._hook(
                HookEvent.POST_TOOL_EXECUTION,
                tool_name=call.name,
                tool_arguments=call.arguments,
                tool_result=content,
            )
            if post and post.tool_result is not None:
                content = post.tool_result
            await self.host.emit(
                ev.ToolEnd(call_id=call.id, name=call.name, output=content, status=status)
            )
            await self._push(tool_result(call.id, content, extra={"status": status}))
        return False

    async def _run_call(self, call: ToolCall, decision: Decision | None) -> tuple[str, str]:
        policy = self.policy(call.name)
        if decision is not None and not decision.approved:
            return (EXPIRED_TEXT if decision.expired else denied_text(decision.reason)), "denied"
        if policy is ApprovalPolicy.DENY:
            return f"Error: the tool {call.name!r} is not available in this chat.", "failed"
        await self.host.emit(
            ev.ToolStart(call_id=call.id, name=call.name, input=_parse_json(call.arguments))
        )
        if call.name == DELEGATE:
            return await self._delegate(call)
        outcome = await self.execute_tool(call)
        return outcome.content, "failed" if outcome.is_error else "done"

    async def execute_tool(self, call: ToolCall) -> ToolOutcome:
        """Run a tool call in this run's workspace, with this run's timeout (no policy check)."""
        ctx = ToolContext(workspace=self.workspace, chat_id=self.chat_id, call_id=call.id)
        return await self.tools.execute(call.name, call.arguments, ctx, self.config.tool_timeout)

    async def _delegate(self, call: ToolCall) -> tuple[str, str]:
        args = _parse_json(call.arguments)
        task = str(args.get("task") or "").strip() if isinstance(args, dict) else ""
        if not task:
            return "Error: delegate needs a non-empty 'task'.", "failed"
        label = _slug(str(args.get("label") or "helper"))
        sub = SubAgent(self, label=label, task_id=call.id)
        await self.host.emit(ev.HandStart(name=DELEGATE, label=label, params={"task": task}))
        await self.host.emit(
            ev.SubtaskStatus(task_id=call.id, description=task[:200], status="running")
        )
        report, ok = await sub.run(task)
        await self.host.emit(
            ev.SubtaskStatus(
                task_id=call.id,
                description=task[:200],
                status="completed" if ok else "failed",
                detail=report[:200],
            )
        )
        await self.host.emit(ev.HandEnd(name=DELEGATE, label=label, result=report))
        return report, "done" if ok else "failed"

    async def _hook(self, event: HookEvent, **fields: Any) -> HookResult | None:
        if not self.hooks.has_hooks(event):
            return None
        context = HookContext(event=event, model=self.config.model, chat_id=self.chat_id, **fields)
        return await self.hooks.run(event, context)


def _parse_json(raw: str) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return raw


def _slug(label: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in label.strip())
    return (cleaned or "helper")[:24]
