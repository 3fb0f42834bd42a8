"""Clients that never read and clients that hang up (issue 27, items 1 and 2), at a
small scale on an in-process server; bench/slow_readers.py and bench/hung_up.py run
the full-size floods against the daemon. Loopback only; bounded in count and time."""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from exporter.core.config import Config
from exporter.output.render import Renderer
from exporter.output.render.exposition import PAGE_QUEUE, Busy, Worker
from exporter.pipeline.hub import Hub
from exporter.serve import connections
from exporter.serve.connections import CHUNK, IDLE, Slots, protocol_factory
from exporter.serve.middleware import ChunkedBodyMiddleware
from exporter.serve.server import Server, build_app
from tests.test_server_hardening import Big

BODY = bytes(range(256)) * 4096  # 1 MiB: far more than the socket buffers hold


@contextmanager
def serving(app: object, limit: int | Slots, tls: ssl.SSLContext | None = None
            ) -> Iterator[tuple[int, Slots]]:
    """``app`` behind the daemon's own server and protocol (``limit`` connection slots,
    TLS with ``tls``) on a loopback port, in this process: (port, slots)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    slots = limit if isinstance(limit, Slots) else Slots(limit)
    server = Server(uvicorn.Config(app, http=protocol_factory(slots, tls),  # type: ignore[arg-type]
                                   log_config=None, lifespan="off", ws="none", backlog=128))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1], slots
    finally:
        server.handle_exit(signal.SIGTERM, None)
        thread.join(5)
        sock.close()


SERVED: list[str] = []


def big_app() -> Starlette:
    async def count(request: Request) -> Response:
        SERVED.append(request.url.path)
        return PlainTextResponse("counted\n")

    async def big(request: Request) -> Response:
        return Response(BODY, media_type="application/octet-stream")

    async def slow(request: Request) -> Response:
        await asyncio.sleep(0.6)
        return PlainTextResponse("slow\n")

    async def healthy(request: Request) -> Response:
        return PlainTextResponse("OK\n")

    app = Starlette(routes=[Route("/big", big), Route("/slow", slow), Route("/count", count),
                            Route("/-/healthy", healthy)])
    app.add_middleware(ChunkedBodyMiddleware)  # as build_app does
    return app


def slow_reader(port: int, path: str = "/big", pipelined: int = 4) -> socket.socket:
    """A connection with a 4 KB receive buffer that pipelines requests, never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * pipelined)
    return s


def probe(port: int) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=3).status_code
    except httpx.TransportError:
        return 0


@pytest.mark.slow
def test_slow_readers_do_not_pin_every_slot() -> None:
    """27.1: a connection whose answer waited forever in the transport's drain was
    "busy" and never evicted: 260 such connections reset every new one, probes too."""
    with serving(big_app(), limit=16) as (port, slots):
        readers = [slow_reader(port) for _ in range(20)]
        try:
            time.sleep(1.0)  # their answers fill the socket buffers
            probes = []
            for _ in range(6):
                probes.append(probe(port))
                readers.append(slow_reader(port))  # the flood goes on
                time.sleep(0.2)
            assert len(slots.open) <= 16
            # at most one chunk of an answer waits in this process per connection
            buffered = [c.transport.get_write_buffer_size() for c in list(slots.open)
                        if c.transport is not None]
        finally:
            for s in readers:
                s.close()
    assert probes == [200] * 6, probes
    assert max(buffered) <= CHUNK + 1024, buffered  # was the whole 1 MiB body


def test_an_answer_that_makes_no_progress_is_aborted(monkeypatch: pytest.MonkeyPatch) -> None:
    """27.1: no write timeout: a client that never reads held its slot forever."""
    monkeypatch.setattr(connections, "WRITE_TIMEOUT", 0.5)
    with serving(big_app(), limit=16) as (port, slots):
        s = slow_reader(port, pipelined=1)
        try:
            time.sleep(0.2)
            (connection,) = slots.open
            stalled = connection.write_stalled  # its answer waits for the client
            deadline = time.monotonic() + 5
            while slots.open and time.monotonic() < deadline:
                time.sleep(0.05)
            freed = not slots.open
            closed = connection.transport.is_closing()
        finally:
            s.close()
    assert stalled
    assert freed and closed


@pytest.mark.slow  # a real server, seconds of waiting
def test_a_client_that_pipelines_and_never_reads_is_not_served_on_and_on() -> None:
    """27.1: each pipelined request was answered while the kernel took the answers
    (megabytes of send buffer): a reader that never reads cost the server a request's
    work for every request it sent. Now the next one waits for the client to read."""
    SERVED.clear()
    with serving(big_app(), limit=16) as (port, slots):
        s = slow_reader(port, "/count", pipelined=400)
        try:
            time.sleep(1.5)
            served = len(SERVED)
            (connection,) = slots.open
            stalled = connection.write_stalled
        finally:
            s.close()
    assert 0 < served < 200, served  # a 4 KB receive buffer holds a few dozen answers
    assert stalled  # and it is the first to make room


