"""Lyceum settings: one module, driven by the environment.

Embedded defaults (SQLite, in-memory channel layer, the offline demo model) make
``make run`` work with nothing else configured; it asks for ``DEBUG=1``. Without
``DEBUG`` the settings are production's: ``SECRET_KEY``, ``ALLOWED_HOSTS`` and
usually ``DATABASE_URL`` / ``REDIS_URL`` must be given. Every value is validated
here; a bad one stops start-up.
"""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from chatsite.env import (
    database_from_url,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
)
from chatsite.redishosts import SOCKET_TIMEOUT, redis_host

BASE_DIR = Path(__file__).resolve().parent.parent

# Off unless asked for: a forgotten variable must not serve debug pages in production.
DEBUG = env_bool("DEBUG", False)

_DEV_SECRET = "lyceum-insecure-development-key-change-me-0123456789abcdefghijklmnop"
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = _DEV_SECRET

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off")
if not DEBUG and "*" in ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must name the hosts when DEBUG is off, not '*'")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Origins (scheme://host[:port]) whose pages may open the chat socket, besides the page's
# own origin (the socket's Host): compared exactly (chatsite/origins.py). Behind a proxy
# that terminates TLS, list the public origin here (the socket itself arrives as ws://).
LYCEUM_TRUSTED_ORIGINS = env_list("LYCEUM_TRUSTED_ORIGINS", CSRF_TRUSTED_ORIGINS)
for _origin in LYCEUM_TRUSTED_ORIGINS:
    if not DEBUG and "*" in _origin:
        raise ImproperlyConfigured(
            f"LYCEUM_TRUSTED_ORIGINS and CSRF_TRUSTED_ORIGINS take exact origins when DEBUG is"
            f" off; {_origin!r} has a wildcard"
        )
    if _origin.lower() == "null" or "://" not in _origin:
        raise ImproperlyConfigured(
            f"LYCEUM_TRUSTED_ORIGINS takes origins like https://chat.example.org, got {_origin!r}"
        )
# Trust X-Forwarded-Proto only when a proxy in front sets it (and strips the client's own):
# otherwise any client could claim HTTPS.
LYCEUM_TRUST_X_FORWARDED_PROTO = env_bool("LYCEUM_TRUST_X_FORWARDED_PROTO", False)

INSTALLED_APPS = [
    "daphne",  # before staticfiles: makes runserver serve ASGI
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # chat before channels: its runworker command (with the run sweeper) wins.
    "chat",
    "classroom",
    "channels",
    "django_htmx",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The language: the picker's cookie, else the browser's Accept-Language, else English.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "chatsite.middleware.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "chat.context_processors.roles",
                "chat.context_processors.languages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
    DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "test_lyceum")}
else:
    DATABASES = {
        "default": {
            "ENGINE": "chatsite.sqlite",
            "NAME": Path(env_str("SQLITE_PATH") or BASE_DIR / "db.sqlite3"),
            "OPTIONS": {
                # WAL lets the page read while a run writes; IMMEDIATE makes a writer take
                # the lock at BEGIN, so two writers queue on the busy timeout instead of
                # failing with "database is locked" when a reader upgrades.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
            # A file, not :memory:, so a live server in another process sees test data.
            "TEST": {"NAME": Path(env_str("SQLITE_TEST_PATH") or BASE_DIR / "test_db.sqlite3")},
        }
    }
# Runs and sockets reach the database through one thread per process; opening and
# closing a connection for every call was most of its time under load (bench_streams).
for _database in DATABASES.values():
    _database["CONN_MAX_AGE"] = env_int("LYCEUM_CONN_MAX_AGE", 60, minimum=0)
    _database["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels ---------------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
# Key prefix of the Redis channel layer: deployments (or test runs) sharing one Redis
# database keep their channels and groups apart with distinct prefixes.
LYCEUM_REDIS_PREFIX = env_str("LYCEUM_REDIS_PREFIX", "asgi") or "asgi"
REDIS_SOCKET_TIMEOUT = SOCKET_TIMEOUT
REDIS_MAX_CONNECTIONS = env_int("LYCEUM_REDIS_MAX_CONNECTIONS", 1000, minimum=10)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis_host: a socket timeout that outlasts the blocking pop, and a command
                # on a connection pooled before a Redis restart retried once, reconnected.
                # redis-py fails a command outright when its pool (100 by default) is
                # used up, which a hundred streaming runs in one process can do.
                "hosts": [redis_host(REDIS_URL, max_connections=REDIS_MAX_CONNECTIONS)],
                "capacity": 1500,
                "expiry": 30,
                "prefix": LYCEUM_REDIS_PREFIX,
            },
        },
        # Chat doorbells and stream snapshots (chat.live.layers.live_layer): Redis pub/sub
        # pushes them to each socket's process down one subscription; the default layer
        # costs a blocking pop per message, which a hundred streams queued up behind.
        # At most once, like every doorbell: a page that misses one reads the log.
        "live": {
            "BACKEND": "chat.live.layers.PipelinedPubSubChannelLayer",
            "CONFIG": {
                "hosts": [redis_host(REDIS_URL)],
                "prefix": LYCEUM_REDIS_PREFIX,
            },
        },
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "chat.live.layers.LeanInMemoryChannelLayer"}}

