"""§4 of issue 14: sign-in is throttled per username and per address, before any hashing.

Marked ``persistence``: ``make test`` runs these again on PostgreSQL, where the counters'
row locks (not SQLite's one writer) are what hold the limit under concurrency.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.db import connection
from django.test import Client

from chat import throttle
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.persistence]

LOCKED = "Too many failed sign-in attempts. Try again in 15 minutes."


@pytest.fixture
def hashing(monkeypatch) -> list[str]:
    """Every password hashed by the test's hasher: to check one (``verify`` hashes it) or,
    for a username that does not exist, to spend the same time (``make_password``)."""
    calls: list[str] = []
    lock = threading.Lock()
    encode = MD5PasswordHasher.encode

    def counted_encode(self, password, salt):
        with lock:
            calls.append(password)
        return encode(self, password, salt)

    monkeypatch.setattr(MD5PasswordHasher, "encode", counted_encode)
    return calls


@pytest.fixture
def login_limits(settings):
    settings.LYCEUM_LOGIN_ATTEMPTS = 5
    settings.LYCEUM_LOGIN_ADDRESS_ATTEMPTS = 50
    settings.LYCEUM_LOGIN_WINDOW_MINUTES = 15
    settings.LYCEUM_LOGIN_LOCKOUT_MINUTES = 15
    return settings


def log_in(username: str, password: str, address: str = "127.0.0.1", path: str = "/login/"):
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


def signed_in(response) -> bool:
    return response.status_code == 302 and "/login/" not in response["Location"]


@pytest.mark.django_db
def test_five_wrong_passwords_shut_the_door_with_a_clear_message(
    alice, counters, login_limits, hashing
):
    for _ in range(5):
        response = log_in("alice", "wrong")
        assert response.status_code == 200
        assert "match. Please try again." in response.content.decode()
    assert len(hashing) == 5

    response = log_in("alice", PASSWORD)  # even the right password: the door is shut

    assert response.status_code == 429
    assert int(response["Retry-After"]) == 15 * 60
    assert LOCKED in response.content.decode()
    assert len(hashing) == 5  # nothing hashed for a locked username


@pytest.mark.django_db
def test_a_locked_username_costs_no_hashing_however_many_try(
    alice, counters, login_limits, hashing
):
    for _ in range(5):
        log_in("alice", "wrong")
    before = len(hashing)
    for n in range(20):
        response = log_in("alice", f"guess-{n}", address=f"10.0.0.{n + 1}")
        assert response.status_code == 429
    assert len(hashing) == before


@pytest.mark.django_db
def test_the_lockout_ends_and_the_right_password_works_again(alice, counters, login_limits, clock):
    for _ in range(6):
        log_in("alice", "wrong")
    clock.advance(14 * 60)
    response = log_in("alice", PASSWORD)
    assert response.status_code == 429
    assert "Try again in 1 minute." in response.content.decode()

    clock.advance(61)

    assert signed_in(log_in("alice", PASSWORD))


@pytest.mark.django_db
def test_signing_in_starts_the_count_afresh(alice, counters, login_limits):
    for _ in range(4):
        log_in("alice", "wrong")
    assert signed_in(log_in("alice", PASSWORD))
    for _ in range(4):
        assert log_in("alice", "wrong").status_code == 200
    assert signed_in(log_in("alice", PASSWORD))


@pytest.mark.django_db
def test_one_address_guessing_many_usernames_is_shut_out(
    alice, bob, counters, login_limits, hashing
):
    login_limits.LYCEUM_LOGIN_ADDRESS_ATTEMPTS = 8
    for n in range(8):
        assert log_in(f"nobody-{n}", "wrong", address="203.0.113.7").status_code == 200
    hashed = len(hashing)

    refused = log_in("bob", PASSWORD, address="203.0.113.7")

    assert refused.status_code == 429 and LOCKED in refused.content.decode()
    assert len(hashing) == hashed
    # Bob from elsewhere, and Alice's own count, are untouched by that address.
    assert signed_in(log_in("bob", PASSWORD, address="198.51.100.2"))
    assert signed_in(log_in("alice", PASSWORD, address="198.51.100.3"))


@pytest.mark.django_db
def test_good_sign_ins_from_one_address_never_shut_it(alice, counters, login_limits):
    login_limits.LYCEUM_LOGIN_ADDRESS_ATTEMPTS = 3  # a classroom behind one address
    for _ in range(10):
        assert signed_in(log_in("alice", PASSWORD, address="192.0.2.1"))


@pytest.mark.django_db
def test_the_admin_sign_in_is_throttled_the_same_way(make_user, counters, login_limits, hashing):
    make_user("root", staff=True)
    hashing.clear()
    for _ in range(5):
        assert log_in("root", "wrong", path="/admin/login/").status_code == 200
    response = log_in("root", PASSWORD, path="/admin/login/")
    assert LOCKED in response.content.decode()
    assert hashing == ["wrong"] * 5
    # The lockout is the username's, whichever page knocked.
    assert log_in("root", PASSWORD).status_code == 429


@pytest.mark.django_db(transaction=True)
def test_forty_guesses_at_once_hash_exactly_five_passwords(alice, counters, login_limits, hashing):
    def guess(n: int) -> int:
        try:
            return log_in("alice", f"guess-{n}", address=f"10.1.0.{n + 1}").status_code
        finally:
            connection.close()

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(guess, range(40)))

    assert statuses.count(200) == 5 and statuses.count(429) == 35
    assert len(hashing) == 5


@pytest.mark.django_db
def test_turned_off_it_never_refuses(alice, counters, login_limits):
    login_limits.LYCEUM_LOGIN_ATTEMPTS = 0
    login_limits.LYCEUM_LOGIN_ADDRESS_ATTEMPTS = 0
    for _ in range(12):
        assert log_in("alice", "wrong").status_code == 200
    assert signed_in(log_in("alice", PASSWORD))


def test_the_address_is_the_connections_unless_a_proxy_header_is_trusted(settings):
    settings.LYCEUM_CLIENT_ADDRESS_HEADER = ""
    headers = {"X-Forwarded-For": "1.2.3.4"}
    assert throttle.client_address("192.0.2.9", headers) == "192.0.2.9"
    settings.LYCEUM_CLIENT_ADDRESS_HEADER = "X-Forwarded-For"
    # The proxy appends what it saw; a client's own first entry is not believed.
    assert throttle.client_address("10.0.0.1", {"X-Forwarded-For": "6.6.6.6, 1.2.3.4"}) == (
        "1.2.3.4"
    )
    # One IPv6 host holds a whole /64: it counts as one address.
    settings.LYCEUM_CLIENT_ADDRESS_HEADER = ""
    assert throttle.client_address("2001:db8:1:2::5", {}) == throttle.client_address(
        "2001:db8:1:2:ffff::9", {}
    )
    assert throttle.client_address("::ffff:192.0.2.1", {}) == "192.0.2.1"
