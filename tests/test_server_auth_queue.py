"""The password-check queue shared fairly between client addresses, and remembered
successes across a reload (issue 27, item 3). Loopback only (127.0.0.x are all
local addresses on Linux); bounded in count and time."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import bcrypt
import httpx
import pytest

from bench.flood import wrong_password_flood
from exporter.serve.middleware import LIMITED, OK, PasswordChecker
from tests.daemon import running
from tests.test_server import no_gpu_args


def header(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def test_many_addresses_guessing_do_not_shut_out_another(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """27.3: one queue of MAX_QUEUED checks for everyone: wrong passwords from ~20
    addresses kept it full and the right password from another got 429."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))
    checker = PasswordChecker({"prometheus": hashed})
    order: list[bytes] = []

    def slow_bcrypt(password: bytes, hashed: bytes) -> bool:
        order.append(password)
        time.sleep(0.01)
        return bool(bcrypt.checkpw(password, hashed))

    monkeypatch.setattr(checker, "_bcrypt", slow_bcrypt)

    async def run() -> tuple[str, list[str], int]:
        guesses = [asyncio.ensure_future(checker.check(
            header("prometheus", f"guess-{a}-{i}"), f"10.0.0.{a}"))
            for a in range(20) for i in range(5)]
        await asyncio.sleep(0)
        waiting = checker.queued
        right = await checker.check(header("prometheus", "s3cret"), "10.0.1.1")
        return right, list(await asyncio.gather(*guesses)), waiting

    right, guessed, waiting = asyncio.run(run())
    assert right == OK
    assert waiting == PasswordChecker.MAX_QUEUED  # the queue was full when it came
    # one check per address in turn: it waited for at most one of each of the others
    assert order.index(b"s3cret") <= 21, order.index(b"s3cret")
    # each address's own line is bounded: the rest of its burst is 429 at once
    assert guessed.count(LIMITED) >= 100 - 20 * PasswordChecker.PER_ADDRESS


def count_checks(checker: PasswordChecker, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The passwords ``checker`` runs bcrypt for, in order, as it runs them."""
    checked: list[bytes] = []
    real = checker._bcrypt

    def counting(password: bytes, hashed: bytes) -> bool:
        checked.append(password)
        return real(password, hashed)

    monkeypatch.setattr(checker, "_bcrypt", counting)
    return checked


def test_a_reload_keeps_the_remembered_successes_of_unchanged_users(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """27.3: every remembered success was forgotten on a reload: each scraper paid
    bcrypt again, competing with the guesses."""
    a = bcrypt.hashpw(b"a-secret", bcrypt.gensalt(rounds=4))
    b = bcrypt.hashpw(b"b-secret", bcrypt.gensalt(rounds=4))
    checker = PasswordChecker({"a": a, "b": b})
    calls = count_checks(checker, monkeypatch)

    async def run() -> list[str]:
        out = [await checker.check(header("a", "a-secret"), "10.0.0.1"),
               await checker.check(header("b", "b-secret"), "10.0.0.1")]
        checker.replace_users({"a": a, "b": bcrypt.hashpw(b"b-new", bcrypt.gensalt(rounds=4)),
                               "c": b})
        out += [await checker.check(header("a", "a-secret"), "10.0.0.1"),
                await checker.check(header("b", "b-secret"), "10.0.0.1")]
        return out

    results = asyncio.run(run())
    assert results == [OK, OK, OK, "failed"]
    # a: remembered across the reload (no second bcrypt); b: changed, checked again
    assert calls == [b"a-secret", b"b-secret", b"b-secret"]


@pytest.mark.slow
def test_the_right_password_from_another_address_gets_through_a_guess_flood(
        tmp_path: Path) -> None:
    """27.3 end to end, on the daemon: 20 source addresses (127.0.0.2-21), three
    keep-alive connections each, re-send a wrong password (bcrypt cost 12, as
    deployed); a client on 127.0.0.99 with the right password, a new user each time so
    each pays bcrypt, was 429 nine times of nine. Now it waits its turn: 200."""
    users = "".join(f"  u{i}: '{bcrypt.hashpw(b's3cret', bcrypt.gensalt(rounds=12)).decode()}'\n"
                    for i in range(3))
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n" + users.replace("u0:", "prometheus:"))
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path) as d:
        port = int(d.base_url.rsplit(":", 1)[1])
        flood = wrong_password_flood(port, 60, seconds=30,
                                     sources=[f"127.0.0.{2 + a}" for a in range(20)])
        time.sleep(4)  # the addresses' bursts fill the queue
        codes = []
        right = httpx.HTTPTransport(local_address="127.0.0.99")
        with httpx.Client(transport=right, timeout=20) as client:
            for user in ("u1", "u2"):
                try:
                    codes.append(client.get(d.base_url + "/metrics",
                                            auth=(user, "s3cret")).status_code)
                except httpx.TransportError:
                    codes.append(0)
        flood.join(60)
    assert codes == [200, 200], codes