@pytest.mark.slow  # a real server, seconds of waiting
def test_a_pipelined_connection_is_not_idle_while_it_is_served() -> None:
    """27.1: after the first answer a pipelined connection was marked idle (evicted as a
    good client between scrapes would be) while its next request was being served."""
    with serving(big_app(), limit=16) as (port, slots):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
            time.sleep(0.9)  # the first answered, the second being served
            (connection,) = slots.open
            states = (connection in slots._idle, connection.pipelined)
            s.settimeout(5)
            data = b""
            while data.count(b"slow\n") < 2:
                data += s.recv(4096)
            time.sleep(0.1)
            after = connection in slots._idle
    assert states == (False, True)
    assert after  # both answered: now it is a kept-alive connection waiting
    assert connection.state == IDLE


def test_page_renders_have_a_bounded_queue_of_their_own() -> None:
    """27.2: page renders shared the renderer's unbounded queue with /metrics."""
    worker = Worker("pages", PAGE_QUEUE)
    gate = threading.Event()
    running = worker.call(gate.wait)  # occupies the thread
    time.sleep(0.1)
    queued = [worker.call(lambda: 1) for _ in range(PAGE_QUEUE)]
    with pytest.raises(Busy):
        worker.call(lambda: 2)
    queued[0].cancel()  # a client gone: skipped, never run
    gate.set()
    assert running.result(5) is True
    assert [f.result(5) for f in queued[1:]] == [1] * (PAGE_QUEUE - 1)
    assert queued[0].cancelled()
    worker.stop()


def _renderer_with_history() -> tuple[Starlette, Renderer]:
    hub = Hub(Config(), [Big()])
    renderer = Renderer()
    renderer.render_now(hub.collect_once())
    return build_app(Config(), hub, renderer), renderer


@pytest.mark.slow  # a real server, seconds of waiting
def test_a_page_for_a_client_gone_is_never_rendered() -> None:
    """27.2: 600 GET / that reset after 5 ms each queued a render; /metrics waited behind
    them (23.4 s) on the one renderer thread."""
    app, renderer = _renderer_with_history()
    renders: list[float] = []
    real_call = renderer.pages.call

    def counting(fn):  # type: ignore[no-untyped-def]
        def counted():  # type: ignore[no-untyped-def]
            renders.append(time.monotonic())
            return fn()
        return real_call(counted)

    renderer.pages.call = counting  # type: ignore[method-assign]
    gate = threading.Event()
    blocker: Future[bool] = real_call(gate.wait)  # the pages' thread is busy
    with serving(app, limit=64) as (port, _slots):
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                time.sleep(0.005)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        time.sleep(0.3)
        waiting = renderer.pages.waiting
        # /metrics is not behind the pages: answered while the pages' thread is busy
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=20)
        gate.set()
        blocker.result(5)
        time.sleep(0.3)
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
    assert waiting <= PAGE_QUEUE
    assert len(renders) == 1  # the last page only: none for the ten clients gone
    assert metrics.status_code == 200
    assert page.status_code == 200
    renderer.stop()


@pytest.mark.slow  # a real server, seconds of waiting
def test_a_full_page_queue_answers_503() -> None:
    app, renderer = _renderer_with_history()
    gate = threading.Event()
    blocker = renderer.pages.call(gate.wait)
    with serving(app, limit=64) as (port, _slots):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            held = [threading.Thread(target=client.get, args=("/",))
                    for _ in range(PAGE_QUEUE)]
            for t in held:
                t.start()
            time.sleep(0.5)
            refused = httpx.get(f"http://127.0.0.1:{port}/api/v1/history", timeout=5)
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            gate.set()
            blocker.result(5)
            for t in held:
                t.join(10)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert metrics.status_code == 200
    renderer.stop()


def test_one_history_or_page_view_serves_at_most_max_points_per_gpu() -> None:
    """27.2: at --web.history 24h with 8 GPUs one /api/v1/history was 22 MiB and
    +206 MiB of RSS, one page 2.75 s: now every k-th sample, the newest included."""
    from exporter.core.model import DeviceInfo, DeviceSample
    from exporter.serve.history import MAX_POINTS, History

    device = DeviceSample(info=DeviceInfo(vendor="nvidia", pci_bus_id="0000:01:00.0",
                                          uuid="GPU-1"), source="nvml", power_watts=100.0)

    class Snap:
        ready = True
        devices = (("0", device),)
        backends = ()
        health = ()

    history = History(86_400, 1.0)
    for i in range(5_000):
        history.add(Snap(), now=1e9 + i)  # type: ignore[arg-type]
    (gpu,) = history.as_json()["gpus"]
    times = gpu["t"]
    assert len(times) <= MAX_POINTS and times[-1] == 1e9 + 4_999
    steps = {round(b - a) for a, b in zip(times, times[1:], strict=False)}
    assert steps == {5}, steps  # 5,000 samples: every 5th, evenly
    assert gpu["power"] == [100.0] * len(times)
    # what the page asks for next (only what is new) is not thinned
    assert history.as_json(since=1e9 + 4_989)["gpus"][0]["t"] == \
        [1e9 + i for i in range(4_990, 5_000)]
