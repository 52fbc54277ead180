"""The built-in tools: calculator safety and results, clock, and the workspace file tools."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.agent import builtin_tools
from chat.agent.builtin_tools import (
    BUILTIN_TOOL_NAMES,
    MAX_EXPRESSION_CHARS,
    CalculatorError,
    calculator,
    default_registry,
    evaluate,
    format_number,
)
from chat.agent.registry import ToolContext, ToolOutcome
from chat.agent.workspace import Workspace


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=Workspace(tmp_path / "ws"), chat_id="c", call_id="t1")


def test_builtin_tool_names() -> None:
    assert BUILTIN_TOOL_NAMES == (
        "calculator",
        "current_time",
        "read_file",
        "write_file",
        "edit_file",
        "list_files",
    )
    assert "delegate" not in BUILTIN_TOOL_NAMES


def test_builtin_module_has_no_shell_or_network_imports() -> None:
    source = Path(builtin_tools.__file__).read_text()
    for forbidden in ("subprocess", "import os", "socket", "httpx", "urllib", "eval(", "exec("):
        assert forbidden not in source


# --- calculator: results ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("2 ** 3 ** 2", "512"),  # right-associative, like Python
        ("-2 ** 2", "-4"),  # ** binds tighter than unary minus
        ("10 - 4 - 3", "3"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),  # whole floats print without ".0"
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("+5", "5"),
        ("0.1 + 0.2", "0.3"),
        ("1.5e3", "1500"),
        ("2 ** -1", "0.5"),
        ("2 ** 100", "1267650600228229401496703205376"),
        ("sqrt(16)", "4"),
        ("sqrt(2)", "1.4142135623731"),
        ("abs(-3)", "3"),
        ("round(3.14159, 2)", "3.14"),
        ("round(2.5)", "2"),
        ("floor(-2.5)", "-3"),
        ("ceil(2.1)", "3"),
        ("log(e)", "1"),
        ("log(8, 2)", "3"),
        ("log10(1000)", "3"),
        ("exp(0)", "1"),
        ("sin(0) + cos(0)", "1"),
        ("tan(pi / 4)", "1"),
        ("2 * pi", "6.28318530717959"),
        ("  3 * (4 + (5 - 1)) ", "24"),
        ("1_000 * 3", "3000"),
    ],
)
def test_calculator_results(expression: str, expected: str) -> None:
    assert calculator(expression) == expected


def test_format_number() -> None:
    assert format_number(3) == "3"
    assert format_number(3.0) == "3"
    assert format_number(-0.0) == "0"
    assert format_number(1e20) == "1e+20"
    assert format_number(1 / 3) == "0.333333333333333"


@settings(max_examples=200, deadline=None)
@given(
    a=st.integers(-1000, 1000),
    b=st.integers(-1000, 1000),
    c=st.integers(-1000, 1000),
    ops=st.tuples(st.sampled_from("+-*"), st.sampled_from("+-*")),
)
def test_calculator_matches_python_integer_arithmetic(
    a: int, b: int, c: int, ops: tuple[str, str]
) -> None:
    expression = f"{a} {ops[0]} ({b}) {ops[1]} {c}"
    expected = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}
    # Apply precedence by hand rather than with eval: * first, then left to right.
    first, second = ops
    if second == "*" and first != "*":
        value = expected[first](a, b * c)
    else:
        value = expected[second](expected[first](a, b), c)
    assert calculator(expression) == str(value)


# --- calculator: refusals -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('id')", "not allowed: attribute access"),
        ("__import__('os')", "unknown function '__import__'"),
        ("__import__", "unknown name '__import__'"),
        ("(1).__class__", "not allowed: attribute access"),
        ("math.sqrt(4)", "not allowed: attribute access"),
        ("open('x')", "unknown function 'open'"),
        ("eval('1')", "unknown function 'eval'"),
        ("sqrt(x=4)", "plain positional arguments"),
        ("sqrt(*[4])", "plain positional arguments"),
        ("sqrt(1, 2)", "sqrt() takes 1 argument(s), got 2"),
        ("log()", "log() takes 1 or 2 argument(s), got 0"),
        ("(lambda: 1)()", "not allowed: lambda"),
        ("(1 + 2)(3)", "not allowed: calling the result of an expression"),
        ("lambda: 1", "not allowed: lambda"),
        ("[x for x in range(3)]", "not allowed: comprehensions"),
        ("(1, 2)", "not allowed: tuples"),
        ("[1][0]", "not allowed: indexing"),
        ("1 < 2", "not allowed: comparisons"),
        ("1 and 2", "not allowed: 'and' / 'or'"),
        ("'a' * 3", "not allowed: text"),
        ("True + 1", "not allowed: True"),
        ("1j", "not allowed: 1j"),
        ("x + 1", "unknown name 'x'"),
        ("sqrt", "sqrt is a function"),
        ("1 << 100", "not allowed: the operator LShift"),
        ("2 ^ 10", "use ** "),
        ("1 +", "could not parse the expression"),
        ("1; 2", "could not parse the expression"),
        ("", "the expression is empty"),
        ("1/0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("9**9**9", "exponent is too large"),
        ("2 ** 100000", "exponent is too large"),
        ("10 ** 1000", "more than 1000 digits"),
        ("(10 ** 999) * (10 ** 999)", "more than 1000 digits"),
        ("10.0 ** 400", "too large"),
        ("1e400", "too large"),
        ("exp(1000)", "too large"),
        ("(-8) ** (1 / 3)", "not a real number"),
        ("sqrt(-1)", "sqrt(-1) is undefined for real numbers"),
        ("log(0)", "log(0) is undefined"),
        ("round(1.5, 0.5)", "whole number of digits"),
        ("round(5, -10 ** 50)", "whole number of digits"),
        ("-" * 400 + "1", "nested too deeply"),
        ("(" * 201 + "1" + ")" * 201, "could not parse the expression (too many nested"),
    ],
)
def test_calculator_refuses_with_clear_error(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)
    assert message in str(caught.value)


def test_calculator_refuses_long_input() -> None:
    expression = "+".join(["1"] * (MAX_EXPRESSION_CHARS // 2 + 1))
    assert len(expression) > MAX_EXPRESSION_CHARS
    with pytest.raises(CalculatorError, match="longer than 500 characters"):
        evaluate(expression)
    assert calculator("+".join(["1"] * 250)) == "250"  # a long flat sum is fine
    assert calculator("(" * 150 + "1" + ")" * 150) == "1"


def test_calculator_never_uses_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("eval/exec/compile must not be called")

    for name in ("eval", "exec"):
        monkeypatch.setattr(builtins, name, refuse)
    assert calculator("2 * (3 + 4)") == "14"


async def test_calculator_through_registry(ctx: ToolContext) -> None:
    registry = default_registry()
    assert await registry.execute("calculator", '{"expression": "6 * 7"}', ctx) == ToolOutcome(
        "42", False
    )
    content, is_error = await registry.execute("calculator", '{"expression": "1/0"}', ctx)
    assert (content, is_error) == ("Error: CalculatorError: division by zero", True)


# --- clock --------------------------------------------------------------------------------


def test_current_time_formats(monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = datetime(2025, 3, 7, 9, 5, 30, 123456, tzinfo=UTC)
    monkeypatch.setattr(builtin_tools, "_now", lambda: fixed)
    assert builtin_tools.current_time() == "2025-03-07T09:05:30Z (Friday, 7 March 2025, 09:05 UTC)"


def test_current_time_is_now() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    iso = builtin_tools.current_time().split(" ")[0]
    after = datetime.now(UTC)
    assert before <= datetime.fromisoformat(iso) <= after


# --- workspace tools ----------------------------------------------------------------------


async def test_file_tools_round_trip(ctx: ToolContext) -> None:
    registry = default_registry()

    async def run(name: str, **arguments: str) -> ToolOutcome:
        return await registry.execute(name, json.dumps(arguments), ctx)

    assert await run("list_files") == ToolOutcome("The workspace is empty.", False)
    assert await run("write_file", path="notes.md", content="# Hi\n") == ToolOutcome(
        "Wrote 5 bytes to notes.md (new file).", False
    )
    assert await run("write_file", path="notes.md", content="# Hello\n") == ToolOutcome(
        "Wrote 8 bytes to notes.md (replaced the previous content).", False
    )
    assert await run("edit_file", path="notes.md", old="Hello", new="Hello, world") == ToolOutcome(
        "Edited notes.md: replaced 1 occurrence; the file is now 15 bytes.", False
    )
    assert await run("read_file", path="notes.md") == ToolOutcome("# Hello, world\n", False)
    await run("write_file", path="src/empty.py", content="")
    assert await run("read_file", path="src/empty.py") == ToolOutcome(
        "(src/empty.py is empty)", False
    )
    assert await run("list_files") == ToolOutcome(
        "2 files:\nnotes.md (15 bytes)\nsrc/empty.py (0 bytes)", False
    )
    assert (ctx.workspace.root / "notes.md").read_text() == "# Hello, world\n"


async def test_file_tool_errors_are_readable(ctx: ToolContext) -> None:
    registry = default_registry()
    content, is_error = await registry.execute(
        "write_file", json.dumps({"path": "../../etc/passwd", "content": "x"}), ctx
    )
    assert is_error
    assert content == "Error: WorkspaceError: '..' is not allowed in workspace paths."
    content, is_error = await registry.execute("read_file", '{"path": "missing.md"}', ctx)
    assert is_error
    assert content == (
        "Error: WorkspaceError: File 'missing.md' does not exist. The workspace is empty."
    )
    await registry.execute("write_file", '{"path": "a.txt", "content": "x x"}', ctx)
    content, is_error = await registry.execute(
        "edit_file", '{"path": "a.txt", "old": "x", "new": "y"}', ctx
    )
    assert is_error and "occurs 2 times" in content
    assert "Traceback" not in content


async def test_one_file_listed_in_singular(ctx: ToolContext) -> None:
    ctx.workspace.write("only.txt", "abc")
    assert await default_registry().execute("list_files", "{}", ctx) == ToolOutcome(
        "1 file:\nonly.txt (3 bytes)", False
    )


def test_math_functions_match_python() -> None:
    assert calculator("atan(1) * 4") == format_number(math.pi)
    assert calculator("log2(1024)") == "10"
