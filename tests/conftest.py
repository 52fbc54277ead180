"""Shared fixtures: users, logged-in clients, a live Daphne server and Chromium."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
from asgiref.sync import SyncToAsync
from django.contrib.auth.models import Group

from chat.roles import TEACHERS_GROUP
from tests import netguard
from tests.fakeopenai import fake_openai  # noqa: F401 - a fixture for every test module

PASSWORD = "correct-horse-battery"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


# The developer's own provider and proxy variables must not reach the tests: a run would
# talk to their server, or through their proxy. Subprocesses (workers, settings checks)
# inherit this environment, so the variables leave os.environ.
IGNORED_ENVIRONMENT = (
    "LYCEUM_OPENAI_BASE_URL",
    "LYCEUM_OPENAI_API_KEY",
    "LYCEUM_OPENAI_MODELS",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
)


def pytest_configure(config):
    from django.conf import settings

    # pytest-django has read the settings before this conftest is imported, so the
    # values taken from the environment are reset here as well as removed from it.
    for name in IGNORED_ENVIRONMENT:
        os.environ.pop(name, None)
    settings.LYCEUM_OPENAI_BASE_URL = ""
    settings.LYCEUM_OPENAI_API_KEY = ""
    settings.LYCEUM_OPENAI_MODELS = []

    # PBKDF2 costs ~0.3 s per login; tests need no real hashing. Set process-wide
    # (not with the settings fixture) so forked live servers inherit it.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Artifact content of the whole run goes to one temporary folder (forks inherit it).
    settings.MEDIA_ROOT = Path(tempfile.mkdtemp(prefix="lyceum-media-"))

    # A chat's title is written by its model after the first reply: one more request,
    # which tests counting a model's requests do not expect. Tests of titles turn it on.
    settings.LYCEUM_GENERATE_TITLES = False

    # Tests send faster than any person and run many replies of one user at once; the
    # per-user rates are off except in the tests of limits (tests/hardening/limits/).
    settings.LYCEUM_MESSAGES_PER_MINUTE = 0
    settings.LYCEUM_MAX_RUNNING_PER_USER = 0


@pytest.fixture(scope="session", autouse=True)
def network_guard():
    """No test reaches beyond loopback: connections and DNS lookups elsewhere raise
    netguard.NetworkBlocked (see tests/netguard.py)."""
    netguard.install()
    yield
    netguard.uninstall()


@pytest.fixture(autouse=True)
def _fresh_limit_cache():
    """Limits and keys kept in memory (chat/relay/ttlcache.py) do not outlive a test: the
    next test's rows may reuse the same primary keys."""
    from chat.relay import ttlcache

    ttlcache.clear()
    yield
    ttlcache.clear()


@pytest.fixture(autouse=True)
def _no_network_attempts(network_guard):
    """Fails a test whose code tried to leave the machine, even if it caught the error."""
    netguard.take_violations()
    yield
    attempts = netguard.take_violations()
    if attempts:
        pytest.fail("\n".join(attempts), pytrace=False)


@pytest.fixture
def make_user(django_user_model):
    def make(username: str, *, teacher: bool = False, staff: bool = False):
        user = django_user_model.objects.create_user(
            username=username, password=PASSWORD, is_staff=staff
        )
        if teacher:
            user.groups.add(Group.objects.get_or_create(name=TEACHERS_GROUP)[0])
        return user

    return make


@pytest.fixture
def default_agent(db):
    """The default agent. Transactional tests flush the migration's row; the app makes
    it again on demand, and so does this fixture."""
    from chat.catalog import default_agent

    return default_agent()


@pytest.fixture
def agent(default_agent):
    return default_agent


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def bob(make_user):
    return make_user("bob")


@pytest.fixture
def alice_client(client, alice):
    client.force_login(alice)
    return client


# --- live server -------------------------------------------------------------------------------


def _fresh_daphne_process_class():
    from daphne.testing import DaphneProcess

    class FreshDaphneProcess(DaphneProcess):
        """Daphne in a forked child with a fresh asgiref executor.

        fork() copies SyncToAsync's single-thread executor but not its thread, so an
        earlier async test in this process would make every sync_to_async call in the
        child hang (AuthMiddleware first). A new executor in the child avoids that.
        """

        def run(self):
            SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
            super().run()

    return FreshDaphneProcess


@pytest.fixture
def live_server_url(transactional_db):
    """A real Daphne serving the whole app (HTTP, static files, WebSockets) on a free port."""
    from channels.testing.live import make_application
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    process = _fresh_daphne_process_class()(
        "127.0.0.1", partial(make_application, static_wrapper=ASGIStaticFilesHandler)
    )
    process.start()
    if not process.ready.wait(15):
        process.terminate()
        raise RuntimeError("Daphne did not start within 15 s")
    if process.errors.qsize():
        raise RuntimeError(f"Daphne failed to start: {process.errors.get()}")
    try:
        yield f"http://127.0.0.1:{process.port.value}"
    finally:
        process.terminate()
        process.join(5)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright (never downloads a browser)."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread; the ORM calls
    # made by fixtures would otherwise refuse to run (SynchronousOnlyOperation).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser):
    context = browser.new_context()
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


def login(page, base_url: str, username: str, password: str = PASSWORD) -> None:
    page.goto(f"{base_url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.locator("#who").wait_for()
