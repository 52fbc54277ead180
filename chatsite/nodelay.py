"""TCP_NODELAY on every connection Daphne accepts (Twisted leaves Nagle on).

With Nagle on, a small write that follows another still unacknowledged waits for the
peer's delayed ACK (40 ms on Linux, more elsewhere): the first event of a stream, a small
JSON reply after its headers. ``install()`` is called by ``chatsite/asgi.py``, so every
way of serving the app (``make run``'s ``daphne chatsite.asgi:application``, the test
server, a deployment's own Daphne command) gets it; it patches Daphne's HTTP factory once.
"""

from __future__ import annotations

import contextlib
from typing import Any

_INSTALLED = "_lyceum_nodelay"


def install() -> None:
    from daphne.http_protocol import HTTPFactory

    if getattr(HTTPFactory, _INSTALLED, False):
        return
    build = HTTPFactory.buildProtocol

    def build_protocol(self: Any, addr: Any) -> Any:
        protocol = build(self, addr)
        made = protocol.connectionMade

        def connection_made() -> None:
            with contextlib.suppress(Exception):  # a UNIX socket has no Nagle
                protocol.transport.setTcpNoDelay(True)
            made()

        protocol.connectionMade = connection_made
        return protocol

    HTTPFactory.buildProtocol = build_protocol  # type: ignore[method-assign]
    setattr(HTTPFactory, _INSTALLED, True)
