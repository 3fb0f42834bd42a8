"""A server that lies: the other end of ``gpu-exporter top`` and ``snapshot --from`` as
the client must expect it, on a free local port. Every connection gets the same
behaviour: a JSON reply (whatever it holds), an HTTP status, a reply trickled a byte at
a time, or an endless one. Written on raw sockets, not http.server, so that nothing
between the test and the wire tidies the reply up."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Behaviour = Callable[[socket.socket, threading.Event], None]


def _head(status: str, length: int | None, kind: str = "application/json") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Type: {kind}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def reply(body: Any, status: str = "200 OK") -> Behaviour:
    """``body`` (JSON-encoded unless bytes) as a whole reply."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def send(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head(status, len(data)) + data)
    return send


def trickle(body: Any, every: float = 2.0, headers_too: bool = False) -> Behaviour:
    """A whole reply, one byte every ``every`` seconds (the headers at once unless
    ``headers_too``)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    def send(conn: socket.socket, stop: threading.Event) -> None:
        head = _head("200 OK", len(data))
        if not headers_too:
            conn.sendall(head)
            head = b""
        for i in range(len(head + data)):
            if stop.wait(every if i else 0):
                return
            conn.sendall((head + data)[i:i + 1])
    return send


def endless(total: int, with_length: bool = False) -> Behaviour:
    """A JSON list ``total`` bytes long, sent as fast as it is read (a Content-Length
    only with ``with_length``), never built whole."""
    chunk = b"0," * (1 << 19)  # 1 MiB

    def send(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(_head("200 OK", total if with_length else None) + b"[")
        sent = 1
        while sent < total - 2 and not stop.is_set():
            part = chunk[:total - 2 - sent]
            conn.sendall(part)
            sent += len(part)
        conn.sendall(b"0]")
    return send


class Server:
    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        self.requests = 0
        self.sent_at: list[float] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(30)
                data = b""
                while b"\r\n\r\n" not in data and len(data) < 65536:
                    more = conn.recv(4096)
                    if not more:
                        return
                    data += more
                self.requests += 1
                self.sent_at.append(time.monotonic())
                self.behaviour(conn, self.stop)
            except OSError:
                return  # the client went: as it should, often

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@contextmanager
def serving(behaviour: Behaviour) -> Iterator[Server]:
    server = Server(behaviour)
    try:
        yield server
    finally:
        server.close()