# --- Auth -------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# --- I18n / static ------------------------------------------------------------------------------
# English and Simplified Chinese (locale/; `make messages` updates them, `make test` checks
# that every string of the interface has a Chinese translation). No language prefix in URLs:
# they are a contract; the language comes from the picker's cookie or Accept-Language.
LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
LANGUAGE_COOKIE_SAMESITE = "Lax"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Artifact content (chat.artifacts) goes through the default storage: a folder here unless
# STORAGES names another backend. Never served as /media/: only through checked views.
MEDIA_ROOT = Path(env_str("LYCEUM_MEDIA_ROOT") or BASE_DIR / "media")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

# --- Security -----------------------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
if LYCEUM_TRUST_X_FORWARDED_PROTO:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Debug pages and error reports mask credentials in settings (DATABASE_URL, REDIS_URL, ...)
# and keys in frame variables.
DEFAULT_EXCEPTION_REPORTER_FILTER = "chatsite.debug.SafeReporterFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO").upper()},
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}

# --- Lyceum -------------------------------------------------------------------------------------
LYCEUM_DEMO_PASSWORD = env_str("LYCEUM_DEMO_PASSWORD")
LYCEUM_WORKSPACE_ROOT = Path(env_str("LYCEUM_WORKSPACE_ROOT") or BASE_DIR / "workspaces")
LYCEUM_RUNNER = env_choice("LYCEUM_RUNNER", "inprocess", {"inprocess", "worker"})
if LYCEUM_RUNNER == "worker" and not REDIS_URL:
    raise ImproperlyConfigured("LYCEUM_RUNNER=worker needs REDIS_URL (runs travel over Redis)")
LYCEUM_WORKER_CHANNEL = env_str("LYCEUM_WORKER_CHANNEL", "lyceum-runs")

