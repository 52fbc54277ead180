"""The tool registry: plain typed Python functions offered to the model as function tools.

A tool is an ordinary function (sync or async). Its OpenAI function-tool schema comes
from the signature (type hints, defaults) and the docstring (the first paragraph is the
description, a Google-style ``Args:`` section describes the parameters). A parameter
named ``ctx`` receives the :class:`ToolContext` and is never shown to the model.

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

Pure Python: no Django here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any, Literal, NamedTuple, Union, get_args, get_origin

from chat.agent.workspace import Workspace

DEFAULT_TIMEOUT = 30.0  # seconds, when neither the tool nor the caller says otherwise
DEFAULT_MAX_OUTPUT_CHARS = 50_000  # longer results are cut so one call can't flood context
MAX_ERROR_CHARS = 2_000
CTX_PARAM = "ctx"
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI accepts as a function name
_OPTIONS_ATTR = "__lyceum_tool__"


class ApprovalPolicy(StrEnum):
    AUTO = "auto"  # runs without asking
    ASK = "ask"  # the user approves each call (or "always" for the session)
    DENY = "deny"  # never runs


@dataclass(slots=True)
class ToolContext:
    """What the runtime hands to a tool besides the model's arguments."""

    workspace: Workspace
    chat_id: str = ""
    call_id: str = ""
    extras: dict[str, Any] = field(default_factory=dict)  # runtime services, e.g. a delegate


class ToolOutcome(NamedTuple):
    content: str
    is_error: bool


class ToolArgumentError(ValueError):
    """The model's arguments don't fit the tool's parameters (message is for the model)."""


# --- parameter types ----------------------------------------------------------------------

_SCALAR_KINDS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_KIND_LABELS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "an array",
    "object": "an object",
}


