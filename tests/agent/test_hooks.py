"""The Python hook registry (chat.agent.hooks)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from chat.agent.hooks import (
    HOOK_EVENTS_ATTRIBUTE,
    HookContext,
    HookEvent,
    HookRegistry,
    HookResult,
    hook,
)
from chat.core.messages import ChatMessage, user

PRE = HookEvent.PRE_LLM_REQUEST


def context(**fields) -> HookContext:
    return HookContext(event=PRE, messages=[user("hi")], system_prompt="base", **fields)


# Module-level hooks for from_dotted_paths.
@hook("pre_llm_request", HookEvent.PRE_AUTO_COMPACT)
def marked_hook(ctx: HookContext) -> HookResult:
    return HookResult(additional_context=f"marked:{ctx.event}")


def unmarked_hook(ctx: HookContext) -> None:
    return None


async def test_hooks_run_in_order_and_see_earlier_replacements() -> None:
    registry = HookRegistry()
    seen: list[str | None] = []

    def first(ctx: HookContext) -> HookResult:
        seen.append(ctx.system_prompt)
        return HookResult(system_prompt=ctx.system_prompt + " +first")

    async def second(ctx: HookContext) -> HookResult:
        seen.append(ctx.system_prompt)
        return HookResult(system_prompt=ctx.system_prompt + " +second")

    registry.register(PRE, first)
    registry.register("pre_llm_request", second)
    result = await registry.run(PRE, context())
    assert seen == ["base", "base +first"]
    assert result == HookResult(system_prompt="base +first +second")


async def test_fields_are_merged_and_later_hooks_see_replaced_messages() -> None:
    registry = HookRegistry()
    replacement = [user("replaced")]
    seen: list[list[ChatMessage] | None] = []

    registry.register(PRE, lambda ctx: HookResult(messages=replacement))

    def reads(ctx: HookContext) -> HookResult:
        seen.append(ctx.messages)
        return HookResult(system_prompt="new prompt")

    registry.register(PRE, reads)
    registry.register(PRE, lambda ctx: None)  # no change
    result = await registry.run(PRE, context())
    assert seen == [replacement]
    assert result is not None
    assert result.messages == replacement
    assert result.system_prompt == "new prompt"
    assert result.action is None


async def test_inject_messages_and_additional_context_accumulate() -> None:
    registry = HookRegistry()
    registry.register(
        PRE, lambda ctx: HookResult(inject_messages=[user("a")], additional_context="one")
    )
    registry.register(PRE, lambda ctx: HookResult(inject_messages=[user("b"), user("c")]))
    registry.register(PRE, lambda ctx: HookResult(additional_context="two"))
    result = await registry.run(PRE, context())
    assert result is not None
    assert [m.content for m in result.inject_messages] == ["a", "b", "c"]
    assert result.additional_context == "one\n\ntwo"


@pytest.mark.parametrize("action", ["stop", "skip"])
async def test_stop_or_skip_returns_at_once_and_discards_earlier_changes(action: str) -> None:
    registry = HookRegistry()
    later_calls: list[str] = []
    registry.register(
        PRE, lambda ctx: HookResult(system_prompt="changed", inject_messages=[user("x")])
    )
    registry.register(PRE, lambda ctx: HookResult(action=action, additional_context="why"))
    registry.register(PRE, lambda ctx: later_calls.append("ran"))
    result = await registry.run(PRE, context())
    assert result == HookResult(action=action, additional_context="why")
    assert later_calls == []


async def test_a_failing_hook_is_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    registry = HookRegistry()

    def broken(ctx: HookContext) -> HookResult:
        raise ValueError("boom")

    async def wrong_type(ctx: HookContext) -> dict:
        return {"system_prompt": "not a HookResult"}

    registry.register(PRE, lambda ctx: HookResult(system_prompt="kept"))
    registry.register(PRE, broken, name="broken")
    registry.register(PRE, wrong_type, name="wrong_type")
    registry.register(PRE, lambda ctx: HookResult(inject_messages=[user("after")]))
    with caplog.at_level(logging.WARNING, logger="chat.agent.hooks"):
        result = await registry.run(PRE, context())
    assert result is not None
    assert result.system_prompt == "kept"
    assert [m.content for m in result.inject_messages] == ["after"]
    assert "broken" in caplog.text and "boom" in caplog.text
    assert "wrong_type" in caplog.text


async def test_on_error_stop_turns_a_failure_into_a_stop() -> None:
    registry = HookRegistry()
    registry.register(PRE, lambda ctx: HookResult(system_prompt="discarded"))
    registry.register(PRE, lambda ctx: 1 / 0, on_error="stop")
    assert await registry.run(PRE, context()) == HookResult(action="stop")


async def test_a_hook_past_its_timeout_counts_as_an_error() -> None:
    registry = HookRegistry()

    async def slow(ctx: HookContext) -> HookResult:
        await asyncio.sleep(10)
        return HookResult(system_prompt="too late")

    def slow_sync(ctx: HookContext) -> HookResult:
        time.sleep(0.5)
        return HookResult(system_prompt="too late as well")

    registry.register(PRE, slow, timeout=0.05)
    registry.register(PRE, slow_sync, timeout=0.05)
    registry.register(PRE, lambda ctx: HookResult(additional_context="still runs"))
    result = await registry.run(PRE, context())
    assert result == HookResult(additional_context="still runs")


async def test_hooks_after_the_chain_budget_do_not_run() -> None:
    registry = HookRegistry(chain_timeout=0.05)
    calls: list[str] = []

    async def slow(ctx: HookContext) -> None:
        await asyncio.sleep(10)

    registry.register(PRE, slow)  # its own 5 s timeout is capped by the chain budget
    registry.register(PRE, lambda ctx: calls.append("late"))
    assert await registry.run(PRE, context()) is None
    assert calls == []


async def test_none_when_no_hook_returns_anything() -> None:
    registry = HookRegistry()
    assert await registry.run(PRE, context()) is None  # no hooks at all
    registry.register(PRE, lambda ctx: None)
    assert await registry.run(PRE, context()) is None
    registry.register(PRE, lambda ctx: HookResult())
    assert await registry.run(PRE, context()) == HookResult()


async def test_hooks_only_run_for_their_event() -> None:
    registry = HookRegistry()
    registry.register(HookEvent.POST_TOOL_EXECUTION, lambda ctx: HookResult(tool_result="short"))
    assert await registry.run(PRE, context()) is None
    post = HookContext(event=HookEvent.POST_TOOL_EXECUTION, tool_name="shell", tool_result="long")
    result = await registry.run(HookEvent.POST_TOOL_EXECUTION, post)
    assert result == HookResult(tool_result="short")
    assert registry.has_hooks("post_tool_execution") and not registry.has_hooks(PRE)


async def test_hooks_cannot_change_the_callers_context_in_place() -> None:
    registry = HookRegistry()

    def meddles(ctx: HookContext) -> None:
        ctx.system_prompt = "mutated"
        assert ctx.messages is not None
        ctx.messages.append(user("sneaky"))

    registry.register(PRE, meddles)
    original = context()
    assert await registry.run(PRE, original) is None
    assert original.system_prompt == "base"
    assert [m.content for m in original.messages or []] == ["hi"]


async def test_async_callable_objects_are_awaited() -> None:
    class Hook:
        async def __call__(self, ctx: HookContext) -> HookResult:
            return HookResult(system_prompt="from object")

    registry = HookRegistry()
    registry.register(PRE, Hook())
    assert await registry.run(PRE, context()) == HookResult(system_prompt="from object")


async def test_from_dotted_paths_registers_marked_functions_for_their_events() -> None:
    registry = HookRegistry.from_dotted_paths(["tests.agent.test_hooks.marked_hook"])
    assert getattr(marked_hook, HOOK_EVENTS_ATTRIBUTE) == (PRE, HookEvent.PRE_AUTO_COMPACT)
    assert [h.function for h in registry.hooks_for(PRE)] == [marked_hook]
    compacting = HookContext(event=HookEvent.PRE_AUTO_COMPACT)
    result = await registry.run(HookEvent.PRE_AUTO_COMPACT, compacting)
    assert result == HookResult(additional_context="marked:pre_auto_compact")


def test_from_dotted_paths_fails_loudly_on_bad_configuration() -> None:
    with pytest.raises(ValueError, match="not marked"):
        HookRegistry.from_dotted_paths(["tests.agent.test_hooks.unmarked_hook"])
    with pytest.raises(ValueError, match="has no"):
        HookRegistry.from_dotted_paths(["tests.agent.test_hooks.missing"])
    with pytest.raises(ValueError, match="must look like"):
        HookRegistry.from_dotted_paths(["nodots"])
    with pytest.raises(ModuleNotFoundError):
        HookRegistry.from_dotted_paths(["no_such_module_here.function"])


def test_unknown_events_are_rejected() -> None:
    with pytest.raises(ValueError):
        HookRegistry().register("post_everything", lambda ctx: None)
    with pytest.raises(ValueError):
        hook("nope")
    with pytest.raises(ValueError):
        hook()
