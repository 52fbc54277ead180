"""Fragments rendered once (per language) and filled in: the composer, the run's controls
and its status line give what rendering their templates gives."""

from __future__ import annotations

import uuid

import pytest
from django.template.loader import render_to_string
from django.utils import translation

from chat.presentation import fragments


@pytest.mark.parametrize("language", ["en", "zh-hans"])
def test_the_composer_and_the_controls_filled_in_are_the_ones_rendered(language):
    for chat_id in (str(uuid.uuid4()), str(uuid.uuid4())):
        with translation.override(language):
            composer = render_to_string("chat/_composer.html", {"oob": True, "chat_id": chat_id})
            assert fragments.composer_reset(chat_id) == composer
            assert chat_id in composer and fragments._TITLE_PK not in composer
            for busy in (True, False):
                controls = render_to_string(
                    "chat/_controls.html", {"oob": True, "busy": busy, "chat_id": chat_id}
                )
                assert fragments.controls(busy, chat_id) == controls


@pytest.mark.parametrize("text", ["Thinking…", "", 'a <b> & "q"'])
def test_the_status_line_is_the_one_rendered(text):
    expected = render_to_string("chat/_run_status.html", {"oob": True, "status_text": text})
    assert fragments.run_status(text) == fragments.run_status(text) == expected


@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize(
    "usage",
    [
        {"tokens": 0, "context_window": 128000},
        {"tokens": 1234567, "context_window": 1048576, "measured": True},
        {"tokens": 42, "context_window": 8192},
    ],
)
def test_the_gauge_filled_in_is_the_one_rendered(language, usage):
    with translation.override(language):
        expected = render_to_string("chat/_gauge.html", {"oob": True, "usage": usage})
        assert fragments.gauge(usage) == expected
        assert str(usage["tokens"]) in expected


def test_a_gauge_with_other_values_is_rendered_as_it_is():
    usage = {"tokens": "12", "context_window": None}
    expected = render_to_string("chat/_gauge.html", {"oob": True, "usage": usage})
    assert fragments.gauge(usage) == expected
