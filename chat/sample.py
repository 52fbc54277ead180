"""A sample transcript showing every display type, for a first look at the app."""

from __future__ import annotations

from chat.core.channels import LiveChannels
from chat.core.messages import ToolCall, assistant, system, tool_result, user

SAMPLE_TITLE = "Sample: a tour of the message types"


def sample_channels() -> LiveChannels:
    channels = LiveChannels()
    channels.push_both(system("This is a sample chat. It shows how each kind of message looks."))
    channels.push_both(user("What is 12 × 7, and can you ask a helper to check it?"))
    channels.push_both(
        assistant(
            "",
            reasoning_content="The user wants a product. I will use the calculator tool, "
            "then delegate a check to a sub-agent.",
            tool_calls=[ToolCall("call_sample_1", "calculator", '{"expression": "12*7"}')],
        )
    )
    channels.push_both(tool_result("call_sample_1", "84"))
    channels.push_both(
        assistant(
            "",
            tool_calls=[
                ToolCall("call_sample_2", "delegate", '{"task": "Check 12*7", "label": "checker"}')
            ],
        )
    )
    # The sub-agent speaks while the delegate call is open: shown now, held from context.
    channels.push_labelled(
        assistant(
            "I multiplied 12 by 7 twice and got **84** both times.", sender_name="SubAgent@checker"
        )
    )
    channels.push_both(tool_result("call_sample_2", "Sub-agent report: 12 × 7 = 84 (checked)."))
    channels.push_both(
        assistant(
            "**12 × 7 = 84.** The helper agrees.\n\nHere is the same in Python:\n\n"
            "```python\nprint(12 * 7)  # 84\n```\n\n| a | b | a × b |\n|---|---|---|\n| 12 | 7 | 84 |",
            reasoning_content="The calculator said 84 and the checker agreed.",
        )
    )
    return channels
