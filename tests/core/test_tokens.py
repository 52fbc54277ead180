"""The token estimate: one function, the same answer whichever path computes it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from chat.core import tokens
from chat.core.messages import ChatMessage, Image, ToolCall

texts = st.text(max_size=300) | st.text(alphabet="abc xyz{}\"':,", max_size=300)
messages = st.builds(
    ChatMessage,
    role=st.sampled_from(["user", "assistant", "tool", "system"]),
    content=texts,
    tool_calls=st.none() | st.lists(st.builds(ToolCall, id=texts, name=texts, arguments=texts)),
    reasoning_content=st.none() | texts,
    images=st.none() | st.lists(st.just(Image("aGk=", "image/png")), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, max_size=20))
def test_estimate_each_agrees_with_the_per_message_estimate(batch):
    assert tokens.estimate_each(batch) == [tokens.estimate_message_tokens(m) for m in batch]
    assert sum(tokens.estimate_each(batch)) == tokens.estimate_tokens(batch)


def test_ascii_text_is_about_four_characters_a_token_plus_overhead():
    message = ChatMessage(role="user", content="x" * 400)
    assert tokens.estimate_each([message]) == [tokens.MESSAGE_OVERHEAD_TOKENS + 100]


def test_a_replaced_estimator_is_used_everywhere():
    class Flat:
        def text_tokens(self, text: str) -> int:
            return 1

        def message_tokens(self, message: ChatMessage) -> int:
            return 7

    previous = tokens.set_estimator(Flat())
    try:
        batch = [ChatMessage(role="user", content="hello")] * 3
        assert tokens.estimate_each(batch) == [7, 7, 7]
        assert tokens.estimate_tokens(batch) == 21
    finally:
        tokens.set_estimator(previous)
