"""The streaming parser of tagged persona segments (``chat.core.voices``), as properties.

Whatever way the model's output is cut into chunks, the parser ends with the same
replies; it never keeps more than three; names outside the cast are dropped; and an
output it cannot parse is one reply of the fallback speaker (the AI teacher) with the
raw text. While streaming, each bubble only grows.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from chat.core.voices import (
    MAX_REPLIES,
    Voices,
    VoiceSplitter,
    cast_from_prompt,
    cast_instructions,
    split_reply,
)

CAST = ("Ada", "Theo", "Maya", "Leo")
VOICES = Voices(CAST)
STRANGERS = ("Bob", "Zed", "Ada Lovelace")

words = st.text(alphabet=st.sampled_from(list("abc xyz.,!?\n<>/=é—")), min_size=0, max_size=30)
names = st.sampled_from(CAST + STRANGERS + ("ada", "MAYA"))


@st.composite
def segment(draw) -> str:
    name = draw(names)
    body = draw(words)
    closing = draw(st.sampled_from(["</{}>", "</{}>", "</{}>", "", "</Other>"])).format(name)
    gap = draw(st.sampled_from(["", "\n", " ", "\n\n", " stray "]))
    return f"<{name}>{body}{closing}{gap}"


outputs = st.one_of(
    st.lists(segment(), min_size=0, max_size=6).map("".join),
    words,  # plain text, maybe with stray angle brackets
    st.tuples(words, st.lists(segment(), max_size=3).map("".join)).map("".join),
)


@st.composite
def chunkings(draw, text: str) -> list[str]:
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=12))))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def fed(chunks: list[str]) -> tuple[VoiceSplitter, list[list[tuple[str, str]]]]:
    splitter = VoiceSplitter(VOICES)
    seen = []
    for chunk in chunks:
        splitter.feed(chunk)
        seen.append(splitter.replies())
    return splitter, seen


@given(st.data(), outputs)
@example(None, "<Ada>Hello</Ada><Maya>Hi!</Maya>")
def test_any_chunking_gives_the_same_replies(data, text):
    whole = split_reply(VOICES, text)
    chunks = data.draw(chunkings(text)) if data is not None else list(text)
    splitter, _ = fed(chunks)
    assert splitter.finish() == whole
    one_char, _ = fed(list(text))
    assert one_char.finish() == whole


@given(st.data(), outputs)
def test_never_more_than_three_replies_even_while_streaming(data, text):
    splitter, seen = fed(data.draw(chunkings(text)))
    assert all(len(replies) <= MAX_REPLIES for replies in seen)
    assert len(splitter.finish()) <= MAX_REPLIES


@given(st.data(), outputs)
def test_only_cast_members_speak_and_bubbles_only_grow(data, text):
    splitter, seen = fed(data.draw(chunkings(text)))
    final = splitter.finish()
    assert {speaker for speaker, _ in final} <= set(CAST)
    tagged = [reply for reply in seen if reply]
    for earlier, later in zip(tagged, [*tagged[1:], final], strict=False):
        assert len(later) >= len(earlier)
        for (name_a, text_a), (name_b, text_b) in zip(earlier, later, strict=False):
            assert name_a == name_b
            assert text_b.startswith(text_a)


@given(words.filter(lambda t: "<" not in t and t.strip()))
def test_plain_text_falls_back_to_the_first_cast_member_with_the_raw_text(text):
    assert split_reply(VOICES, text) == [("Ada", text.strip())]


def test_the_rules_by_example():
    assert split_reply(VOICES, "<ada>One</ada>\n<MAYA>Two</MAYA>") == [
        ("Ada", "One"),
        ("Maya", "Two"),
    ]
    four = "".join(f"<{n}>{n} speaks</{n}>" for n in CAST)
    assert [s for s, _ in split_reply(VOICES, four)] == ["Ada", "Theo", "Maya"]
    assert split_reply(VOICES, "<Bob>not here</Bob><Leo>here</Leo>") == [("Leo", "here")]
    # Only strangers: nothing parseable, so the raw text from the fallback speaker.
    assert split_reply(VOICES, "<Bob>hi</Bob>") == [("Ada", "<Bob>hi</Bob>")]
    # An unclosed last segment keeps its text (a stopped stream keeps partials).
    assert split_reply(VOICES, "<Ada>done</Ada><Theo>half way") == [
        ("Ada", "done"),
        ("Theo", "half way"),
    ]


def test_the_cast_instructions_round_trip_through_the_prompt():
    prompt = "Scene stuff\n\n" + cast_instructions(VOICES, {"Ada": "AI teacher. Kind."})
    assert cast_from_prompt(prompt) == list(CAST)
    assert "- Ada: AI teacher. Kind." in prompt
