"""The built-in tools (a calculator, the clock, the chat workspace's files) and
``default_registry()``, a registry holding them.

Deliberately no shell and no network access. ``delegate`` (hand work to a sub-agent) is
not here: it needs the provider, so the agent loop runs it (``chat.agent.subagent``).

Pure Python: no Django here.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from chat.agent.registry import ToolContext, ToolDef, ToolRegistry, tool

# --- calculator ---------------------------------------------------------------------------

MAX_EXPRESSION_CHARS = 500
MAX_NESTING = 300  # AST depth; keeps the evaluator's recursion well inside Python's limit
MAX_EXPONENT = 10_000
MAX_RESULT_DIGITS = 1_000  # also below Python's 4300-digit int-to-str limit
MAX_ROUND_DIGITS = 100
_INT_LIMIT = 10**MAX_RESULT_DIGITS
_INT_LIMIT_BITS = _INT_LIMIT.bit_length()

Number = int | float


class CalculatorError(ValueError):
    """An expression the calculator refuses or can't evaluate (message is for the model)."""


def _power(base: Number, exponent: Number) -> Number:
    # Refuse before computing: 9**9**9 would otherwise run for minutes and eat memory.
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        lower_bound_bits = (abs(base).bit_length() - 1) * exponent
        if exponent > MAX_EXPONENT or lower_bound_bits > _INT_LIMIT_BITS:
            raise CalculatorError(
                f"the exponent is too large (the result would have more than "
                f"{MAX_RESULT_DIGITS} digits)"
            )
    return base**exponent


def _round(value: Number, digits: Number = 0) -> Number:
    if not isinstance(digits, int) or abs(digits) > MAX_ROUND_DIGITS:
        raise CalculatorError(
            f"round() needs a whole number of digits between -{MAX_ROUND_DIGITS} "
            f"and {MAX_ROUND_DIGITS}"
        )
    return round(value, digits)


def _log(value: Number, base: Number | None = None) -> float:
    return math.log(value) if base is None else math.log(value, base)


