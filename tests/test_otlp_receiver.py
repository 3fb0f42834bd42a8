"""The OTLP push against receivers that misbehave, on 127.0.0.1: a 200 whose body claims
400 MiB (Content-Length, or a chunked stream without end), one that trickles a byte at a
time after (or within) its headers, and a 307. The push must read a bounded body, end
within --otlp.timeout of wall-clock time, refuse the redirect, and count and show each
failure (gpu_exporter_otlp_exports_total, /snapshot's otlp.last_error, the page)."""

from __future__ import annotations

import re
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from exporter.core.config import Config  # noqa: E402
from exporter.output.otlp import Pusher  # noqa: E402
from exporter.output.render import RenderOptions  # noqa: E402
from exporter.pipeline.hub import Hub  # noqa: E402

MIB = 1024 * 1024
CLAIM = 400 * MIB


class Receiver:
    """A raw HTTP/1.1 server: reads each request (headers and Content-Length body), then
    ``reply(conn, path)`` writes whatever it likes. Counts requests per path and the
    bytes each reply managed to write before the client went away."""

    def __init__(self, reply: Callable[[Receiver, socket.socket, str], None]) -> None:
        self.reply = reply
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.paths: list[str] = []
        self.written = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next((int(x.split(":", 1)[1]) for x in lines
                           if x.lower().startswith("content-length:")), 0)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            path = lines[0].split()[1]
            self.paths.append(path)
            try:
                self.reply(self, conn, path)
            except OSError:
                pass  # the client hung up: what it should do

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.written += len(data)

    def close(self) -> None:
        self.stop.set()
        self.server.close()


@contextmanager
def receiver(reply: Callable[[Receiver, socket.socket, str], None]) -> Iterator[Receiver]:
    r = Receiver(reply)
    try:
        yield r
    finally:
        r.close()


def pusher(url: str, timeout: float = 1.0) -> Pusher:
    config = Config(otlp_endpoint=url, otlp_timeout=timeout)
    return Pusher(config, Hub(config, []), RenderOptions())


def push(p: Pusher, limit: float = 30.0) -> tuple[bool, float]:
    """(push_once's result, seconds it took), on a thread so that a hang fails the test."""
    out: list[bool] = []
    t0 = time.monotonic()
    thread = threading.Thread(target=lambda: out.append(p.push_once()), daemon=True)
    thread.start()
    thread.join(limit)
    assert out, f"the push still runs after {limit}s"
    return out[0], time.monotonic() - t0


def endless(r: Receiver, conn: socket.socket, chunked: bool) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n" if chunked else \
        f"Content-Length: {CLAIM}\r\n\r\n".encode()
    r.send(conn, head)
    block = b"\0" * (1024 * 1024)
    framed = f"{len(block):x}\r\n".encode() + block + b"\r\n" if chunked else block
    while r.written < CLAIM + MIB:  # never the end of a chunked stream
        r.send(conn, framed)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_400_mib_body_is_not_read(chunked: bool) -> None:
    """A 200 with a 400 MiB body swung RSS 105 -> 830 MB on every push: all of it was read."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with receiver(lambda r, c, _: endless(r, c, chunked)) as r:
        p = pusher(r.url, timeout=5.0)
        ok, took = push(p)
        time.sleep(0.2)  # the receiver's last send fails once the client has closed
        written = r.written
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert ok and p.counts == {"sent": 1, "failed": 0, "dropped": 0}  # a 200: delivered
    assert written < 64 * MIB, written  # the client stopped reading: socket buffers only
    assert grown_mib < 64, grown_mib
    assert took < 5.0


def trickle(r: Receiver, conn: socket.socket, in_headers: bool) -> None:
    head = b"HTTP/1.1 200 OK\r\n" if in_headers else \
        b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"
    r.send(conn, head)
    for _ in range(100000):
        r.send(conn, b"X-Slow: y\r\n"[:1] if in_headers else b"x")
        time.sleep(0.1)  # well inside any socket timeout: a read timeout never fires


@pytest.mark.slow
@pytest.mark.parametrize("in_headers", [False, True], ids=["body", "headers"])
def test_a_trickling_receiver_is_cut_at_the_timeout(in_headers: bool) -> None:
    """A byte a second after the headers held an export past --otlp.timeout for as long as
    the receiver liked, with sent/failed/dropped all 0 and the page saying "ok"."""
    with receiver(lambda r, c, _: trickle(r, c, in_headers)) as r:
        p = pusher(r.url, timeout=1.0)
        ok, took = push(p)
    assert not ok and p.counts == {"sent": 0, "failed": 1, "dropped": 0}
    assert 0.9 < took < 3.0, took  # the 1 s timeout, and a little
    status = p.status()
    assert "within --otlp.timeout (1s)" in status["last_error"], status
    assert status["last_success_timestamp"] is None


def redirect(r: Receiver, conn: socket.socket, path: str) -> None:
    if path == "/v1/metrics":
        r.send(conn, f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {r.url}/elsewhere\r\n"
                     "Content-Length: 0\r\n\r\n".encode())
    else:
        r.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")


def test_a_redirect_is_not_followed_and_counts_as_failed() -> None:
    """A 307 counted as `sent` (10 of 10) with nothing delivered."""
    with receiver(redirect) as r:
        p = pusher(r.url, timeout=2.0)
        results = [push(p)[0] for _ in range(3)]
    assert results == [False] * 3
    assert p.counts == {"sent": 0, "failed": 3, "dropped": 0}
    assert r.paths == ["/v1/metrics"] * 3  # never /elsewhere
    assert "HTTP 307 Temporary Redirect to " in p.status()["last_error"]
    assert "redirects are not followed" in p.status()["last_error"]


@pytest.mark.slow
def test_the_failures_show_on_the_page_and_in_the_counters(tmp_path: Path) -> None:
    """The daemon's own view: the counter and the page's otlp row say failing (a machine
    with a GPU: the counters are served with each new snapshot)."""
    from tests.daemon import FIXTURES, machine_args, running
    from tests.test_otlp import otlp_exports, wait_for

    machine = machine_args(FIXTURES / "amd-rdna3-rx7800xt")
    with receiver(lambda r, c, _: trickle(r, c, False)) as r, \
            running([*machine, "--otlp.endpoint", r.url, "--otlp.interval", "200ms",
                     "--otlp.timeout", "500ms"], tmp_path) as d:
        wait_for(lambda: otlp_exports(d).get("failed", 0) >= 2)
        page = d.get("/").text
        snapshot = d.get("/snapshot").json()
    assert snapshot["otlp"]["exports"]["sent"] == 0
    assert "within --otlp.timeout (0.5s)" in snapshot["otlp"]["last_error"]
    assert re.search(r'>otlp push</td><td data-label="state"[^>]*>[^<]*failing', page), page
