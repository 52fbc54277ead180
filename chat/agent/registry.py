"""The tool registry: plain typed Python functions offered to the model as function tools.

A tool is an ordinary function (sync or async); ``chat.agent.schema`` reads its
OpenAI function-tool schema from the signature and docstring. A parameter named ``ctx``
receives the :class:`ToolContext` and is never shown to the model.

    @tool(writes=True)
    def write_file(path: str, content: str, ctx: ToolContext) -> str:
        '''Write a text file.

        Args:
            path: Relative file name.
            content: The full new text.
        '''

``ToolRegistry.execute`` never raises for anything the model or the tool did wrong: bad
JSON, bad arguments, an unknown tool, an exception or a timeout all come back as an
error :class:`ToolOutcome` whose text tells the model what to fix. Only cancellation of
the calling task propagates, so a cancelled run stops at once.

The built-in tools and ``default_registry()`` live in ``chat.agent.builtin_tools``.

Pure Python: no Django here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar, overload

from chat.agent.schema import (
    CTX_PARAM,
    ToolArgumentError,
    ToolParam,
    bind_arguments,
    expected_parameters,
    parameters_schema,
    params_from_signature,
    parse_docstring,
)
from chat.agent.workspace import WorkspaceFiles

DEFAULT_TIMEOUT = 30.0  # seconds, when neither the tool nor the caller says otherwise
DEFAULT_MAX_OUTPUT_CHARS = 50_000  # longer results are cut so one call can't flood context
MAX_ERROR_CHARS = 2_000
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI accepts as a function name
_OPTIONS_ATTR = "__lyceum_tool__"


class ApprovalPolicy(StrEnum):
    AUTO = "auto"  # runs without asking
    ASK = "ask"  # the user approves each call (or "always" for the session)
    DENY = "deny"  # never runs


@dataclass(slots=True)
class ToolContext:
    """What the runtime hands to a tool besides the model's arguments."""

    workspace: WorkspaceFiles
    chat_id: str = ""
    call_id: str = ""
    extras: dict[str, Any] = field(default_factory=dict)  # runtime services, e.g. a delegate


class ToolOutcome(NamedTuple):
    content: str
    is_error: bool


# --- tool definitions ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    description: str
    fn: Callable[..., Any]
    params: tuple[ToolParam, ...]
    policy: ApprovalPolicy
    writes: bool
    timeout: float | None  # the tool's own limit; wins over the caller's default
    takes_ctx: bool
    is_async: bool

    def parameters_schema(self) -> dict[str, Any]:
        return parameters_schema(self.params)

    def spec(self) -> dict[str, Any]:
        """The OpenAI function-tool spec sent to the provider."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters_schema(),
            },
        }

    def expected(self) -> str:
        return expected_parameters(self.params)

    def bind_arguments(self, arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
        """Parse and validate the model's arguments into keyword arguments for ``fn``."""
        return bind_arguments(self.name, self.params, arguments)


def tool_def_from_function(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ApprovalPolicy | str | None = None,
    writes: bool = False,
    timeout: float | None = None,
) -> ToolDef:
    """Build a :class:`ToolDef` from a function's signature and docstring.

    Raises TypeError when the function can't be described (missing or unsupported type
    hints, ``*args``/``**kwargs``, positional-only parameters, a bad name).
    """
    tool_name = name or fn.__name__
    if not _TOOL_NAME.match(tool_name):
        raise TypeError(f"tool name {tool_name!r} must match {_TOOL_NAME.pattern}")
    doc_description, doc_params = parse_docstring(inspect.getdoc(fn))
    params, takes_ctx = params_from_signature(fn, tool_name, doc_params)
    # Writing tools ask by default: the user sees every change before it happens.
    default_policy = ApprovalPolicy.ASK if writes else ApprovalPolicy.AUTO
    return ToolDef(
        name=tool_name,
        description=(description if description is not None else doc_description).strip(),
        fn=fn,
        params=params,
        policy=ApprovalPolicy(policy) if policy else default_policy,
        writes=writes,
        timeout=timeout,
        takes_ctx=takes_ctx,
        is_async=inspect.iscoroutinefunction(fn),
    )


@dataclass(frozen=True, slots=True)
class _ToolOptions:
    name: str | None
    description: str | None
    policy: ApprovalPolicy | str | None
    writes: bool
    timeout: float | None


F = TypeVar("F", bound=Callable[..., Any])


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ApprovalPolicy | str | None = None,
    writes: bool = False,
    timeout: float | None = None,
) -> Callable[[F], F]: ...


def tool(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ApprovalPolicy | str | None = None,
    writes: bool = False,
    timeout: float | None = None,
) -> F | Callable[[F], F]:
    """Mark a function as a tool (``@tool`` or ``@tool(writes=True)``).

    The function stays a plain function; ``ToolRegistry.register`` reads the options.
    The schema is built once here so a bad signature fails at import time.
    """
    options = _ToolOptions(name, description, policy, writes, timeout)

    def mark(func: F) -> F:
        tool_def_from_function(func, **dataclasses.asdict(options))
        setattr(func, _OPTIONS_ATTR, options)
        return func

    return mark(fn) if fn is not None else mark


# --- the registry -------------------------------------------------------------------------


