"""A small registry of Python hooks around the agent loop (no shell or LLM hooks).

A hook is a plain function, sync or async, taking a :class:`HookContext` and returning a
:class:`HookResult` or ``None`` (no change)::

    @hook("pre_llm_request")
    async def add_reminder(ctx: HookContext) -> HookResult | None:
        return HookResult(inject_messages=[user("<system-reminder>…</system-reminder>")])

Settings can list such functions by dotted path (``"myapp.hooks.add_reminder"``); see
:meth:`HookRegistry.from_dotted_paths`.

Chain semantics (:meth:`HookRegistry.run`), as in the reference:

* hooks of an event run in registration order;
* a result with ``action`` "stop" or "skip" ends the chain at once and is returned with only
  its action and its ``additional_context`` — earlier hooks' modifications are discarded;
* otherwise each field the hook set replaces the running context (later hooks see it) and the
  final result; ``inject_messages`` accumulate;
* a hook that raises, returns something other than a ``HookResult``, or runs past its timeout
  (default 5 s) is logged and skipped (``on_error="stop"`` turns that into a stop);
* the whole chain has a budget (default 30 s); hooks after it is spent do not run;
* ``None`` is returned when no hook returned anything.

One deliberate difference: ``additional_context`` from several hooks is joined (blank line
between), not last-wins, so two hooks protecting context before compaction both count.

Sync hooks run in a worker thread so they cannot block the event loop and their timeout is
enforced (a timed-out thread is abandoned, not killed). Each hook receives its own shallow
copy of the context (with its own copy of the message list): mutating it has no effect, a
hook changes things only through its result.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal

from chat.core.messages import ChatMessage

logger = logging.getLogger(__name__)

DEFAULT_HOOK_TIMEOUT = 5.0
DEFAULT_CHAIN_TIMEOUT = 30.0
HOOK_EVENTS_ATTRIBUTE = "lyceum_hook_events"


class HookEvent(StrEnum):
    PRE_LLM_REQUEST = "pre_llm_request"
    POST_TOOL_EXECUTION = "post_tool_execution"
    PRE_MICRO_COMPACT = "pre_micro_compact"
    POST_MICRO_COMPACT = "post_micro_compact"
    PRE_AUTO_COMPACT = "pre_auto_compact"
    POST_AUTO_COMPACT = "post_auto_compact"


HookAction = Literal["stop", "skip"]
OnError = Literal["skip", "stop"]


@dataclass
class HookContext:
    """What a hook may read. Which fields are set depends on the event."""

    event: HookEvent
    messages: list[ChatMessage] | None = None
    system_prompt: str | None = None
    model: str | None = None
    tool_name: str | None = None
    tool_arguments: str | None = None
    tool_result: str | None = None
    chat_id: str | int | None = None


@dataclass
class HookResult:
    """What a hook may change; ``None`` fields mean "leave as is"."""

    messages: list[ChatMessage] | None = None
    system_prompt: str | None = None
    inject_messages: list[ChatMessage] = field(default_factory=list)
    tool_result: str | None = None
    additional_context: str | None = None
    action: HookAction | None = None


HookFunction = Callable[[HookContext], "HookResult | None | Awaitable[HookResult | None]"]


@dataclass(frozen=True)
class RegisteredHook:
    event: HookEvent
    function: HookFunction
    name: str
    timeout: float
    on_error: OnError = "skip"


class HookError(Exception):
    """A hook failed: raised, timed out, or returned something that is not a HookResult."""


def hook(*events: HookEvent | str) -> Callable[[HookFunction], HookFunction]:
    """Mark a function with the events it handles, for :meth:`HookRegistry.from_dotted_paths`."""
    if not events:
        raise ValueError("@hook needs at least one event")
    parsed = tuple(HookEvent(event) for event in events)

    def mark(function: HookFunction) -> HookFunction:
        setattr(function, HOOK_EVENTS_ATTRIBUTE, parsed)
        return function

    return mark


def _function_name(function: Any) -> str:
    module = getattr(function, "__module__", None) or "?"
    name = getattr(function, "__qualname__", None) or repr(function)
    return f"{module}.{name}"


def _import_dotted(path: str) -> Any:
    module_path, _, attribute = path.replace(":", ".").rpartition(".")
    if not module_path or not attribute:
        raise ValueError(f"hook path {path!r} must look like 'package.module.function'")
    module = importlib.import_module(module_path)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"hook path {path!r}: {module_path} has no {attribute!r}") from None


class HookRegistry:
    def __init__(
        self,
        *,
        default_timeout: float = DEFAULT_HOOK_TIMEOUT,
        chain_timeout: float = DEFAULT_CHAIN_TIMEOUT,
    ) -> None:
        self.default_timeout = default_timeout
        self.chain_timeout = chain_timeout
        self._hooks: dict[HookEvent, list[RegisteredHook]] = {}

    def register(
        self,
        event: HookEvent | str,
        function: HookFunction,
        *,
        timeout: float | None = None,
        name: str | None = None,
        on_error: OnError = "skip",
    ) -> RegisteredHook:
        registered = RegisteredHook(
            event=HookEvent(event),
            function=function,
            name=name or _function_name(function),
            timeout=self.default_timeout if timeout is None else timeout,
            on_error=on_error,
        )
        self._hooks.setdefault(registered.event, []).append(registered)
        return registered

    def register_marked(self, function: HookFunction, **options: Any) -> None:
        """Register a ``@hook``-decorated function for each event it declares."""
        events = getattr(function, HOOK_EVENTS_ATTRIBUTE, None)
        if not events:
            raise ValueError(f"{_function_name(function)} is not marked with @hook(...)")
        for event in events:
            self.register(event, function, **options)

    @classmethod
    def from_dotted_paths(cls, paths: Iterable[str], **options: Any) -> HookRegistry:
        """Import each ``module.function`` (marked with ``@hook``) and register it.

        Bad paths fail loudly: a misconfigured hook should stop start-up, not vanish.
        """
        registry = cls(**options)
        for path in paths:
            registry.register_marked(_import_dotted(path))
        return registry

    def has_hooks(self, event: HookEvent | str) -> bool:
        return bool(self._hooks.get(HookEvent(event)))

    def hooks_for(self, event: HookEvent | str) -> list[RegisteredHook]:
        return list(self._hooks.get(HookEvent(event), ()))

    async def run(self, event: HookEvent | str, context: HookContext) -> HookResult | None:
        """Run the chain for ``event`` (semantics in the module docstring)."""
        event = HookEvent(event)
        hooks = self._hooks.get(event)
        if not hooks:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.chain_timeout
        running = replace(context, event=event)
        merged = HookResult()
        contexts: list[str] = []
        anything_returned = False

        for registered in hooks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                logger.warning("hook chain for %s out of time before %s", event, registered.name)
                break
            try:
                result = await _call_hook(
                    registered, _private_copy(running), min(registered.timeout, remaining)
                )
            except HookError as error:
                logger.warning("hook %s failed on %s: %s", registered.name, event, error)
                if registered.on_error == "stop":
                    return HookResult(action="stop")
                continue
            if result is None:
                continue
            anything_returned = True
            if result.action is not None:
                return HookResult(
                    action=result.action, additional_context=result.additional_context
                )
            _apply(result, running, merged)
            if result.additional_context:
                contexts.append(result.additional_context)

        if not anything_returned:
            return None
        merged.additional_context = "\n\n".join(contexts) or None
        return merged


def _private_copy(context: HookContext) -> HookContext:
    messages = None if context.messages is None else list(context.messages)
    return replace(context, messages=messages)


def _apply(result: HookResult, running: HookContext, merged: HookResult) -> None:
    """Fold one hook's changes into the running context and the chain's result."""
    if result.messages is not None:
        running.messages = merged.messages = list(result.messages)
    if result.system_prompt is not None:
        running.system_prompt = merged.system_prompt = result.system_prompt
    if result.tool_result is not None:
        running.tool_result = merged.tool_result = result.tool_result
    merged.inject_messages.extend(result.inject_messages or ())


async def _call_hook(
    registered: RegisteredHook, context: HookContext, timeout: float
) -> HookResult | None:
    function = registered.function
    try:
        async with asyncio.timeout(timeout):
            if inspect.iscoroutinefunction(function):
                outcome: Any = await function(context)
            else:
                outcome = await asyncio.to_thread(function, context)
            if inspect.isawaitable(outcome):  # e.g. a callable object with async __call__
                outcome = await outcome
    except TimeoutError:
        raise HookError(f"timed out after {timeout:g} s") from None
    except Exception as error:  # a hook must never break the loop
        raise HookError(f"{type(error).__name__}: {error}") from error
    if outcome is not None and not isinstance(outcome, HookResult):
        raise HookError(f"returned {type(outcome).__name__}, expected HookResult or None")
    if outcome is not None and outcome.action not in (None, "stop", "skip"):
        raise HookError(f"unknown action {outcome.action!r}")
    return outcome