# Providers: an environment bootstrap; admins manage the rest in the database.
LYCEUM_OPENAI_BASE_URL = env_str("LYCEUM_OPENAI_BASE_URL")
LYCEUM_OPENAI_API_KEY = env_str("LYCEUM_OPENAI_API_KEY")
LYCEUM_OPENAI_MODELS = env_list("LYCEUM_OPENAI_MODELS")
LYCEUM_CONNECT_TIMEOUT = env_float("LYCEUM_CONNECT_TIMEOUT", 10.0, minimum=0.01)
LYCEUM_FIRST_BYTE_TIMEOUT = env_float("LYCEUM_FIRST_BYTE_TIMEOUT", 60.0, minimum=0.01)
LYCEUM_IDLE_TIMEOUT = env_float("LYCEUM_IDLE_TIMEOUT", 60.0, minimum=0.01)
LYCEUM_MAX_RETRIES = env_int("LYCEUM_MAX_RETRIES", 3, minimum=0)
# The admin's Test connection and Fetch models: one wait this long at most, no retries.
LYCEUM_PROVIDER_CHECK_TIMEOUT = env_float("LYCEUM_PROVIDER_CHECK_TIMEOUT", 5.0, minimum=0.01)
# Base of the exponential backoff between retries (seconds; a Retry-After header wins).
LYCEUM_RETRY_BACKOFF = env_float("LYCEUM_RETRY_BACKOFF", 1.0, minimum=0)
LYCEUM_RUN_GUARD_SECONDS = env_float("LYCEUM_RUN_GUARD_SECONDS", 300.0, minimum=1)
# A running run whose heartbeat is older than this is taken for dead (its process
# crashed) and marked interrupted. Heartbeats come every 2 s, so it must stay above that.
LYCEUM_RUN_STALE_SECONDS = env_float("LYCEUM_RUN_STALE_SECONDS", 15.0, minimum=3)
LYCEUM_APPROVAL_TIMEOUT = env_float("LYCEUM_APPROVAL_TIMEOUT", 900.0, minimum=1)
LYCEUM_TOOL_TIMEOUT = env_float("LYCEUM_TOOL_TIMEOUT", 30.0, minimum=0.1)
LYCEUM_DEMO_TOKEN_DELAY = env_float("LYCEUM_DEMO_TOKEN_DELAY", 0.03, minimum=0)
LYCEUM_STREAM_PUSH_INTERVAL = env_float("LYCEUM_STREAM_PUSH_INTERVAL", 0.1, minimum=0)
# After a chat's first reply, a short call to its model names the chat (chat/runhost/titles.py).
LYCEUM_GENERATE_TITLES = env_bool("LYCEUM_GENERATE_TITLES", True)
LYCEUM_CHECKPOINT_INTERVAL = env_float("LYCEUM_CHECKPOINT_INTERVAL", 1.0, minimum=0.05)
LYCEUM_MAX_FRAME_BYTES = env_int("LYCEUM_MAX_FRAME_BYTES", 64 * 1024, minimum=1024)
LYCEUM_HOOKS = env_list("LYCEUM_HOOKS")

# Artifacts and attachments (chat.artifacts): per file, per chat, and what may be attached.
LYCEUM_ARTIFACT_MAX_BYTES = env_int("LYCEUM_ARTIFACT_MAX_BYTES", 10 * 1024 * 1024, minimum=1024)
LYCEUM_ARTIFACT_CHAT_MAX_BYTES = env_int(
    "LYCEUM_ARTIFACT_CHAT_MAX_BYTES", 500 * 1024 * 1024, minimum=1024
)
LYCEUM_ARTIFACT_MAX_COUNT = env_int("LYCEUM_ARTIFACT_MAX_COUNT", 1000, minimum=1)
LYCEUM_ATTACHMENT_KINDS = env_list(
    "LYCEUM_ATTACHMENT_KINDS",
    ["code", "markdown", "text", "html", "svg", "image", "pdf", "binary"],
)
# Text of attached files put into the message's context, at most (a note says when cut).
LYCEUM_ATTACHMENT_CONTEXT_CHARS = env_int("LYCEUM_ATTACHMENT_CONTEXT_CHARS", 20_000, minimum=100)
# --- The relay (chat/relay/) --------------------------------------------------------------------
# Provider keys are encrypted with a key derived from this (SECRET_KEY when unset); after
# changing it, put the previous one in ..._OLD and run `manage.py rotate_provider_keys`.
LYCEUM_PROVIDER_KEY_SECRET = env_str("LYCEUM_PROVIDER_KEY_SECRET")
LYCEUM_PROVIDER_KEY_SECRET_OLD = env_str("LYCEUM_PROVIDER_KEY_SECRET_OLD")
# Per user (and per API key with its own limits): requests per minute refilling a bucket of
# `burst` requests, and a monthly token budget (0 = none). Admins set others per user.
LYCEUM_RELAY_RPM = env_int("LYCEUM_RELAY_RPM", 60, minimum=1)
LYCEUM_RELAY_BURST = env_int("LYCEUM_RELAY_BURST", 10, minimum=1)
LYCEUM_MONTHLY_TOKENS = env_int("LYCEUM_MONTHLY_TOKENS", 0, minimum=0)
# Tokens held against the budget while a request runs that names no max_tokens.
LYCEUM_RELAY_RESERVE_TOKENS = env_int("LYCEUM_RELAY_RESERVE_TOKENS", 1024, minimum=0)
# A pool key that answered 429 or 401/403 is left alone this long.
LYCEUM_RELAY_KEY_COOLDOWN = env_float("LYCEUM_RELAY_KEY_COOLDOWN", 60.0, minimum=0)
# Upstream: the first byte (headers) and then the gap between reads; the whole request.
LYCEUM_RELAY_FIRST_BYTE_TIMEOUT = env_float("LYCEUM_RELAY_FIRST_BYTE_TIMEOUT", 60.0, minimum=0.01)
LYCEUM_RELAY_IDLE_TIMEOUT = env_float("LYCEUM_RELAY_IDLE_TIMEOUT", 60.0, minimum=0.01)
LYCEUM_RELAY_TIMEOUT = env_float("LYCEUM_RELAY_TIMEOUT", 300.0, minimum=1)
# Body fields outside the Chat Completions API that are still passed to the upstream.
LYCEUM_RELAY_PASS_FIELDS = env_list("LYCEUM_RELAY_PASS_FIELDS", ["plan_mode", "subagent_enabled"])
# API keys, the whitelist, pools and limits are remembered this long per process (0: off).
LYCEUM_RELAY_CACHE_SECONDS = env_float("LYCEUM_RELAY_CACHE_SECONDS", 2.0, minimum=0)
# The relay reads a streaming upstream at most this often (the first read at once): tokens
# that arrive in between go on together, for a fraction of the CPU. 0: read as data arrives.
LYCEUM_RELAY_READ_INTERVAL = env_float("LYCEUM_RELAY_READ_INTERVAL", 0.02, minimum=0)

