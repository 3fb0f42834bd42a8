"""Connection slots: every open connection counted from accept, and who makes room.

A server has ``limit`` slots. A connection takes one the moment it is accepted,
before a TLS handshake (asyncio hands a TLS connection to the HTTP protocol only
after its handshake, so counting there let 1000 silent TCP connections hold 300 MB
of TLS buffers uncounted). A handshake must finish within ``HANDSHAKE_TIMEOUT``
(Go's TLS servers use a few seconds too), a request head within ``HEADER_TIMEOUT``.

When every slot is taken, a connection makes room: who, and when a slot is given back,
is exporter.serve.slots's.

A TLS handshake the server refuses (no client certificate, one from another CA, no
common cipher or curve) sends the client the alert OpenSSL wrote (asyncio drops it: the
client saw only EOF) and is one log line per reason per minute, with the count.

Slow readers: what a connection has waiting to be sent is bounded. The kernel's send
buffer of each accepted socket is ``SEND_BUFFER`` (not the autotuned megabytes), the
transport holds at most one ``CHUNK`` of an answer (the server hands bodies over in
chunks and waits for the previous one to reach the kernel), and an answer that makes
no progress for ``WRITE_TIMEOUT`` seconds (the client reads nothing) is aborted and
its slot freed. A pipelined request is served only once the client has taken the
answer before it (nothing of it left in the kernel's send queue), so a client that
pipelines and never reads costs one answer, not one per request it sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import ssl
import sys
import termios
from asyncio import sslproto
from collections.abc import Callable
from typing import Any, cast

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from exporter.core.labels import Vocabulary
from exporter.serve.slots import BUSY, IDLE, MAX_CONNECTIONS, STALLED, UNPROVEN, Slots

__all__ = ["AUTH_MARK", "CHUNK", "IDLE", "MAX_CONNECTIONS", "Auth", "BoundedH11", "Slots",
           "protocol_factory"]
log = structlog.get_logger(__name__)

HEADER_TIMEOUT = 10.0  # seconds a connection may take to send a complete request head
HANDSHAKE_TIMEOUT = 5  # seconds a TLS handshake may take
TLS_READ_BUFFER = 16 * 1024  # asyncio's default is 256 KiB per connection, zero-filled
WRITE_TIMEOUT = 10.0  # seconds an answer may wait for the client to read it
SEND_BUFFER = 64 * 1024  # SO_SNDBUF of an accepted socket (Linux doubles it: 128 KiB)
CHUNK = 64 * 1024  # an answer is handed to the transport this much at a time
PIPELINE_POLL = 0.05  # seconds between looks at whether a pipelining client has read

AUTH_MARK = "gpu_exporter.auth"  # scope["extensions"] key: the auth middleware's report


class Auth(Vocabulary):
    """What the auth middleware reports of a request through ``AUTH_MARK``."""

    CHECKING = "checking"  # its password waits in the bcrypt queue
    OK = "ok"
    FAILED = "failed"
    LIMITED = "limited"  # not checked: its address used up its guesses


class BoundedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol holding a slot, with a bound on request-head time.

    uvicorn waits forever for a request that never completes its headers (slowloris).
    Here a request head must be complete within ``header_timeout`` of its first byte
    (or of the connection, for one that sends nothing); an idle keep-alive connection
    is closed by uvicorn's keep-alive timeout. The auth middleware reports through
    ``scope["extensions"][AUTH_MARK]["report"]`` (an ``Auth``), which
    moves the connection between the unproven and the good ones.
    """

    header_timeout = HEADER_TIMEOUT
    slots: Slots
    allowed_sans: frozenset[str] = frozenset()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raw: asyncio.Transport | None = None  # TCP (under TLS: below it)
        self.evicted = False
        self.failed_auth = False
        self.state = UNPROVEN  # as the request and auth say (the write stall aside)
        self.pipelined = False  # the request being served was sent before the last answer
        self.write_stalled = False  # the answer waits for the client to read
        self._completing = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._behind: asyncio.TimerHandle | None = None  # a pipelined request waits
        self._behind_since: float | None = None

    def evict(self) -> None:
        """Close to make room: now, or as soon as the accepted socket is handed over."""
        self.evicted = True
        if self.raw is not None:
            self.raw.abort()

    def _mark(self, state: str) -> None:
        self.state = state
        stalled = state == IDLE and self.write_stalled or \
            state == BUSY and (self.write_stalled or self.pipelined)
        self.slots.mark(self, STALLED if stalled else state)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.raw is None:
            self.raw = transport
            bound_send_buffer(transport)
        super().connection_made(transport)
        if self.evicted or not self._san_allowed(transport):
            transport.abort()
            return
        # Paused (uvicorn waits before its next write) as soon as anything waits in
        # user space: with bodies handed over in CHUNKs, at most one is buffered here.
        # Under TLS (a high water mark of 1): as soon as TLS holds anything unsent.
        transport.set_write_buffer_limits(high=0 if transport is self.raw else 1, low=0)
        self._arm()

    # -- writes that make no progress ----------------------------------------------------
    def pause_writing(self) -> None:
        """The client has not read what the kernel holds for it: its slot may be taken
        for room (the oldest stall first) and, WRITE_TIMEOUT seconds on, it is aborted."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(WRITE_TIMEOUT, self._write_timeout)
        if not self.write_stalled:
            self.write_stalled = True
            self._mark(self.state)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_write_timer()
        if self.write_stalled:
            self.write_stalled = False
            self._mark(self.state)

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timeout(self) -> None:
        self._write_timer = None
        transport = self.raw or self.transport
        if transport is not None:  # also a close() still waiting for its buffer to drain
            transport.abort()

    def _san_allowed(self, transport: asyncio.Transport) -> bool:
        if not self.allowed_sans:
            return True
        cert = transport.get_extra_info("peercert") or {}
        names = {value for _kind, value in cert.get("subjectAltName", ())}
        return bool(names & self.allowed_sans)

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            self._arm()  # part of a request head: it has header_timeout to complete

    def handle_events(self) -> None:
        was_idle = self.conn.their_state is h11.IDLE
        super().handle_events()
        if was_idle and self.conn.their_state is not h11.IDLE:
            self._disarm()  # a whole request head arrived
            self.failed_auth = False
            # sent before the answer to the one before it was complete: pipelined
            self.pipelined = self._completing
            self._mark(BUSY)
            if self.cycle is not None:
                # The request's task starts on the next loop turn: the scope can
                # still be given the hook the auth middleware reports through.
                self.scope.setdefault("extensions", {})[AUTH_MARK] = {"report": self._auth}

    def _auth(self, state: Auth) -> None:
        """CHECKING (a password in the queue), OK, or a failure (FAILED, LIMITED)."""
        if state == Auth.OK:
            self._mark(BUSY)
            return
        self.failed_auth = state != Auth.CHECKING
        self._mark(UNPROVEN)

    def on_response_complete(self) -> None:
        if self._client_behind():
            # A pipelined request waits, and the client has not taken the last answer
            # yet: serve it once the client has (checked every PIPELINE_POLL seconds;
            # WRITE_TIMEOUT without progress aborts). A reader that never reads costs
            # one answer, not one per request it sends.
            loop = self.loop
            if self._behind_since is None:
                self._behind_since = loop.time()
                self.write_stalled = True
                self._mark(self.state)
            if loop.time() - self._behind_since > WRITE_TIMEOUT:
                (self.raw or self.transport).abort()
                return
            self._behind = loop.call_later(PIPELINE_POLL, self.on_response_complete)
            return
        if self._behind_since is not None:
            self._behind_since = self._behind = None
            if not self.flow.write_paused:
                self.write_stalled = False
        self._completing = True
        try:
            # starts a pipelined request already received (handle_events marks it)
            super().on_response_complete()
        finally:
            self._completing = False
        if self.transport.is_closing():
            self.slots.release(self)  # answered, and closing: its slot is free now
        elif self.conn.their_state is h11.IDLE:
            # kept alive, waiting for the next request (none was pipelined)
            self.pipelined = False
            self._mark(UNPROVEN if self.failed_auth else IDLE)

    def eof_received(self) -> None:
        """The client has closed its end: the slot is free unless a request is served."""
        if not self.serving():
            self.slots.release(self)
        super().eof_received()

    def serving(self) -> bool:
        """A request is in progress (its answer not complete): its password checked, or
        being checked, or served. Such a connection keeps its slot until the end."""
        cycle = self.cycle
        return self.state is BUSY or (cycle is not None and not cycle.response_complete)

    def _client_behind(self) -> bool:
        """A pipelined request is buffered while the answers before it still wait in
        this process or the kernel's send queue (unread, or not acknowledged)."""
        if self.transport.is_closing() or not self.conn.trailing_data[0]:
            return False
        if self.transport.get_write_buffer_size():
            return True
        sock = (self.raw or self.transport).get_extra_info("socket")
        if sock is None or not hasattr(termios, "TIOCOUTQ"):
            return False
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):  # reset by the client
                (self.raw or self.transport).abort()
                return True
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
        except OSError:
            return False
        return int.from_bytes(queued, sys.byteorder) > 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._cancel_write_timer()
        if self._behind is not None:
            self._behind.cancel()
            self._behind = None
        self.slots.release(self)
        super().connection_lost(exc)


