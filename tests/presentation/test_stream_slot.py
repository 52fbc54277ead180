"""The stream slot is rendered once per shape and filled in (fragments.stream_slot)."""

from __future__ import annotations

import uuid

import pytest
from django.utils import translation

from chat.presentation import fragments

REASONINGS = ["", "plan: a < b && c > \"d\" 'e'\nline two\r\nthree", "\ue000text\ue000 {} %s"]
BODIES = ["", "<p>Hello <strong>world</strong> &amp; more</p>\n", "<p>\ue000run\ue000</p>"]


@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize("oob", [True, False])
@pytest.mark.parametrize("reasoning", REASONINGS)
@pytest.mark.parametrize("body", BODIES)
def test_the_slot_filled_in_is_the_slot_the_template_renders(language, oob, reasoning, body):
    run_id = str(uuid.uuid4())
    with translation.override(language):
        filled = fragments.stream_slot(run_id, body, reasoning, oob=oob)
        assert filled == fragments._stream_slot_uncached(run_id, body, reasoning, oob)


def test_the_run_id_and_the_reasoning_are_escaped():
    html = fragments.stream_slot('r"><script>', "<p>ok</p>", '<b>bold</b> & "q"\nnext')
    assert "<script>" not in html and 'data-run="r&quot;&gt;&lt;script&gt;"' in html
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &quot;q&quot;<br>next" in html
    assert '<div class="bubble markdown"><p>ok</p></div>' in html  # sanitised already
    assert "\ue000" not in html


def test_an_empty_reply_and_reasoning_leave_their_elements_out():
    html = fragments.stream_slot("run-1")
    assert 'data-run="run-1"' in html
    assert "bubble" not in html and "reasoning" not in html
