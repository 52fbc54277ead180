"""The tool registry: schemas from signatures, policies, and execute()'s error handling."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Literal, Optional

import pytest

from chat.agent.builtin_tools import BUILTIN_TOOL_NAMES, default_registry
from chat.agent.registry import (
    ApprovalPolicy,
    ToolContext,
    ToolOutcome,
    ToolRegistry,
    tool,
    tool_def_from_function,
)
from chat.agent.schema import ToolArgumentError, parse_docstring
from chat.agent.workspace import Workspace

# --- sample tools -------------------------------------------------------------------------


def search(
    query: str,
    limit: int = 5,
    mode: Literal["fast", "deep"] = "fast",
    tags: list[str] | None = None,
    threshold: Optional[float] = None,  # noqa: UP045 - the typing spelling must work too
    exact: bool = False,
    ctx: ToolContext | None = None,
) -> str:
    """Search the notes.

    Looks through every note; slower in deep mode.

    Args:
        query: What to look for.
        limit (int): How many results
            to return at most.
        mode: Search strategy.
        tags: Only notes with these tags.

    Returns:
        The matches.
    """
    return json.dumps(
        {"query": query, "limit": limit, "mode": mode, "tags": tags, "threshold": threshold}
    )


def add(a: int, b: float) -> float:
    """Add two numbers."""
    return a + b


async def async_echo(text: str, ctx: ToolContext) -> str:
    """Echo text back, with the chat id."""
    await asyncio.sleep(0)
    return f"{ctx.chat_id}:{ctx.call_id}:{text}"


def explode(message: str) -> str:
    """Always fails."""
    raise ValueError(message)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=Workspace(tmp_path / "ws"), chat_id="chat-1", call_id="call-9")


@pytest.fixture
def registry() -> ToolRegistry:
    registry = ToolRegistry()
    for fn in (search, add, async_echo, explode):
        registry.register(fn)
    return registry


def props(registry: ToolRegistry, name: str) -> dict:
    return registry.get(name).spec()["function"]["parameters"]["properties"]


# --- schemas ------------------------------------------------------------------------------


def test_spec_has_openai_function_shape(registry: ToolRegistry) -> None:
    spec = registry.get("add").spec()
    assert spec == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    }


def test_description_is_first_paragraph_only(registry: ToolRegistry) -> None:
    assert registry.get("search").description == "Search the notes."


def test_required_only_for_parameters_without_defaults(registry: ToolRegistry) -> None:
    params = registry.get("search").spec()["function"]["parameters"]
    assert params["required"] == ["query"]


def test_ctx_is_excluded_from_schema(registry: ToolRegistry) -> None:
    assert "ctx" not in props(registry, "search")
    assert "ctx" not in props(registry, "async_echo")
    assert registry.get("async_echo").takes_ctx


def test_literal_becomes_enum_with_default(registry: ToolRegistry) -> None:
    assert props(registry, "search")["mode"] == {
        "type": "string",
        "enum": ["fast", "deep"],
        "description": "Search strategy.",
        "default": "fast",
    }


def test_list_and_optional_types(registry: ToolRegistry) -> None:
    properties = props(registry, "search")
    assert properties["tags"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "Only notes with these tags.",
    }
    assert properties["threshold"] == {"type": "number"}
    assert properties["exact"] == {"type": "boolean", "default": False}
    assert properties["limit"]["default"] == 5


def test_docstring_args_with_type_and_continuation_lines(registry: ToolRegistry) -> None:
    assert (
        props(registry, "search")["limit"]["description"] == "How many results to return at most."
    )
    assert props(registry, "search")["query"]["description"] == "What to look for."


def test_parse_docstring_stops_args_at_next_section() -> None:
    description, params = parse_docstring(
        """Do a thing
        over two lines.

        Args:
            x: The x.
              More about x.
            y: The y.
        Raises:
            ValueError: never mentioned as a parameter.
        """
    )
    assert description == "Do a thing over two lines."
    assert params == {"x": "The x. More about x.", "y": "The y."}


def test_required_optional_without_default_is_nullable() -> None:
    def pick(choice: Literal[1, 2] | None) -> str:
        """Pick."""
        return str(choice)

    schema = tool_def_from_function(pick).parameters_schema()
    assert schema["required"] == ["choice"]
    assert schema["properties"]["choice"] == {"type": ["integer", "null"], "enum": [1, 2, None]}


def test_unsupported_signatures_fail_at_registration() -> None:
    def no_hint(x) -> str:  # type: ignore[no-untyped-def]
        return ""

    def var_args(*items: str) -> str:
        return ""

    def odd_type(x: complex) -> str:
        return ""

    def mixed_literal(x: Literal["a", 1]) -> str:
        return ""

    for fn in (no_hint, var_args, odd_type, mixed_literal):
        with pytest.raises(TypeError):
            tool_def_from_function(fn)
    with pytest.raises(TypeError, match="tool name"):
        tool_def_from_function(add, name="has space")


def test_duplicate_names_are_refused(registry: ToolRegistry) -> None:
    with pytest.raises(ValueError, match="already registered"):
        registry.register(add)
    registry.register(add, name="add_again")
    assert "add_again" in registry


# --- policies and the decorator -----------------------------------------------------------


def test_policy_defaults_ask_for_writes_auto_otherwise() -> None:
    @tool(writes=True)
    def save(text: str) -> str:
        """Save."""
        return text

    @tool
    def peek() -> str:
        """Peek."""
        return "x"

    registry = ToolRegistry()
    assert registry.register(save).policy is ApprovalPolicy.ASK
    assert registry.register(peek).policy is ApprovalPolicy.AUTO
    assert save("plain call still works") == "plain call still works"


def test_explicit_policy_and_register_overrides_decorator() -> None:
    @tool(writes=True, policy="auto", timeout=3)
    def save(text: str) -> str:
        """Save."""
        return text

    registry = ToolRegistry()
    tool_def = registry.register(save)
    assert (tool_def.policy, tool_def.writes, tool_def.timeout) == (ApprovalPolicy.AUTO, True, 3)
    other = ToolRegistry().register(save, policy=ApprovalPolicy.DENY, name="save2")
    assert other.policy is ApprovalPolicy.DENY and other.name == "save2"


def test_builtin_write_tools_ask_and_read_tools_do_not() -> None:
    registry = default_registry()
    assert registry.names() == list(BUILTIN_TOOL_NAMES)
    assert registry.policy("write_file") is ApprovalPolicy.ASK
    assert registry.policy("edit_file") is ApprovalPolicy.ASK
    for name in ("calculator", "current_time", "read_file", "list_files"):
        assert registry.policy(name) is ApprovalPolicy.AUTO
    assert default_registry() is not registry  # each caller gets its own copy


def test_registry_decorator_method() -> None:
    registry = ToolRegistry()

    @registry.tool(writes=True)
    def stamp(label: str) -> str:
        """Stamp."""
        return label

    assert registry.get("stamp").policy is ApprovalPolicy.ASK
    assert stamp("x") == "x"


# --- registry views -----------------------------------------------------------------------


def test_names_specs_subset_without(registry: ToolRegistry) -> None:
    assert registry.names() == ["search", "add", "async_echo", "explode"]
    assert [s["function"]["name"] for s in registry.specs(["add", "search"])] == ["add", "search"]
    sub = registry.subset(["explode", "add"])
    assert sub.names() == ["explode", "add"]
    assert registry.without("add", "not-there").names() == ["search", "async_echo", "explode"]
    assert len(registry) == 4  # views never change the original
    with pytest.raises(KeyError, match="unknown tool 'nope'"):
        registry.get("nope")
    with pytest.raises(KeyError):
        registry.specs(["nope"])
    with pytest.raises(KeyError):
        registry.subset(["nope"])


def test_with_policies_returns_changed_copy(registry: ToolRegistry) -> None:
    changed = registry.with_policies({"add": "deny"})
    assert changed.policy("add") is ApprovalPolicy.DENY
    assert registry.policy("add") is ApprovalPolicy.AUTO
    with pytest.raises(KeyError):
        registry.with_policies({"nope": "ask"})


# --- execute ------------------------------------------------------------------------------


async def test_execute_sync_tool_converts_result_to_json(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    outcome = await registry.execute("add", '{"a": 2, "b": 0.5}', ctx)
    assert outcome == ToolOutcome("2.5", False)
    content, is_error = await registry.execute("add", '{"a": 2.0, "b": 1}', ctx)
    assert (json.loads(content), is_error) == (3.0, False)


async def test_execute_passes_defaults_and_validated_values(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    content, is_error = await registry.execute(
        "search", '{"query": "cats", "mode": "deep", "tags": ["a", "b"]}', ctx
    )
    assert not is_error
    assert json.loads(content) == {
        "query": "cats",
        "limit": 5,
        "mode": "deep",
        "tags": ["a", "b"],
        "threshold": None,
    }


async def test_execute_async_tool_receives_ctx(registry: ToolRegistry, ctx: ToolContext) -> None:
    outcome = await registry.execute("async_echo", '{"text": "hi"}', ctx)
    assert outcome == ToolOutcome("chat-1:call-9:hi", False)


async def test_sync_tool_runs_off_the_event_loop(ctx: ToolContext) -> None:
    loop_thread = threading.get_ident()

    def where() -> bool:
        """Which thread."""
        return threading.get_ident() != loop_thread

    registry = ToolRegistry()
    registry.register(where)
    assert await registry.execute("where", "{}", ctx) == ToolOutcome("true", False)


async def test_empty_arguments_mean_no_arguments(ctx: ToolContext) -> None:
    registry = default_registry()
    assert not (await registry.execute("list_files", "", ctx)).is_error
    assert not (await registry.execute("list_files", "  ", ctx)).is_error


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a": 1, "b": ', "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ("null", "must be a JSON object"),
        ('{"a": NaN, "b": 1}', "NaN is not a valid JSON number"),
    ],
)
async def test_bad_json_is_an_error_result(
    registry: ToolRegistry, ctx: ToolContext, arguments: str, expected: str
) -> None:
    content, is_error = await registry.execute("add", arguments, ctx)
    assert is_error
    assert content.startswith("Error: ")
    assert expected in content


async def test_missing_and_unknown_arguments_are_all_reported(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    content, is_error = await registry.execute("add", '{"a": 1, "c": 2, "ctx": 3}', ctx)
    assert is_error
    assert "missing required parameter 'b'" in content
    assert "unknown parameter 'c'" in content
    assert "unknown parameter 'ctx'" in content  # the injected context can't be spoofed
    assert "Expected: a (an integer, required), b (a number, required)" in content


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a": "1", "b": 2}', "parameter 'a' must be an integer, got string \"1\""),
        ('{"a": 1.5, "b": 2}', "parameter 'a' must be an integer, got number 1.5"),
        ('{"a": true, "b": 2}', "parameter 'a' must be an integer, got boolean true"),
        ('{"a": 1, "b": null}', "parameter 'b' must be a number, got null"),
        ('{"a": 1, "b": [2]}', "parameter 'b' must be a number, got array [2]"),
    ],
)
async def test_wrong_types_are_reported(
    registry: ToolRegistry, ctx: ToolContext, arguments: str, expected: str
) -> None:
    content, is_error = await registry.execute("add", arguments, ctx)
    assert is_error
    assert expected in content


async def test_wrong_enum_and_list_item_types(registry: ToolRegistry, ctx: ToolContext) -> None:
    content, is_error = await registry.execute("search", '{"query": "q", "mode": "slow"}', ctx)
    assert is_error and 'must be one of "fast", "deep", got "slow"' in content
    content, is_error = await registry.execute("search", '{"query": "q", "tags": ["a", 1]}', ctx)
    assert is_error and "parameter 'tags'[1] must be a string, got integer 1" in content
    content, is_error = await registry.execute("search", '{"query": "q", "exact": "yes"}', ctx)
    assert is_error and "parameter 'exact' must be true or false" in content


async def test_parse_arguments_for_approval_cards(registry: ToolRegistry) -> None:
    assert registry.parse_arguments("add", '{"b": 1, "a": 2}') == {"a": 2, "b": 1.0}
    with pytest.raises(ToolArgumentError, match="missing required parameter 'b'"):
        registry.parse_arguments("add", '{"a": 2}')


async def test_unknown_tool_is_an_error_result(registry: ToolRegistry, ctx: ToolContext) -> None:
    content, is_error = await registry.execute("rm_rf", "{}", ctx)
    assert is_error
    assert content == (
        "Error: unknown tool 'rm_rf'. Available tools: search, add, async_echo, explode."
    )


async def test_denied_tool_never_runs(ctx: ToolContext) -> None:
    calls: list[str] = []

    def risky() -> str:
        """Risky."""
        calls.append("ran")
        return "ran"

    registry = ToolRegistry()
    registry.register(risky, policy=ApprovalPolicy.DENY)
    content, is_error = await registry.execute("risky", "{}", ctx)
    assert is_error and "disabled" in content
    assert calls == []


async def test_exception_becomes_error_text_without_traceback(
    registry: ToolRegistry, ctx: ToolContext
) -> None:
    outcome = await registry.execute("explode", '{"message": "the disk is on fire"}', ctx)
    assert outcome == ToolOutcome("Error: ValueError: the disk is on fire", True)
    assert "Traceback" not in outcome.content


async def test_exception_in_async_tool_and_empty_message(ctx: ToolContext) -> None:
    async def broken() -> str:
        """Broken."""
        raise KeyboardInterruptLike()

    registry = ToolRegistry()
    registry.register(broken)
    assert await registry.execute("broken", "{}", ctx) == ToolOutcome(
        "Error: KeyboardInterruptLike", True
    )


class KeyboardInterruptLike(RuntimeError):
    pass


async def test_async_tool_timeout(ctx: ToolContext) -> None:
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(30)
        return "late"

    registry = ToolRegistry()
    registry.register(slow)
    outcome = await registry.execute("slow", "{}", ctx, timeout=0.05)
    assert outcome == ToolOutcome("Error: Tool slow timed out after 0.05 s.", True)


async def test_sync_tool_timeout(ctx: ToolContext) -> None:
    release = threading.Event()

    def blocking() -> str:
        """Blocks until released."""
        release.wait(10)
        return "done"

    registry = ToolRegistry()
    registry.register(blocking)
    try:
        outcome = await registry.execute("blocking", "{}", ctx, timeout=0.05)
    finally:
        release.set()  # let the worker thread finish
    assert outcome == ToolOutcome("Error: Tool blocking timed out after 0.05 s.", True)


async def test_tool_declared_timeout_wins_over_callers(ctx: ToolContext) -> None:
    async def slow() -> str:
        """Slow."""
        await asyncio.sleep(30)
        return "late"

    registry = ToolRegistry()
    registry.register(slow, timeout=0.05)
    outcome = await registry.execute("slow", "{}", ctx, timeout=60)
    assert outcome == ToolOutcome("Error: Tool slow timed out after 0.05 s.", True)


async def test_tools_own_timeout_error_is_not_reported_as_ours(ctx: ToolContext) -> None:
    async def upstream() -> str:
        """Upstream."""
        raise TimeoutError("upstream did not answer")

    registry = ToolRegistry()
    registry.register(upstream)
    outcome = await registry.execute("upstream", "{}", ctx, timeout=5)
    assert outcome == ToolOutcome("Error: TimeoutError: upstream did not answer", True)


async def test_cancellation_propagates(ctx: ToolContext) -> None:
    started = asyncio.Event()

    async def wait_forever() -> str:
        """Waits."""
        started.set()
        await asyncio.sleep(30)
        return "never"

    registry = ToolRegistry()
    registry.register(wait_forever)
    task = asyncio.create_task(registry.execute("wait_forever", "{}", ctx, timeout=60))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_result_conversion_and_truncation(ctx: ToolContext) -> None:
    def nothing() -> None:
        """Nothing."""

    def structured() -> dict:
        """Structured."""
        return {"ok": True, "items": [1, "é"]}

    def huge() -> str:
        """Huge."""
        return "x" * 150

    registry = ToolRegistry(max_output_chars=100)
    for fn in (nothing, structured, huge):
        registry.register(fn)
    assert await registry.execute("nothing", "{}", ctx) == ToolOutcome("(no output)", False)
    content, _ = await registry.execute("structured", "{}", ctx)
    assert content == '{"ok": true, "items": [1, "é"]}'
    content, is_error = await registry.execute("huge", "{}", ctx)
    assert not is_error
    assert content == "x" * 100 + "\n…[truncated 50 more characters]"