_STATES = getattr(sslproto, "SSLProtocolState", None)  # Python 3.11+
_UNWRAPPED = getattr(_STATES, "UNWRAPPED", None)
_CLOSING = tuple(getattr(_STATES, name) for name in ("FLUSHING", "SHUTDOWN", "UNWRAPPED")
                 if _STATES is not None)


class TLSAccept(sslproto.SSLProtocol):
    """asyncio's server-side TLS, made by the protocol factory, so the connection has
    its slot from accept and its handshake ``HANDSHAKE_TIMEOUT``."""

    max_size = 1  # what __init__ allocates: the read buffer grows on the first read

    def __init__(self, app: BoundedH11, context: ssl.SSLContext) -> None:
        super().__init__(app.loop, app, context, None,  # type: ignore[arg-type]
                         server_side=True, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
        self.max_size = TLS_READ_BUFFER
        self.app = app

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.app.raw = transport
        bound_send_buffer(transport)
        # TLS stops taking plaintext (and pauses the app) while TCP holds anything unsent
        transport.set_write_buffer_limits(high=0, low=0)
        if self.app.evicted:  # made room for a later one before it was handed over
            transport.abort()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.app.slots.release(self.app)  # also when the handshake never finished
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # True: kept open
        """The client has closed its end of the TCP connection."""
        if not self.app.serving():
            self.app.slots.release(self.app)
        keep: bool | None = super().eof_received()
        return keep

    def _set_state(self, new_state: Any) -> None:
        """(Python 3.11+, asyncio's TLS state machine) A connection that starts its TLS
        shutdown, or is unwrapped after a failed handshake, gives its slot back now,
        unless it serves a request (its answer's end releases it then)."""
        before = getattr(self, "_state", None)
        super()._set_state(new_state)  # type: ignore[misc]
        if before is not _UNWRAPPED and getattr(self, "_state", None) in _CLOSING and \
                not self.app.serving():
            self.app.slots.release(self.app)

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if isinstance(handshake_exc, ssl.SSLError):  # refused here, not a client gone
            # The alert OpenSSL wrote for the client (certificate required, unknown CA,
            # handshake failure): asyncio closes without sending it.
            transport = cast(asyncio.Transport | None, self._transport)
            outgoing = getattr(self, "_outgoing", None)  # Python 3.11+
            if transport is not None and outgoing is not None and not transport.is_closing():
                alert = outgoing.read()
                if alert:
                    transport.write(alert)
            self.app.slots.handshake_refused(
                handshake_exc, transport.get_extra_info("peername") if transport else None)
        super()._on_handshake_complete(handshake_exc)


def bound_send_buffer(transport: asyncio.BaseTransport) -> None:
    """SO_SNDBUF of an accepted socket: Linux grows an unset one up to
    net.ipv4.tcp_wmem's maximum (4 MiB), which a client that never reads fills."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)


class Refused(asyncio.Protocol):
    """A connection accepted only to be closed: every slot is serving a request."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


def protocol_factory(slots: Slots, context: ssl.SSLContext | None,
                     allowed_sans: frozenset[str] = frozenset(),
                     header_timeout: float = HEADER_TIMEOUT) -> Callable[..., asyncio.BaseProtocol]:
    """What uvicorn's ``http=`` calls for each accepted connection (with its keywords):
    the slot is taken here, before any TLS object is made."""

    def make(**kwargs: Any) -> asyncio.BaseProtocol:
        app = BoundedH11(**kwargs)
        app.slots, app.allowed_sans, app.header_timeout = slots, allowed_sans, header_timeout
        if not slots.admit(app):
            return Refused()
        return app if context is None else TLSAccept(app, context)

    return make
