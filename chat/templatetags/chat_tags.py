import json

from django import template
from django.utils.safestring import mark_safe
from django.utils.translation import gettext

from chat.artifacts import human_size
from chat.presentation.markdown import render_markdown_uncached

register = template.Library()


@register.filter
def markdown(text: str) -> str:
    """A reply being written: untrusted markdown → sanitised HTML (never cached)."""
    return mark_safe(render_markdown_uncached(text or ""))  # noqa: S308 - sanitised by nh3


@register.filter
def pretty_json(value) -> str:
    """A tool call's arguments, readable (auto-escaped by the template)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False)


@register.filter
def filesize(value) -> str:
    """``1.2 KB``: an artifact's size as people read it."""
    return human_size(int(value or 0))


@register.filter
def basename(path: str) -> str:
    return str(path or "").rsplit("/", 1)[-1]


@register.filter
def translated(text) -> str:
    """A text stored in English in the log (an error's message), in the page's language
    when it is one of the app's own texts (marked ``gettext_noop`` where it is written);
    anything else, such as a provider's own words, as it is."""
    return gettext(str(text)) if text else ""
