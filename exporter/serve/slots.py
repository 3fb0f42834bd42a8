"""Who makes room when every connection slot is taken, and when a slot is given back.

A server has ``limit`` slots (exporter.serve.connections takes one per accepted connection).
When every slot is taken, the oldest *stalled* connection makes room: one whose
answer waits for the client to read it, or that is served a pipelined request (no
scraper or probe pipelines). Then the oldest *unproven* one: one still in its
handshake, one that has not sent a request yet, one waiting for its password to be
checked, or one whose last request failed authentication. Only when none is left
does the oldest idle keep-alive connection of a good client (a Prometheus
between two scrapes) go; a connection serving a good request is never closed for
room. So a flood of wrong passwords on keep-alive connections cannot keep a probe or
a scrape with the right password out. A refused connection is one log line per
minute that names the limit; a connection closed to make room is counted by its state
(``gpu_exporter_http_connections_evicted_total``) and is one log line per minute too.

A slot is given back as soon as its connection starts to close (the TLS shutdown begun,
the client's end of file, the answer of a ``Connection: close`` request sent), not when
asyncio has closed the socket a few event-loop turns later: under a load of clients
that open a new TLS connection per request those turns are long, and 200 such clients
held over 256 slots with finished connections, so handshakes in progress were evicted
(reset) to make room. A connection serving a request keeps its slot until it ends.
And before a live connection is closed for room, a connection whose client has already
closed its end (its end of file not read yet: the event loop is behind) gives its slot
back (``peer_closed``: the socket's TCP state, Linux).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Hashable, Mapping
from typing import Protocol

import structlog

from exporter.core.logs import Every

log = structlog.get_logger(__name__)

MAX_CONNECTIONS = 256  # open connections at most (fewer when file descriptors are scarce)
# The states a connection is in, for choosing which one makes room.
UNPROVEN = "unproven"  # handshake, no request yet, password being checked, auth failed
BUSY = "busy"  # a good request in progress: never closed for room
STALLED = "stalled"  # its answer waits for the client to read, or a pipelined request
IDLE = "idle"  # a good client's keep-alive connection between requests


class Connection(Hashable, Protocol):
    """What a slot holds (exporter.serve.connections' protocol): the TCP transport below
    any TLS, and how to close it to make room."""

    raw: asyncio.Transport | None

    def evict(self) -> None: ...


class Slots:
    """The connections of one server: counted from accept, oldest first per state."""

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        self.limit = limit
        self.open: set[Connection] = set()
        self._unproven: dict[Connection, None] = {}
        self._stalled: dict[Connection, None] = {}
        self._idle: dict[Connection, None] = {}
        self._refused = Every()
        self._crowded = False  # half the slots or more were taken since the last trim
        # connections closed to make room, by the state they were in (a counter)
        self.evictions: dict[str, int] = {STALLED: 0, UNPROVEN: 0, IDLE: 0}

    def admit(self, connection: Connection) -> bool:
        """Take a slot for a just-accepted connection, closing another if need be."""
        if len(self.open) >= self.limit and not self._reap():
            victim, state = self._victim()
            if victim is None:
                held = self._refused.allow("refused")
                if held is not None:
                    log.warning("connection refused: every connection slot is serving a "
                                "request", limit=self.limit, suppressed_since_last=held)
                return False
            self.release(victim)
            victim.evict()
            self.evictions[state] += 1
            held = self._refused.allow("evicted")
            if held is not None:
                log.warning("connection closed to make room: every connection slot is "
                            "taken", limit=self.limit, state=state,
                            suppressed_since_last=held)
        self.open.add(connection)
        self._unproven[connection] = None
        return True

    def _reap(self) -> bool:
        """Give back the slot of the oldest connection not serving a request whose
        client has already closed (its end of file not yet read: the event loop is
        behind). Such a connection is over; closing it loses nothing."""
        for line in (self._idle, self._unproven, self._stalled):
            for connection in line:
                if peer_closed(connection.raw):
                    self.release(connection)
                    connection.evict()
                    return True
        return False

    def _victim(self) -> tuple[Connection | None, str]:
        """The oldest stalled connection, else unproven, else idle, and its state."""
        for state, line in ((STALLED, self._stalled), (UNPROVEN, self._unproven),
                            (IDLE, self._idle)):
            for victim in line:
                return victim, state
        return None, ""

    def counts(self) -> Mapping[str, int]:
        """The evictions so far, by state: what ``/metrics`` serves."""
        return dict(self.evictions)

    def handshake_refused(self, error: BaseException, peer: object) -> None:
        """A TLS handshake the server refused: one line per reason per minute."""
        reason = str(getattr(error, "reason", None) or error)
        held = self._refused.allow(("tls", reason))
        if held is not None:
            log.warning("TLS handshake refused", reason=reason, client=str(peer),
                        suppressed_since_last=held)

    def mark(self, connection: Connection, state: str) -> None:
        if connection not in self.open:
            return
        if state == STALLED and connection in self._stalled:
            return  # stays where it is: the oldest stall goes first
        self._unproven.pop(connection, None)
        self._stalled.pop(connection, None)
        self._idle.pop(connection, None)
        if state == UNPROVEN:
            self._unproven[connection] = None
        elif state == STALLED:
            self._stalled[connection] = None
        elif state == IDLE:
            self._idle[connection] = None

    def release(self, connection: Connection) -> None:
        self.open.discard(connection)
        if len(self.open) >= self.limit // 2:
            self._crowded = True
        elif self._crowded and len(self.open) <= self.limit // 8:
            self._crowded = False  # a crowd has gone: give its buffers back
            return_free_memory()
        self._unproven.pop(connection, None)
        self._stalled.pop(connection, None)
        self._idle.pop(connection, None)


# Linux's TCP states (include/net/tcp_states.h) of a socket whose peer has closed or
# reset it: the first byte of TCP_INFO.
_PEER_CLOSED = frozenset({7, 8})  # TCP_CLOSE, TCP_CLOSE_WAIT


def peer_closed(transport: asyncio.BaseTransport | None) -> bool:
    """Whether the client of an accepted TCP connection has sent its FIN or a reset
    (Linux); False where that cannot be told."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    info = getattr(socket, "TCP_INFO", None)
    if sock is None or info is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, info, 1)[0] in _PEER_CLOSED
    except OSError:
        return False


def return_free_memory() -> None:
    """glibc's malloc_trim(0): the pages freed by many connections' buffers (TLS above
    all) go back to the system instead of staying in the process's RSS. No-op off
    glibc."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
