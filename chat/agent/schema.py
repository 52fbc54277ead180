"""Tool schemas from Python signatures: JSON-schema parameters from type hints and docstrings.

A tool's parameters come from its signature (type hints, defaults) and its Google-style
docstring (the first paragraph is the description, an ``Args:`` section describes the
parameters). A parameter named ``ctx`` is the runtime's :class:`ToolContext` and is never
shown to the model. The same description validates the model's arguments
(:func:`bind_arguments`): every problem is a :class:`ToolArgumentError` whose message
tells the model what to fix.

Pure Python: no Django here, and nothing about running tools (see ``chat.agent.registry``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

CTX_PARAM = "ctx"


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


# --- parameters and arguments -------------------------------------------------------------


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


def parameters_schema(params: tuple[ToolParam, ...]) -> dict[str, Any]:
    """The JSON schema of a tool's parameters object."""
    return {
        "type": "object",
        "properties": {param.name: param.schema() for param in params},
        "required": [param.name for param in params if param.required],
        "additionalProperties": False,
    }


def expected_parameters(params: tuple[ToolParam, ...]) -> str:
    """The parameters in words, for error messages to the model."""
    return ", ".join(param.hint() for param in params) or "no parameters ({})"


def bind_arguments(
    tool_name: str, params: tuple[ToolParam, ...], arguments: str | Mapping[str, Any] | None
) -> dict[str, Any]:
    """Parse and validate the model's arguments into keyword arguments for the tool."""
    raw = _parse_arguments_json(tool_name, arguments)
    problems: list[str] = []
    kwargs: dict[str, Any] = {}
    known = {param.name for param in params}
    for param in params:
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
            f"invalid arguments for {tool_name}: {'; '.join(problems)}. "
            f"Expected: {expected_parameters(params)}."
        )
    return kwargs


def _parse_arguments_json(
    tool_name: str, arguments: str | Mapping[str, Any] | None
) -> dict[str, Any]:
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


def params_from_signature(
    fn: Callable[..., Any], tool_name: str, doc_params: dict[str, str]
) -> tuple[tuple[ToolParam, ...], bool]:
    """(parameters, takes ctx) of a tool function; TypeError when it can't be described."""
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