class ToolRegistry:
    """Named tools in registration order. ``subset``/``without`` return new registries."""

    def __init__(
        self,
        tools: Iterable[ToolDef] = (),
        *,
        default_timeout: float = DEFAULT_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        self.default_timeout = default_timeout
        self.max_output_chars = max_output_chars
        self._tools: dict[str, ToolDef] = {}
        for tool_def in tools:
            self.add(tool_def)

    # --- building ---------------------------------------------------------------------

    def add(self, tool_def: ToolDef) -> ToolDef:
        if tool_def.name in self._tools:
            raise ValueError(f"a tool named {tool_def.name!r} is already registered")
        self._tools[tool_def.name] = tool_def
        return tool_def

    def register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        policy: ApprovalPolicy | str | None = None,
        writes: bool | None = None,
        timeout: float | None = None,
    ) -> ToolDef:
        """Register a function; explicit options override those given to ``@tool``."""
        marked: _ToolOptions = getattr(fn, _OPTIONS_ATTR, None) or _ToolOptions(
            None, None, None, False, None
        )
        return self.add(
            tool_def_from_function(
                fn,
                name=name if name is not None else marked.name,
                description=description if description is not None else marked.description,
                policy=policy if policy is not None else marked.policy,
                writes=writes if writes is not None else marked.writes,
                timeout=timeout if timeout is not None else marked.timeout,
            )
        )

    def tool(self, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register`; returns the function unchanged."""

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(fn, **options)
            return fn

        return decorate

    def _derive(self, tools: Iterable[ToolDef]) -> ToolRegistry:
        return ToolRegistry(
            tools, default_timeout=self.default_timeout, max_output_chars=self.max_output_chars
        )

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """Only the named tools, in the given order. Unknown names raise KeyError."""
        return self._derive(self.get(name) for name in dict.fromkeys(names))

    def without(self, *names: str) -> ToolRegistry:
        """All tools except the named ones (names not registered are ignored)."""
        return self._derive(t for t in self._tools.values() if t.name not in names)

    def with_policies(self, policies: Mapping[str, ApprovalPolicy | str]) -> ToolRegistry:
        """A copy with some tools' approval policies replaced (e.g. from admin config)."""
        for name in policies:
            self.get(name)
        return self._derive(
            dataclasses.replace(t, policy=ApprovalPolicy(policies[t.name]))
            if t.name in policies
            else t
            for t in self._tools.values()
        )

    # --- reading ----------------------------------------------------------------------

    def get(self, name: str) -> ToolDef:
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"unknown tool {name!r}") from None

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolDef]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Function-tool specs for the provider request; unknown names raise KeyError."""
        chosen = self._tools.values() if names is None else [self.get(n) for n in names]
        return [tool_def.spec() for tool_def in chosen]

    def policy(self, name: str) -> ApprovalPolicy:
        return self.get(name).policy

    def parse_arguments(self, name: str, arguments_json: str) -> dict[str, Any]:
        """Validated arguments (e.g. to show on an approval card); raises ToolArgumentError."""
        return self.get(name).bind_arguments(arguments_json)

    # --- running ----------------------------------------------------------------------

    async def execute(
        self,
        name: str,
        arguments_json: str,
        ctx: ToolContext,
        timeout: float | None = None,
    ) -> ToolOutcome:
        """Run one tool call; every failure becomes an error outcome the model can read.

        The limit is the tool's own ``timeout`` if it declared one, else ``timeout``,
        else the registry default. A sync tool runs in a worker thread; on timeout the
        caller gets its answer at once but the thread can't be killed and finishes in
        the background (its result is discarded).
        """
        tool_def = self._tools.get(name)
        if tool_def is None:
            available = ", ".join(self._tools) or "none"
            return ToolOutcome(f"Error: unknown tool {name!r}. Available tools: {available}.", True)
        if tool_def.policy is ApprovalPolicy.DENY:
            return ToolOutcome(f"Error: the tool {name!r} is disabled here.", True)
        try:
            kwargs = tool_def.bind_arguments(arguments_json)
        except ToolArgumentError as exc:
            return ToolOutcome(f"Error: {exc}", True)
        if tool_def.takes_ctx:
            kwargs[CTX_PARAM] = ctx
        limit = tool_def.timeout or timeout or self.default_timeout
        try:
            result = await _call_with_timeout(tool_def, kwargs, limit)
            content = result_to_text(result)
        except _ToolTimedOut:
            return ToolOutcome(f"Error: Tool {name} timed out after {limit:g} s.", True)
        except Exception as exc:  # the tool's failure is the model's information, not ours
            return ToolOutcome(error_text(exc), True)
        return ToolOutcome(_cut(content, self.max_output_chars), False)


class _ToolTimedOut(Exception):
    pass


async def _call_with_timeout(tool_def: ToolDef, kwargs: dict[str, Any], limit: float) -> Any:
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            if tool_def.is_async:
                result = await tool_def.fn(**kwargs)
            else:
                # A thread keeps blocking work (file I/O, CPU) off the event loop.
                result = await asyncio.to_thread(tool_def.fn, **kwargs)
            if inspect.isawaitable(result):  # e.g. a partial() wrapping an async function
                result = await result
    except TimeoutError:
        if deadline.expired():
            raise _ToolTimedOut from None
        raise  # the tool's own TimeoutError: report it like any other exception
    return result


def error_text(exc: BaseException) -> str:
    """``Error: <type>: <message>``, never a traceback."""
    message = str(exc).strip()
    kind = type(exc).__name__
    return _cut(f"Error: {kind}: {message}" if message else f"Error: {kind}", MAX_ERROR_CHARS)


def result_to_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if result is None:
        return "(no output)"
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        result = dataclasses.asdict(result)
    return json.dumps(result, ensure_ascii=False, default=str)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n…[truncated {len(text) - limit} more characters]"
