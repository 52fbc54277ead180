"""The settings module: environment-driven, loud on bad values, deploy-clean in production."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from chatsite import env

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": "a-long-random-production-secret-key-0123456789-abcdefghijklmnopq",
    "ALLOWED_HOSTS": "lyceum.example.org",
    "CSRF_TRUSTED_ORIGINS": "https://lyceum.example.org",
}


def manage(*args: str, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {
        k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY", "DATABASE_URL"}
    }
    # DEBUG is off unless asked for: these checks ask, unless they set it themselves.
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, "DEBUG": "1", **extra_env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_deploy_is_clean_with_production_variables():
    result = manage("check", "--deploy", "--fail-level", "WARNING", extra_env=PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_without_secret_key_fails_loudly():
    result = manage("check", extra_env={**PRODUCTION, "SECRET_KEY": ""})
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEBUG", "ture", "DEBUG must be one of"),
        ("LYCEUM_IDLE_TIMEOUT", "soon", "LYCEUM_IDLE_TIMEOUT must be a number"),
        ("LYCEUM_RUNNER", "threads", "LYCEUM_RUNNER must be one of"),
        ("DATABASE_URL", "mysql://x/y", "DATABASE_URL must start with postgres://"),
    ],
)
def test_bad_values_stop_start_up(name, value, message):
    result = manage("check", extra_env={name: value})
    assert result.returncode != 0
    assert message in result.stderr


def test_worker_runner_needs_redis():
    result = manage("check", extra_env={"LYCEUM_RUNNER": "worker", "REDIS_URL": ""})
    assert "LYCEUM_RUNNER=worker needs REDIS_URL" in result.stderr


def test_env_helpers(monkeypatch):
    monkeypatch.setenv("X_INT", "12")
    monkeypatch.setenv("X_LIST", " a, b ,,c ")
    monkeypatch.setenv("X_BOOL", "Yes")
    assert env.env_int("X_INT", 1) == 12
    assert env.env_list("X_LIST") == ["a", "b", "c"]
    assert env.env_bool("X_BOOL", False) is True
    monkeypatch.setenv("X_INT", "-1")
    with pytest.raises(ImproperlyConfigured, match="at least 0"):
        env.env_int("X_INT", 1, minimum=0)


def test_database_url_parsing():
    db = env.database_from_url("postgres://u:p%40ss@db.example:5433/lyceum?sslmode=require")
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "u",
        "p@ss",
        "db.example",
        "5433",
        "lyceum",
    )
    assert db["OPTIONS"] == {"sslmode": "require"}
    with pytest.raises(ImproperlyConfigured, match="must name a database"):
        env.database_from_url("postgres://host/")


def test_redis_url_switches_the_channel_layer():
    code = (
        "from django.conf import settings; layers = settings.CHANNEL_LAYERS; "
        "print(layers['default']['BACKEND'], layers['live']['BACKEND'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "chatsite.settings",
            "REDIS_URL": "redis://127.0.0.1:6379/0",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.split() == [
        "channels_redis.core.RedisChannelLayer",  # runs for the workers, cancels
        "chat.live.layers.PipelinedPubSubChannelLayer",  # doorbells and snapshots for pages
    ], result.stderr