# --- Rate limits and quotas on every door (chat/throttle.py, chat/quotas.py) --------------------
# Kept in Redis with REDIS_URL, else in the database (chat/relay/limits.py). 0 turns a limit off.
# Sign-in: failed attempts allowed per username and per client address (IPv6: per /64) within
# the window; one more is refused and the door stays shut for the lockout. Checked before the
# password is hashed, so a flood of guesses costs no hashing.
LYCEUM_LOGIN_ATTEMPTS = env_int("LYCEUM_LOGIN_ATTEMPTS", 5, minimum=0)
LYCEUM_LOGIN_ADDRESS_ATTEMPTS = env_int("LYCEUM_LOGIN_ADDRESS_ATTEMPTS", 50, minimum=0)
LYCEUM_LOGIN_WINDOW_MINUTES = env_float("LYCEUM_LOGIN_WINDOW_MINUTES", 15.0, minimum=0.1)
LYCEUM_LOGIN_LOCKOUT_MINUTES = env_float("LYCEUM_LOGIN_LOCKOUT_MINUTES", 15.0, minimum=0.1)
# Unknown or revoked API keys per client address (the API and the relay) within the lockout
# time; then that address is refused (429) without looking keys up until it ends.
LYCEUM_BAD_KEY_ATTEMPTS = env_int("LYCEUM_BAD_KEY_ATTEMPTS", 20, minimum=0)
LYCEUM_BAD_KEY_LOCKOUT_MINUTES = env_float("LYCEUM_BAD_KEY_LOCKOUT_MINUTES", 10.0, minimum=0.1)
# The client's address: the connection's, or (behind a proxy that sets it and strips the
# client's own) this header's: X-Real-IP, or X-Forwarded-For (its last address is taken).
LYCEUM_CLIENT_ADDRESS_HEADER = env_str("LYCEUM_CLIENT_ADDRESS_HEADER")
# Per user: chats they start, messages they send per minute (a burst of as many), replies
# running at once across their chats, active API keys, and their files (artifacts and
# attachments of all their chats, every version) in megabytes.
LYCEUM_MAX_CHATS_PER_USER = env_int("LYCEUM_MAX_CHATS_PER_USER", 10_000, minimum=0)
LYCEUM_MESSAGES_PER_MINUTE = env_int("LYCEUM_MESSAGES_PER_MINUTE", 30, minimum=0)
LYCEUM_MAX_RUNNING_PER_USER = env_int("LYCEUM_MAX_RUNNING_PER_USER", 10, minimum=0)
LYCEUM_MAX_API_KEYS = env_int("LYCEUM_MAX_API_KEYS", 25, minimum=0)
LYCEUM_STORAGE_QUOTA_MB = env_int("LYCEUM_STORAGE_QUOTA_MB", 2048, minimum=0)
