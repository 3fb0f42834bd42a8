"""One owner of the lifecycle: the Daemon starts and stops everything (Hub, renderer and its
threads, OTLP pusher, reloader, discovery), once, in every mode; the HTTP server's lifespan
stops nothing it did not start."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from exporter.app.daemon import Daemon
from exporter.app.flags import load_config
from exporter.core.config import Config
from exporter.core.model import DeviceInfo
from exporter.output.render import Renderer
from exporter.pipeline.hub import Hub
from exporter.serve.server import build_app
from exporter.sources.base import KERNEL, PLAIN, Cycle
from tests.daemon import FIXTURES, REPO, daemon_env, machine_args, running

MACHINE = FIXTURES / "amd-rdna3-rx7800xt"  # sysfs and fdinfo


def _ours(before: set[threading.Thread]) -> set[threading.Thread]:
    """Threads alive now that were not before, less an OTLP receiver's request threads."""
    return {t for t in threading.enumerate() if t not in before and t.is_alive()
            and "process_request_thread" not in t.name}


def _wait(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def receiver() -> Iterator[str]:
    """An OTLP receiver's URL (tests/test_otlp.py's), where the otlp extra is installed."""
    from tests.test_otlp import receiving  # skips without opentelemetry-proto

    with receiving() as r:
        yield r.url


def test_after_stop_every_thread_the_daemon_started_has_ended(receiver: str) -> None:
    config = load_config([*machine_args(MACHINE), "--no-collector.nvidia",
                          "--collector.interval", "100ms", "--otlp.endpoint", receiver,
                          "--otlp.interval", "100ms"], {})
    before = set(threading.enumerate())
    daemon = Daemon(config)
    daemon.start()
    _wait(lambda: daemon.hub.snapshot.ready and daemon.pusher.counts["sent"] >= 1)
    daemon.renderer.body("text")  # the renderer's threads: started on first use
    daemon.renderer.body("text")  # a scrape cadence: the next snapshot is rendered ahead
    daemon.renderer.submit(daemon.hub.snapshot)
    daemon.renderer.pages.call(lambda: None).result(5)
    _wait(lambda: daemon.renderer.worker.thread is not None)
    started = {t.name for t in _ours(before)}
    assert {"collector-amd", "collector-fdinfo", "collector-watchdog",
            "renderer", "pages", "otlp-push"} <= started, started
    daemon.stop()
    assert _ours(before) == set(), [t.name for t in _ours(before)]
    # Stopped: a snapshot published late, a page asked late start no thread again.
    daemon.renderer.submit(daemon.hub.snapshot)
    assert daemon.renderer.pages.call(lambda: None).cancelled()
    assert _ours(before) == set()


def test_stopping_twice_is_harmless_and_nothing_starts_after_a_stop() -> None:
    config = load_config([*machine_args(MACHINE), "--no-collector.nvidia"], {})
    before = set(threading.enumerate())
    daemon = Daemon(config)
    daemon.start()
    _wait(lambda: daemon.hub.snapshot.ready)
    daemon.stop()
    daemon.stop()
    daemon.stop(timeout=0)
    assert _ours(before) == set()
    stopped = Daemon(config)
    stopped.stop()
    stopped.start()  # after a stop: nothing starts
    assert stopped.renderer is None and _ours(before) == set()
    stopped.stop()


def test_the_snapshot_command_stops_what_it_opened() -> None:
    config = load_config([*machine_args(MACHINE), "--no-collector.nvidia"], {})
    before = set(threading.enumerate())
    daemon = Daemon(config)
    snapshot = daemon.collect_once()
    assert [d.info.pci_bus_id for _, d in snapshot.devices] == ["0000:03:00.0"]
    assert _ours(before) == set()
    daemon.stop()  # the command's own stop already ran: harmless


class SlowOpen:
    """A backend whose first open takes ``seconds`` (a driver waking a GPU up)."""

    name, source, interval, priority = "amd", "sysfs", None, KERNEL
    capabilities = PLAIN

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.closed = 0

    def open(self) -> list[DeviceInfo]:
        time.sleep(self.seconds)
        return []

    def sample(self, slow: bool) -> Cycle:
        return Cycle([])

    def close(self) -> None:
        self.closed += 1


@pytest.mark.slow
def test_a_stop_during_the_hubs_first_opens_starts_and_publishes_nothing_after_it() -> None:
    """Hub.start waits up to OPEN_WAIT for first opens, then published and started the
    watchdog even when a stop had come meanwhile: a thread started after its owner's stop."""
    backend = SlowOpen(1.0)  # still opening when the stop comes, and after its timeout
    hub = Hub(Config(), [backend])
    before = set(threading.enumerate())
    starter = threading.Thread(target=hub.start)
    starter.start()
    _wait(lambda: any(t.name == "collector-amd" for t in threading.enumerate()))
    hub.stop(timeout=0.1)
    generation = hub.snapshot.generation
    starter.join(0.5)
    assert not starter.is_alive()  # it no longer waits for the open
    _wait(lambda: _ours(before) == set())  # the open ends; its thread sees the stop
    assert hub.snapshot.generation == generation
    assert backend.closed == 1
    hub.stop()
    assert backend.closed == 1


def test_the_servers_lifespan_stops_nothing_it_did_not_start() -> None:
    """The lifespan stopped the Hub and the renderer, which the Daemon had started and
    stops: two owners. A server's shutdown now leaves them to their owner."""
    hub = Hub(Config(), [SlowOpen(0)])
    renderer = Renderer()
    renderer.render_now(hub.collect_once())
    app = build_app(Config(), hub, renderer)
    assert asyncio.run(_lifespan(app)) == ["lifespan.startup.complete",
                                           "lifespan.shutdown.complete"]
    assert renderer.pages.call(lambda: 7).result(5) == 7  # the renderer still runs
    hub.start()  # and the Hub was not stopped: it starts
    _wait(lambda: any(t.name == "collector-watchdog" for t in threading.enumerate()))
    hub.stop()
    renderer.stop()


async def _lifespan(app: Any) -> list[str]:
    """An ASGI server's start-up and shutdown of ``app``, as uvicorn's lifespan="on" runs them."""
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> dict[str, str]:
        return incoming.pop(0)

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])
    await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    return sent


@pytest.mark.slow
def test_sigterm_ends_a_serving_daemon_promptly_with_0(tmp_path: Path) -> None:
    with running([*machine_args(MACHINE), "--collector.interval", "200ms"], tmp_path) as d:
        assert d.get().status_code == 200
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(10) == 0, d.log()
        assert time.monotonic() - t0 < 3.0
        assert "Traceback" not in d.log()
    with pytest.raises(httpx.TransportError):
        d.get("/-/healthy")


@pytest.mark.slow
def test_sigterm_ends_an_otlp_only_daemon_promptly_with_0(tmp_path: Path) -> None:
    from tests.test_otlp import receiving

    with receiving() as receiver:
        log = tmp_path / "daemon.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "exporter", *machine_args(MACHINE), "--otlp.only",
                 "--otlp.endpoint", receiver.url, "--otlp.interval", "200ms",
                 "--log.format", "json"],
                cwd=REPO, env=daemon_env(None), stdout=out, stderr=subprocess.STDOUT)
        try:
            receiver.wait(1)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(10)
            seconds = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert code == 0, log.read_text()
    assert seconds < 3.0, seconds
    assert "Traceback" not in log.read_text()