@dataclass(frozen=True, slots=True)
class ParamType:
    """A parameter's JSON type, derived from a type hint; validates the model's values."""

    kind: str  # a JSON-schema type name
    items: ParamType | None = None  # for arrays with a declared item type
    choices: tuple[Any, ...] | None = None  # for Literal[...]
    nullable: bool = False  # Optional[...] / X | None

    def schema(self, *, with_null: bool = False) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": [self.kind, "null"] if with_null else self.kind}
        if self.choices is not None:
            schema["enum"] = [*self.choices, None] if with_null else list(self.choices)
        if self.kind == "array":
            schema["items"] = self.items.schema() if self.items else {}
        return schema

    def label(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(json.dumps(choice) for choice in self.choices)
        if self.kind == "array" and self.items is not None:
            return f"an array of {self.items.kind} values"
        return _KIND_LABELS[self.kind]

    def check(self, value: Any, where: str) -> Any:
        """Return the value (ints widened to float where a number is wanted) or raise."""
        if value is None:
            if self.nullable:
                return None
            raise ToolArgumentError(f"{where} must be {self.label()}, got null")
        if self.choices is not None:
            if any(type(c) is type(value) and c == value for c in self.choices):
                return value
            raise ToolArgumentError(f"{where} must be {self.label()}, got {_preview(value)}")
        checked = self._check_kind(value, where)
        if self.kind == "array" and self.items is not None:
            return [self.items.check(item, f"{where}[{i}]") for i, item in enumerate(checked)]
        return checked

    def _check_kind(self, value: Any, where: str) -> Any:
        is_int = isinstance(value, int) and not isinstance(value, bool)
        is_finite_float = isinstance(value, float) and math.isfinite(value)
        if self.kind == "string" and isinstance(value, str):
            return value
        if self.kind == "boolean" and isinstance(value, bool):
            return value
        if self.kind == "integer" and (is_int or (is_finite_float and value.is_integer())):
            return int(value)  # JSON Schema counts 3.0 as an integer
        if self.kind == "number" and (is_int or is_finite_float):
            return float(value) if is_int and abs(value) < 2**53 else value
        if self.kind == "array" and isinstance(value, list):
            return value
        if self.kind == "object" and isinstance(value, dict):
            return value
        raise ToolArgumentError(
            f"{where} must be {self.label()}, got {_json_kind(value)} {_preview(value)}"
        )


def param_type_from_hint(hint: Any, where: str) -> ParamType:
    """The :class:`ParamType` for a resolved type hint; TypeError for unsupported hints."""
    origin = get_origin(hint)
    if hint in _SCALAR_KINDS:
        return ParamType(_SCALAR_KINDS[hint])
    if hint is list or origin is list:
        args = get_args(hint)
        return ParamType("array", items=param_type_from_hint(args[0], where) if args else None)
    if hint is dict or origin is dict:
        return ParamType("object")
    if origin is Literal:
        choices = get_args(hint)
        kinds = {_literal_kind(choice, where) for choice in choices}
        if len(kinds) != 1:
            raise TypeError(f"{where}: Literal values must all have the same type")
        return ParamType(kinds.pop(), choices=choices)
    if origin is Union or origin is types.UnionType:
        members = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(members) == 1 and len(get_args(hint)) == 2:
            return dataclasses.replace(param_type_from_hint(members[0], where), nullable=True)
    raise TypeError(
        f"{where}: unsupported type hint {hint!r}; use str, int, float, bool, list[...], "
        "dict, Literal[...] or Optional[...]"
    )


def _literal_kind(value: Any, where: str) -> str:
    for python_type in (bool, str, int, float):  # bool first: it is an int subclass
        if isinstance(value, python_type):
            return _SCALAR_KINDS[python_type]
    raise TypeError(f"{where}: Literal values must be str, int, float or bool")


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    for python_type, kind in ((str, "string"), (int, "integer"), (float, "number")):
        if isinstance(value, python_type):
            return kind
    return "array" if isinstance(value, list) else "object"


def _preview(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- docstrings ---------------------------------------------------------------------------

_SECTION = re.compile(r"^\s*([A-Z][A-Za-z ]*):\s*$")
_ARG_SECTIONS = {"Args", "Arguments", "Parameters"}
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}) from a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line):
            break
        summary.append(line.strip())
    return " ".join(summary), _parse_args_section(lines)


