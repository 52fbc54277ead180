"""The settings as the type checker sees them (pyproject.toml, ``[tool.django-stubs]``).

mypy's Django plugin imports the settings module, and without ``DEBUG`` the settings
are production's, which refuse to load without ``SECRET_KEY``. Not a settings module
of the app: it asks for the development settings and re-exports them, nothing more.
"""

import os

os.environ.setdefault("DEBUG", "1")

from chatsite.settings import *  # noqa: E402, F403
