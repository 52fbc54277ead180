"""The bubbles of a reply spoken by several personas, as the page receives them while
they are written: one labelled bubble per persona, the typing dots on the one being
written, the reasoning folded in the first; the same whether pushed live or rendered
for a page that attaches mid-stream."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from chat.presentation import fragments
from chat.runhost.host import DjangoRunHost

CAST = ["Ada", "Maya", "Leo"]
REPLY = (
    "<Ada>Start with **halves**: what is 1/2 + 1/4?</Ada>\n"
    "<Maya>Why do we need a *common* denominator?\n\n- one\n- two</Maya>\n"
    "<Leo>I think it is `3/4`.</Leo>"
)


def _bubbles(html: str) -> list[tuple[str, bool, str]]:
    """(the bubble's accessible name, typing dots shown, its text) per bubble, in order."""
    found = []
    for article in re.findall(r"<article\b.*?</article>", html, re.S):
        name = re.search(r'aria-label="([^"]*)"', article)
        text = re.sub(r"<[^>]+>", "", article.split('class="msg-label"', 1)[1])
        text = " ".join(text.replace("●●●", "").split()).lstrip(">").strip()
        found.append((name.group(1) if name else "", "●●●" in article, text))
    return found


def _host() -> DjangoRunHost:
    run = SimpleNamespace(chat_id="c1", pk="run-1", speakers=CAST)  # what the host reads
    return DjangoRunHost(run, [])  # type: ignore[arg-type]


def test_one_labelled_bubble_per_persona_the_dots_on_the_last():
    html = fragments.stream_slot(
        "run-1", voices=[("Ada", "<p>One.</p>"), ("Maya", "<p>Two.</p>")], reasoning=""
    )
    assert html.startswith('<div id="stream" class="stream-voices" data-run="run-1"')
    assert 'aria-label="Replies being written"' in html
    assert 'hx-swap-oob="true"' in html
    assert _bubbles(html) == [("Ada", False, "Ada One."), ("Maya", True, "Maya Two.")]
    assert "oob" not in fragments.stream_slot("run-1", voices=[("Ada", "x")], oob=False)


def test_a_new_persona_takes_the_dots_and_earlier_bubbles_stay_as_they_were():
    first = fragments.stream_slot("run-1", voices=[("Ada", "<p>One.</p>")])
    assert _bubbles(first) == [("Ada", True, "Ada One.")]
    second = fragments.stream_slot("run-1", voices=[("Ada", "<p>One.</p>"), ("Maya", "<p>T</p>")])
    third = fragments.stream_slot("run-1", voices=[("Ada", "<p>One.</p>"), ("Maya", "<p>Tw</p>")])
    assert _bubbles(second) == [("Ada", False, "Ada One."), ("Maya", True, "Maya T")]
    assert _bubbles(third) == [("Ada", False, "Ada One."), ("Maya", True, "Maya Tw")]
    # Another run's bubbles with the same text show that run's id, not a cached one.
    other = fragments.stream_slot("run-2", voices=[("Ada", "<p>One.</p>"), ("Maya", "<p>T</p>")])
    assert 'data-run="run-2"' in other and "run-1" not in other


def test_reasoning_is_folded_in_the_first_bubble_or_alone_before_any_reply():
    alone = fragments.stream_slot("run-1", reasoning="Ada should lead.", voices=[])
    assert [(name, dots) for name, dots, _text in _bubbles(alone)] == [("", True)]
    assert '<details class="reasoning" open>' in alone and "Ada should lead." in alone
    html = fragments.stream_slot(
        "run-1", reasoning="Ada should lead.", voices=[("Ada", "<p>a</p>"), ("Maya", "<p>b</p>")]
    )
    assert html.count('<details class="reasoning" open>') == 1
    assert html.index("Ada should lead.") < html.index("<p>a</p>")


def test_names_reasoning_and_run_id_are_escaped():
    html = fragments.stream_slot(
        '"><script>1</script>',
        reasoning="<b>bold?</b>",
        voices=[('<img src=x onerror="alert(1)">', "<p>ok</p>"), ("Maya", "<p>b</p>")],
    )
    assert "<script>" not in html and "<img" not in html and "<b>bold" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html


def test_a_single_reply_still_has_its_own_slot():
    html = fragments.stream_slot("run-1", "<p>Hello</p>", "")
    assert html.startswith('<article id="stream" class="msg assistant streaming"')
    assert 'aria-label="Reply being written"' in html
    assert "idle" in fragments.stream_slot()
    # A slot with no run is the idle one, whatever else it is given.
    assert fragments.stream_slot(voices=[("Ada", "x")]) == fragments.stream_slot()


@pytest.mark.parametrize("step", [1, 3, 7, 40])
def test_live_pushes_show_what_a_page_attaching_mid_stream_shows(step):
    host = _host()
    for end in range(step, len(REPLY) + step, step):
        text = REPLY[:end]
        live = fragments.stream_slot("run-1", voices=host._voices_html(text), reasoning="Hm.")
        attached = fragments.partial_stream_slot("run-1", text, "Hm.", CAST)
        assert live == attached, text
    assert [name for name, _dots, _text in _bubbles(live)] == CAST
    assert [dots for _name, dots, _text in _bubbles(live)] == [False, False, True]