def _parse_args_section(lines: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    in_args = False
    section_indent = param_indent = 0
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        section = _SECTION.match(line)
        if section and (not in_args or indent <= section_indent):
            in_args = section.group(1) in _ARG_SECTIONS
            section_indent, current = indent, None
            continue
        if not in_args or not stripped:
            continue
        if indent <= section_indent:  # dedented text ends the section
            in_args = False
            continue
        match = _ARG_LINE.match(stripped)
        if match and (current is None or indent <= param_indent):
            current, param_indent = match.group(1), indent
            params[current] = match.group(2).strip()
        elif current is not None:
            params[current] = f"{params[current]} {stripped}".strip()
    return params


# --- tool definitions ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolParam:
    name: str
    type: ParamType
    required: bool
    default: Any = None
    description: str = ""

    def schema(self) -> dict[str, Any]:
        # A required Optional[...] must be sent but may be null; say so in the schema.
        schema = self.type.schema(with_null=self.type.nullable and self.required)
        if self.description:
            schema["description"] = self.description
        if not self.required and self.default is not None and _is_json_value(self.default):
            schema["default"] = self.default
        return schema

    def hint(self) -> str:
        return f"{self.name} ({self.type.label()}, {'required' if self.required else 'optional'})"


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
        return {
            "type": "object",
            "properties": {param.name: param.schema() for param in self.params},
            "required": [param.name for param in self.params if param.required],
            "additionalProperties": False,
        }

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
        return ", ".join(param.hint() for param in self.params) or "no parameters ({})"

    def bind_arguments(self, arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
        """Parse and validate the model's arguments into keyword arguments for ``fn``."""
        raw = _parse_arguments_json(self.name, arguments)
        problems: list[str] = []
        kwargs: dict[str, Any] = {}
        known = {param.name for param in self.params}
        for param in self.params:
            if param.name not in raw:
                if param.required:
                    problems.append(f"missing required parameter {param.name!r}")
                continue
            try:
                kwargs[param.name] = param.type.check(raw[param.name], f"parameter {param.name!r}")
            except ToolArgumentError as exc:
                problems.append(str(exc))
        problems += [f"unknown parameter {name!r}" for name in raw if name not in known]
        if problems:
            raise ToolArgumentError(
                f"invalid arguments for {self.name}: {'; '.join(problems)}. "
                f"Expected: {self.expected()}."
            )
        return kwargs


def _parse_arguments_json(tool_name: str, arguments: str | Mapping[str, Any] | None) -> dict:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    text = (arguments or "").strip()
    if not text:  # models often send "" for a tool without parameters
        return {}
    try:
        raw = json.loads(text, parse_constant=_reject_json_constant)
    except json.JSONDecodeError as exc:
        raise ToolArgumentError(
            f"the arguments for {tool_name} are not valid JSON ({exc.msg} at line "
            f"{exc.lineno} column {exc.colno}). Send one JSON object of named parameters."
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ToolArgumentError(f"the arguments for {tool_name} could not be read: {exc}") from None
    if not isinstance(raw, dict):
        raise ToolArgumentError(
            f"the arguments for {tool_name} must be a JSON object of named parameters, "
            f"got {_json_kind(raw) if raw is not None else 'null'}."
        )
    return raw


def _reject_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


def _is_json_value(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


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
    params, takes_ctx = _params_from_signature(fn, tool_name, doc_params)
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


def _params_from_signature(
    fn: Callable[..., Any], tool_name: str, doc_params: dict[str, str]
) -> tuple[tuple[ToolParam, ...], bool]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # an unresolvable string annotation
        raise TypeError(f"tool {tool_name}: cannot resolve type hints ({exc})") from exc
    params: list[ToolParam] = []
    takes_ctx = False
    for parameter in inspect.signature(fn).parameters.values():
        where = f"tool {tool_name}, parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: *args and **kwargs are not supported")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where}: positional-only parameters are not supported")
        if parameter.name == CTX_PARAM:
            takes_ctx = True
            continue
        if parameter.name not in hints:
            raise TypeError(f"{where}: needs a type hint")
        required = parameter.default is inspect.Parameter.empty
        params.append(
            ToolParam(
                name=parameter.name,
                type=param_type_from_hint(hints[parameter.name], where),
                required=required,
                default=None if required else parameter.default,
                description=doc_params.get(parameter.name, ""),
            )
        )
    return tuple(params), takes_ctx


@dataclass(frozen=True, slots=True)
class _ToolOptions:
    name: str | None
    description: str | None
    policy: ApprovalPolicy | str | None
    writes: bool
    timeout: float | None


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ApprovalPolicy | str | None = None,
    writes: bool = False,
    timeout: float | None = None,
) -> Any:
    """Mark a function as a tool (``@tool`` or ``@tool(writes=True)``).

    The function stays a plain function; ``ToolRegistry.register`` reads the options.
    The schema is built once here so a bad signature fails at import time.
    """
    options = _ToolOptions(name, description, policy, writes, timeout)

    def mark(func: Callable[..., Any]) -> Callable[..., Any]:
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


def default_registry() -> ToolRegistry:
    """A fresh registry holding the built-in tools (callers may extend or narrow it)."""
    return ToolRegistry(_builtin_tool_defs())


@lru_cache(maxsize=1)
def _builtin_tool_defs() -> tuple[ToolDef, ...]:
    # Read from the functions' signatures and docstrings once per process, not per run.
    from chat.agent.builtin_tools import BUILTIN_TOOLS  # late: builtin_tools imports us

    registry = ToolRegistry()
    for fn in BUILTIN_TOOLS:
        registry.register(fn)
    return tuple(registry)
