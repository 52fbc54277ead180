"""The title fragment is rendered once per language and filled in (fragments.title)."""

from __future__ import annotations

import uuid

import pytest
from django.utils import translation

from chat.presentation import fragments

TITLES = ["hello world", "a <b> & \"q\" 'x' {} %s", "ü 日本語", "  spaces  "]


@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize("text", TITLES)
def test_the_title_filled_in_is_the_title_rendered(language, text):
    chat_id = str(uuid.uuid4())
    with translation.override(language):
        assert fragments.title(chat_id, text) == fragments._title_uncached(chat_id, text)


def test_a_title_is_escaped_and_the_chat_linked():
    chat_id = str(uuid.uuid4())
    html = fragments.title(chat_id, "<script>x</script>")
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert f"/chat/{chat_id}/rename/" in html and f'id="chat-link-{chat_id}"' in html
    assert fragments._TITLE_PK not in html and fragments._TITLE_TEXT not in html
