"""Panels other apps add to the home page (the classroom: "Your classes").

Chat never imports those apps: they register a function here that renders their
panel for a request (HTML of our own templates), in their ``ready()``.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest
from django.utils.safestring import SafeString, mark_safe

HomePanel = Callable[[HttpRequest], str]
_home_panels: list[HomePanel] = []


def register_home_panel(panel: HomePanel) -> None:
    if panel not in _home_panels:
        _home_panels.append(panel)


def home_panels(request: HttpRequest) -> list[SafeString]:
    return [mark_safe(panel(request)) for panel in _home_panels]  # noqa: S308 - our templates