_BINARY_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_UNARY_OPERATORS: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
# name -> (function, fewest arguments, most arguments)
_FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "sqrt": (math.sqrt, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "asin": (math.asin, 1, 1),
    "acos": (math.acos, 1, 1),
    "atan": (math.atan, 1, 1),
    "exp": (math.exp, 1, 1),
    "log": (_log, 1, 2),
    "log10": (math.log10, 1, 1),
    "log2": (math.log2, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
}
_FORBIDDEN_NAMES: dict[type[ast.AST], str] = {
    ast.Attribute: "attribute access",
    ast.Subscript: "indexing",
    ast.Lambda: "lambda",
    ast.ListComp: "comprehensions",
    ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions",
    ast.GeneratorExp: "comprehensions",
    ast.Compare: "comparisons",
    ast.BoolOp: "'and' / 'or'",
    ast.IfExp: "conditional expressions",
    ast.NamedExpr: "assignment",
    ast.JoinedStr: "text",
    ast.List: "lists",
    ast.Tuple: "tuples",
    ast.Dict: "dicts",
    ast.Set: "sets",
    ast.Starred: "unpacking",
    ast.Await: "await",
    ast.Yield: "yield",
}
_ALLOWED_SUMMARY = (
    "Only numbers, + - * / // % **, parentheses, the constants pi, e, tau and the functions "
    + ", ".join(_FUNCTIONS)
    + " are allowed"
)


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic expression by walking its syntax tree (never eval)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if not expression.strip():
        raise CalculatorError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        column = f" at column {exc.offset}" if exc.offset else ""
        raise CalculatorError(f"could not parse the expression ({exc.msg}{column})") from None
    except (ValueError, RecursionError, MemoryError):
        raise CalculatorError("could not parse the expression") from None
    try:
        return _evaluate_node(tree.body, depth=0)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result is too large") from None
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None


def _evaluate_node(node: ast.AST, depth: int) -> Number:
    if depth > MAX_NESTING:
        raise CalculatorError("the expression is nested too deeply")
    if isinstance(node, ast.Constant):
        return _number_constant(node.value)
    if isinstance(node, ast.BinOp):
        binary = _BINARY_OPERATORS.get(type(node.op))
        if binary is None:
            raise CalculatorError(_operator_refusal(node.op))
        left = _evaluate_node(node.left, depth + 1)
        right = _evaluate_node(node.right, depth + 1)
        return _checked(binary(left, right))
    if isinstance(node, ast.UnaryOp):
        unary = _UNARY_OPERATORS.get(type(node.op))
        if unary is None:
            raise CalculatorError(_operator_refusal(node.op))
        return _checked(unary(_evaluate_node(node.operand, depth + 1)))
    if isinstance(node, ast.Name):
        return _constant(node.id)
    if isinstance(node, ast.Call):
        return _call(node, depth)
    what = _FORBIDDEN_NAMES.get(type(node), type(node).__name__)
    raise CalculatorError(f"not allowed: {what}. {_ALLOWED_SUMMARY}")


def _number_constant(value: object) -> Number:
    if type(value) is int or type(value) is float:  # not bool, complex or text
        return _checked(value)
    if isinstance(value, str):
        raise CalculatorError(f"not allowed: text. {_ALLOWED_SUMMARY}")
    raise CalculatorError(f"not allowed: {value!r}. {_ALLOWED_SUMMARY}")


def _constant(name: str) -> Number:
    if name in _CONSTANTS:
        return _CONSTANTS[name]
    if name in _FUNCTIONS:
        raise CalculatorError(f"{name} is a function; call it like {name}(2)")
    raise CalculatorError(f"unknown name {name!r}. {_ALLOWED_SUMMARY}")


def _call(node: ast.Call, depth: int) -> Number:
    if not isinstance(node.func, ast.Name):
        what = _FORBIDDEN_NAMES.get(type(node.func), "calling the result of an expression")
        raise CalculatorError(f"not allowed: {what}. {_ALLOWED_SUMMARY}")
    name = node.func.id
    if name not in _FUNCTIONS:
        raise CalculatorError(f"unknown function {name!r}. {_ALLOWED_SUMMARY}")
    if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
        raise CalculatorError(f"{name}() takes plain positional arguments only")
    function, fewest, most = _FUNCTIONS[name]
    if not fewest <= len(node.args) <= most:
        expected = str(fewest) if fewest == most else f"{fewest} or {most}"
        raise CalculatorError(f"{name}() takes {expected} argument(s), got {len(node.args)}")
    args = [_evaluate_node(arg, depth + 1) for arg in node.args]
    try:
        return _checked(function(*args))
    except CalculatorError:
        raise
    except ValueError:  # math's "domain error", e.g. sqrt(-1) or log(0)
        shown = ", ".join(format_number(arg) for arg in args)
        raise CalculatorError(f"{name}({shown}) is undefined for real numbers") from None


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("the result is not a real number")
    if isinstance(value, float):
        if math.isnan(value):
            raise CalculatorError("the result is not a number")
        if math.isinf(value):
            raise CalculatorError("the result is too large")
    elif abs(value) >= _INT_LIMIT:
        raise CalculatorError(f"the result has more than {MAX_RESULT_DIGITS} digits")
    number: Number = value
    return number


def _operator_refusal(op: ast.AST) -> str:
    if isinstance(op, ast.BitXor):
        return "'^' is not a power operator here; use ** (e.g. 2**10)"
    return f"not allowed: the operator {type(op).__name__}. {_ALLOWED_SUMMARY}"


def format_number(value: Number) -> str:
    """Ints as they are; floats without '.0' when whole, else up to 15 significant digits."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, ".15g")


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports numbers, + - * / // % ** and parentheses, the constants pi, e and tau, and
    the functions sqrt, sin, cos, tan, asin, acos, atan, exp, log (natural, or
    log(x, base)), log10, log2, abs, round, floor and ceil. Angles are in radians.

    Args:
        expression: The expression, e.g. "(3 + 4) * 2 ** 0.5" or "round(sqrt(2), 3)".
    """
    return format_number(evaluate(expression))


# --- clock --------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


@tool
def current_time() -> str:
    """Get the current date and time (UTC)."""
    now = _now().astimezone(UTC).replace(microsecond=0)
    iso = now.isoformat().replace("+00:00", "Z")
    return f"{iso} ({now:%A}, {now.day} {now:%B %Y, %H:%M} UTC)"


# --- workspace files ----------------------------------------------------------------------


@tool
def read_file(path: str, ctx: ToolContext) -> str:
    """Read a text file from this chat's workspace.

    Args:
        path: Relative file path, e.g. "notes.md" or "src/app.py".
    """
    text = ctx.workspace.read(path)
    return text if text else f"({path} is empty)"


@tool(writes=True)
def write_file(path: str, content: str, ctx: ToolContext) -> str:
    """Create a text file in this chat's workspace, or replace its whole content.

    Args:
        path: Relative file path, e.g. "notes.md" or "src/app.py"; folders are created.
        content: The complete new content of the file.
    """
    result = ctx.workspace.write(path, content)
    state = "new file" if result.created else "replaced the previous content"
    return f"Wrote {result.bytes_written} bytes to {result.path} ({state})."


@tool(writes=True)
def edit_file(path: str, old: str, new: str, ctx: ToolContext) -> str:
    """Replace one exact piece of text in a workspace file.

    The text to replace must occur exactly once in the file; include enough surrounding
    text to make it unique.

    Args:
        path: Relative file path of an existing file.
        old: The exact text to replace (whitespace and line breaks included).
        new: The replacement text.
    """
    result = ctx.workspace.edit(path, old, new)
    return f"Edited {result.path}: replaced 1 occurrence; the file is now {result.bytes_written} bytes."


@tool
def list_files(ctx: ToolContext) -> str:
    """List the files in this chat's workspace with their sizes."""
    entries = ctx.workspace.list()
    if not entries:
        return "The workspace is empty."
    noun = "file" if len(entries) == 1 else "files"
    lines = [f"{entry.path} ({entry.size} bytes)" for entry in entries]
    return f"{len(entries)} {noun}:\n" + "\n".join(lines)


BUILTIN_TOOLS: tuple[Callable[..., Any], ...] = (
    calculator,
    current_time,
    read_file,
    write_file,
    edit_file,
    list_files,
)
BUILTIN_TOOL_NAMES: tuple[str, ...] = tuple(fn.__name__ for fn in BUILTIN_TOOLS)


def default_registry() -> ToolRegistry:
    """A fresh registry holding the built-in tools (callers may extend or narrow it)."""
    return ToolRegistry(_builtin_tool_defs())


@lru_cache(maxsize=1)
def _builtin_tool_defs() -> tuple[ToolDef, ...]:
    # Read from the functions' signatures and docstrings once per process, not per run.
    registry = ToolRegistry()
    for fn in BUILTIN_TOOLS:
        registry.register(fn)
    return tuple(registry)
