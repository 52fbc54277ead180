"""Daphne with TCP_NODELAY on every accepted connection (Twisted leaves Nagle on).

Run: ``python bench/daphne_nodelay.py -b 127.0.0.1 -p 8000 chatsite.asgi:application``
"""

from __future__ import annotations

import contextlib
import sys

from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory

_build = HTTPFactory.buildProtocol


def _build_nodelay(self, addr):  # type: ignore[no-untyped-def]
    protocol = _build(self, addr)
    made = protocol.connectionMade

    def connection_made() -> None:
        made()
        with contextlib.suppress(Exception):  # a UNIX socket has no Nagle
            protocol.transport.setTcpNoDelay(True)

    protocol.connectionMade = connection_made
    return protocol


HTTPFactory.buildProtocol = _build_nodelay  # type: ignore[method-assign]

if __name__ == "__main__":
    CommandLineInterface().run(sys.argv[1:])
