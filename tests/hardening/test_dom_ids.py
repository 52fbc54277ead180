"""§5 of issue 14: tool-call element ids are one-to-one with call ids."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from chat.presentation.display import call_dom_id

SAFE = re.compile(r"[A-Za-z0-9_-]+")


def test_ids_that_slugified_alike_stay_apart():
    ids = ["call_1", "call-1", "Call_1", "call 1", "call__1", "call_5f_1", "", "é", "e"]
    dom_ids = [call_dom_id(i) for i in ids]
    assert len(set(dom_ids)) == len(ids), dom_ids


@given(st.text(max_size=30), st.text(max_size=30))
def test_call_dom_id_is_injective_and_safe(a, b):
    assert SAFE.fullmatch(call_dom_id(a))
    if a != b:
        assert call_dom_id(a) != call_dom_id(b)
