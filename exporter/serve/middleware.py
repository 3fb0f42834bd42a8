"""The web config's ASGI middlewares: basic auth, the rate limit, the extra headers.

The probes ``/-/healthy`` and ``/-/ready`` stay open so a kubelet or Docker health
check needs no password. Wrong passwords are the cheap attack on basic auth (each
costs the server a bcrypt), so password checks that are not already known good are
rate-limited per client address and bounded in number while queued; a request that
is refused that way is answered 429 after a second (a tarpit: the client's next
guess waits, at no cost to the server). The auth middleware tells the
connection layer (exporter.serve.connections) which connections are still unproven.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import hashlib
import hmac
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from exporter.serve.connections import AUTH_MARK, CHUNK, Auth

OPEN_PATHS = frozenset({"/-/healthy", "/-/ready"})
OK, FAILED, LIMITED = Auth.OK, Auth.FAILED, Auth.LIMITED


class TokenBucket:
    """``burst`` tokens, one back every ``interval`` seconds."""

    def __init__(self, interval: float, burst: int) -> None:
        self.interval, self.burst = interval, burst
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) / self.interval)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class _Check:
    """One bcrypt check waiting for a worker: the password, the hash, who waits."""

    __slots__ = ("password", "hashed", "future")

    def __init__(self, password: bytes, hashed: bytes,
                 future: asyncio.Future[bool | None]) -> None:
        self.password, self.hashed, self.future = password, hashed, future


class PasswordChecker:
    """Basic-auth credentials checked against bcrypt hashes, never on the event loop.

    bcrypt is slow on purpose (~100-250 ms). It runs on ``WORKERS`` threads of their own
    at a lower scheduling priority (Linux: nice +10 per thread), so wrong passwords
    queue there while the loop keeps the CPU it needs to answer probes. Only successes
    are remembered (as a keyed SHA-256 digest, never in clear), so a Prometheus
    scraping every few seconds pays bcrypt once; a reload keeps them for the users
    whose hash did not change (a restart forgets them all). A guess always pays it,
    so guesses are limited: ``GUESS_BURST`` per client address, then one per
    ``GUESS_INTERVAL`` (remembered for the last ``ADDRESSES`` addresses).

    The queue is shared fairly between addresses: each has its own line of at most
    ``PER_ADDRESS`` checks, the workers take one check from each address in turn, and
    when ``MAX_QUEUED`` are waiting a newcomer takes the place of the newest check of
    the address with the longest line (that one is answered 429). So wrong passwords
    from many addresses delay the right one from another by one check per address,
    never shut it out. Requests that carry the same credentials while their check is
    queued or running share it (one bcrypt, one guess, one place in the line): a
    freshly started daemon that a client opens many connections to at once answers
    them all when the first check ends, instead of 429 to all but two. An unknown user
    is checked against a configured hash too, so a known and an unknown name take the
    same time. Passwords longer than bcrypt's 72 bytes never match (as in Go's bcrypt,
    which exporter-toolkit uses).
    """

    WORKERS = 1
    NICE = 10
    CACHE_SIZE = 64
    GUESS_BURST = 10
    GUESS_INTERVAL = 1.0
    ADDRESSES = 1024
    MAX_QUEUED = 32
    PER_ADDRESS = 2

    def __init__(self, users: Mapping[str, bytes],
                 on_thread: Callable[[threading.Thread], None] | None = None) -> None:
        self.users = dict(users)
        self._decoy = next(iter(self.users.values()))
        self._verified: OrderedDict[bytes, str] = OrderedDict()  # digest -> user name
        self._guesses: OrderedDict[str, TokenBucket] = OrderedDict()
        self._lines: OrderedDict[str, deque[_Check]] = OrderedDict()  # next address first
        self._queued = 0
        self._running = 0
        # digest -> the check of those credentials in the queue or running, and how many
        # requests wait for it (when none is left, it is dropped unchecked)
        self._pending: dict[bytes, tuple[asyncio.Future[bool | None], list[int]]] = {}
        self._key = os.urandom(32)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.WORKERS, thread_name_prefix="auth",
                                        initializer=self._started)
        self.on_thread = on_thread  # each checking thread as it starts (its CPU is served)

    def replace_users(self, users: Mapping[str, bytes]) -> None:
        """New hashes from a reloaded web config: a remembered success stays for a user
        whose hash is unchanged; one of a user removed or changed is forgotten, so that
        password stops working at once."""
        with self._lock:
            old, self.users = self.users, dict(users)
            self._decoy = next(iter(self.users.values()))
            for digest, user in list(self._verified.items()):
                if user not in self.users or self.users[user] != old.get(user):
                    del self._verified[digest]

    def _started(self) -> None:
        if self.on_thread is not None:
            self.on_thread(threading.current_thread())
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.NICE)
        except (AttributeError, OSError):  # not Linux, or not allowed: same priority
            pass

    def _bcrypt(self, password: bytes, hashed: bytes) -> bool:
        import bcrypt  # only with basic auth configured

        try:
            return bool(bcrypt.checkpw(password, hashed))
        except ValueError:  # longer than 72 bytes, or a hash bcrypt refuses
            return False

    def _may_guess(self, address: str) -> bool:
        bucket = self._guesses.pop(address, None) or TokenBucket(self.GUESS_INTERVAL,
                                                                 self.GUESS_BURST)
        self._guesses[address] = bucket  # most recent last
        while len(self._guesses) > self.ADDRESSES:
            self._guesses.popitem(last=False)
        return bucket.take()

    @property
    def queued(self) -> int:
        """Checks waiting for a worker (not those being checked)."""
        return self._queued

    def _enqueue(self, address: str, check: _Check) -> bool:
        """Into ``address``'s line; False when its line is full, or the queue is full
        and no other address has a longer line to give up a place."""
        line = self._lines.get(address)
        mine = len(line) if line is not None else 0
        if mine >= self.PER_ADDRESS:
            return False
        if self._queued >= self.MAX_QUEUED:
            longest = max(self._lines, key=lambda a: len(self._lines[a]))
            if len(self._lines[longest]) <= mine + 1:
                return False
            bumped = self._lines[longest].pop()  # its newest: answered 429
            self._queued -= 1
            if not bumped.future.done():
                bumped.future.set_result(None)
        if line is None:
            line = self._lines[address] = deque()
        line.append(check)
        self._queued += 1
        self._pump()
        return True

    def _pump(self) -> None:
        """Start checks while a worker is free: one from each address in turn."""
        while self._running < self.WORKERS and self._lines:
            address, line = next(iter(self._lines.items()))
            check = line.popleft()
            self._queued -= 1
            if line:
                self._lines.move_to_end(address)  # the other addresses go first
            else:
                del self._lines[address]
            if check.future.done():  # its client has gone
                continue
            self._running += 1
            done = asyncio.get_running_loop().run_in_executor(
                self._pool, self._bcrypt, check.password, check.hashed)
            done.add_done_callback(functools.partial(self._finished, check))

    def _finished(self, check: _Check, done: asyncio.Future[bool]) -> None:
        self._running -= 1
        if not check.future.done():
            check.future.set_result(not done.cancelled() and done.exception() is None
                                    and done.result())
        self._pump()

    async def check(self, header: bytes, address: str = "",
                    checking: Callable[[], None] | None = None) -> Auth:
        """OK, FAILED, or LIMITED (not checked: too many guesses); ``checking`` is
        called before a bcrypt check is queued."""
        scheme, _, encoded = header.partition(b" ")
        if scheme.lower() != b"basic":
            return FAILED
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return FAILED
        if not sep:
            return FAILED
        name = user.decode("utf-8", "replace")
        hashed = self.users.get(name)
        digest = hmac.new(self._key, user + b"\0" + password, hashlib.sha256).digest()
        with self._lock:
            if hashed is not None and self._verified.get(digest) == name:
                self._verified.move_to_end(digest)
                return OK
        pending = self._pending.get(digest)
        if pending is None or pending[0].cancelled():
            if not self._may_guess(address):
                return LIMITED
            future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
            if not self._enqueue(address, _Check(
                    password, hashed if hashed is not None else self._decoy, future)):
                return LIMITED
            pending = self._pending[digest] = (future, [0])
            future.add_done_callback(lambda _: self._pending.pop(digest, None))
        if checking is not None:
            checking()
        future, waiting = pending
        waiting[0] += 1
        try:
            ok = await asyncio.shield(future)
        finally:
            waiting[0] -= 1
            if not waiting[0] and not future.done():
                future.cancel()  # every client waiting for it has gone: not checked
        if ok is None:
            return LIMITED  # its place went to another address
        if not ok or hashed is None:
            return FAILED
        with self._lock:
            if self.users.get(name) == hashed:  # not replaced while it was checked
                self._verified[digest] = name
                while len(self._verified) > self.CACHE_SIZE:
                    self._verified.popitem(last=False)
        return OK


async def _deny(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), *headers]})
    await send({"type": "http.response.body", "body": body})


class BasicAuthMiddleware:
    """401 unless the request carries a user/password that matches a bcrypt hash;
    429 when the client has used up its password guesses."""

    def __init__(self, app: ASGIApp, checker: PasswordChecker) -> None:
        self.app = app
        self.passwords = checker

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        mark: Callable[[Auth], None] = (scope.get("extensions") or {}).get(
            AUTH_MARK, {}).get("report", lambda state: None)
        header = dict(scope["headers"]).get(b"authorization", b"")
        client = scope.get("client")
        address = str(client[0]) if client else ""
        result = await self.passwords.check(header, address, lambda: mark(Auth.CHECKING)) \
            if header else FAILED
        mark(result)
        if result == OK:
            await self.app(scope, receive, send)
        elif result == LIMITED:
            # Held back for a while first: a client re-sending guesses on keep-alive
            # connections waits (costing nothing) instead of spinning the loop on 429s.
            await asyncio.sleep(self.passwords.GUESS_INTERVAL)
            await _deny(send, 429, b"Too Many Requests\n", [(b"retry-after", b"1")])
        else:
            await _deny(send, 401, b"Unauthorized\n",
                        [(b"www-authenticate", b'Basic realm="gpu-exporter"')])


class RateLimitMiddleware:
    """``rate_limit``: a token bucket over every request but the probes; 429 when empty."""

    def __init__(self, app: ASGIApp, interval: float, burst: int) -> None:
        self.app = app
        self.bucket = TokenBucket(interval, burst)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and \
                not self.bucket.take():
            await _deny(send, 429, b"Too Many Requests\n", [])
            return
        await self.app(scope, receive, send)


class HeadersMiddleware:
    """Adds ``http_server_config.headers`` to every response, 401 and 429 included
    (it is the outermost middleware)."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str]) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class ChunkedBodyMiddleware:
    """Hands a response body to the server ``CHUNK`` bytes at a time: the server waits
    for one to reach the kernel before it takes the next (exporter.serve.connections), so a
    client that does not read holds at most one chunk of its answer in this process,
    not a whole copy of the exposition."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_chunked(message: Any) -> None:
            body = message.get("body", b"") if message["type"] == "http.response.body" \
                else b""
            if len(body) <= CHUNK:
                await send(message)
                return
            view = memoryview(body)
            more = message.get("more_body", False)
            for at in range(0, len(body), CHUNK):
                last = at + CHUNK >= len(body)
                await send({"type": "http.response.body", "body": view[at:at + CHUNK],
                            "more_body": more or not last})

        await self.app(scope, receive, send_chunked)
