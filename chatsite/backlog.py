"""A listen queue of 2048 connections for Daphne's ``-b``/``-p`` (Twisted's default is 50).

With 50, a burst of connections that arrives while the event loop is busy (a hundred
clients opening streams at once) overflows the kernel's accept queue; the dropped SYNs
are sent again only after a second, so those clients wait a second for their first
byte. 2048 is uvicorn's and gunicorn's default (the kernel caps it at ``somaxconn``).
Endpoints given to Daphne with ``-e`` keep what they say. ``install()`` is called by
``chatsite/asgi.py``, which Daphne imports before it builds its endpoints.
"""

from __future__ import annotations

from typing import Any

BACKLOG = 2048
_INSTALLED = "_lyceum_backlog"


def with_backlog(descriptions: list[str]) -> list[str]:
    return [
        f"{d}:backlog={BACKLOG}" if d.startswith("tcp:") and ":backlog=" not in d else d
        for d in descriptions
    ]


def install() -> None:
    from daphne import cli

    build = cli.build_endpoint_description_strings
    if getattr(build, _INSTALLED, False):
        return

    def build_with_backlog(*args: Any, **kwargs: Any) -> list[str]:
        return with_backlog(build(*args, **kwargs))

    setattr(build_with_backlog, _INSTALLED, True)
    cli.build_endpoint_description_strings = build_with_backlog
