"""Daphne with TCP_NODELAY on every accepted connection.

The app sets it itself now (``chatsite/nodelay.py``, installed by ``chatsite/asgi.py``);
this launcher stays so that ``bench_relay.py --nodelay`` keeps working, and installs it
before the app is imported.

Run: ``python bench/daphne_nodelay.py -b 127.0.0.1 -p 8000 chatsite.asgi:application``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daphne.cli import CommandLineInterface  # noqa: E402

from chatsite.nodelay import install  # noqa: E402

install()

if __name__ == "__main__":
    CommandLineInterface().run(sys.argv[1:])
