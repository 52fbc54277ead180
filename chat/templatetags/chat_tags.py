from django import template
from django.utils.safestring import mark_safe

from chat.rendering import render_markdown

register = template.Library()


@register.filter
def markdown(text: str) -> str:
    """Untrusted markdown → sanitised HTML (see chat.rendering)."""
    return mark_safe(render_markdown(text or ""))  # noqa: S308 - sanitised by nh3
