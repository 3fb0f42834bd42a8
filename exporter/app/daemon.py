"""The running exporter: ``Daemon`` builds, starts and stops everything, in one place.

The backends (one per row of the backend table not switched off), the DRM discovery
they share, the Hub that samples them, the renderer, the landing page's history, the
OTLP pusher, the reloader and the HTTP server. ``exporter.app.cli`` parses the flags,
environment and config file, then hands the Config over.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.core.config import Config
from exporter.output.render.selection import Selection
from exporter.output.render.telemetry import ConnectionCounts, Telemetry
from exporter.pipeline.registry import Shared

if TYPE_CHECKING:
    from exporter.app.reload import Reloader
    from exporter.output.otlp import Pusher
    from exporter.output.render import Renderer, RenderOptions
    from exporter.pipeline.state import Snapshot


class Daemon:
    """Everything the exporter runs, built, started and stopped in one place.

    Built: the shared DRM discovery, a backend per row of the backend table that is
    not switched off, the Hub that samples them, the landing page's history. Every mode
    goes through here: ``run()`` serves (``start()``: the renderer, the OTLP pusher,
    collection; then the reloader and the HTTP server until a signal), or with
    ``--otlp.only`` collects and pushes until a signal; ``collect_once()`` is the
    ``snapshot`` command. Each ends in ``stop()``, the one place anything is stopped:
    the reloader, the pusher, the Hub (its threads, then every backend's close()), the
    renderer's threads, the discovery's udev listener, in that order. Only its first
    call does anything. The HTTP server's lifespan stops nothing: it started nothing.
    """

    def __init__(self, config: Config, selection: Selection | None = None) -> None:
        from exporter.pipeline.hub import Hub
        from exporter.pipeline.registry import build_backends
        from exporter.serve.history import History

        self.config = config
        self.selection = selection or Selection(config.metrics_include, config.metrics_exclude)
        # The landing page's charts, fed by every published snapshot (exporter.serve.history).
        self.history = History(config.web_history, config.interval)
        self.shared = Shared(config)
        self.backends = build_backends(config, self.shared)
        self.hub = Hub(config, self.backends)
        self.shared.on_card_added(self.hub.reprobe)  # a new card: down backends look again
        self.renderer: Renderer | None = None  # while serving
        self.pusher: Pusher | None = None  # the OTLP push thread, with --otlp.endpoint
        self.reloader: Reloader | None = None  # SIGHUP and web config reloads, while serving
        # The exporter's own threads, OTLP and reload status: the renderer's and the
        # server's (start() builds it, once the pusher and the reloader exist).
        self.telemetry = Telemetry()
        self.reread: Callable[[], Config] = lambda: config  # main() sets flags+env+file
        self._starter: threading.Thread | None = None  # runs Hub.start (its first opens)
        self._life = threading.Lock()
        self._stopped = False

    def check(self) -> str | None:
        """Why a collector switched on cannot run (exit 2), or None."""
        from exporter.pipeline.registry import forced_but_unavailable

        return forced_but_unavailable(self.config, self.backends)

    def start(self, serving: bool = True, connections: ConnectionCounts | None = None) -> None:
        """The renderer (``serving``: an HTTP server will serve it and the history), the
        OTLP pusher (--otlp.endpoint), then collection: the Hub's first opens wait up to
        OPEN_WAIT, on a thread of their own, so the server answers (not ready) meanwhile."""
        from exporter.output.render import Renderer

        config = self.config
        options = self.render_options()
        with self._life:
            if self._stopped:
                return
            if config.otlp_endpoint is not None:
                from exporter.output.otlp import Pusher

                self.pusher = Pusher(config, self.hub, options)
            reloads = self.reloader is not None and bool(config.config_file or
                                                        config.web_config_file)
            self.telemetry = Telemetry(
                otlp=self.pusher.status if self.pusher is not None else None,
                reload=self.reloader.status if reloads and self.reloader else None,
                connections=connections)
            if self.pusher is not None:
                self.telemetry.threads.add("otlp", self.pusher.thread)
            if serving:
                # Render ahead only the snapshot that precedes a scrape: one interval.
                self.renderer = Renderer(lead=config.interval, options=options,
                                         telemetry=self.telemetry, readers=self.shared.readers)
                self.hub.subscribe(self.renderer.submit)
                self.hub.subscribe(self.history.add)
            if self.pusher is not None:
                self.pusher.start()
            self._starter = threading.Thread(target=self.hub.start, name="collector-start",
                                             daemon=True)
            self._starter.start()

    def render_options(self) -> RenderOptions:
        from exporter.output.render import RenderOptions

        return RenderOptions(
            pod_labels=any(b.name == "kubernetes" for b in self.backends),
            device_pod_labels=self.config.kubernetes_device_labels,
            metric_names=self.config.metric_names, selection=self.selection)

    def select(self, selection: Selection) -> None:
        """A reload's new metric selection: served from the next scrape and push on."""
        from dataclasses import replace

        self.selection = selection
        if self.renderer is not None:
            self.renderer.select(selection)
        if self.pusher is not None:
            self.pusher.options = replace(self.pusher.options, selection=selection)

    def collect_once(self) -> Snapshot:
        """The ``snapshot`` command: every backend opened and sampled once, then stopped."""
        try:
            return self.hub.collect_once()
        finally:
            self.stop(timeout=0)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop everything started, consumers before what feeds them; ``timeout`` bounds
        the wait for each thread (one stuck in a driver call is a daemon and is left)."""
        with self._life:
            if self._stopped:
                return
            self._stopped = True
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())
        if self.reloader is not None:
            self.reloader.stop(left())
        if self.pusher is not None:
            self.pusher.stop(left())
        self.hub.stop(timeout=left())  # its publisher first: nothing more is handed out
        if self._starter is not None:
            self._starter.join(left())
        if self.renderer is not None:
            self.renderer.stop(left())
        self.shared.stop()

    def run(self) -> int:
        import structlog

        from exporter.app.reload import Reloader, apply_live
        from exporter.core.fs import raise_open_files_limit
        from exporter.serve.server import (
            bind_sockets,
            build_app,
            close_sockets,
            connection_limit,
            serve,
            unix_files,
        )
        from exporter.serve.slots import Slots
        from exporter.serve.webconfig import load_web_config

        config = self.config
        log = structlog.get_logger(__name__)
        limit_malloc_arenas()
        # Before any backend opens a file: the kept-descriptor budget is sized from it.
        raise_open_files_limit()
        if config.otlp_only:  # push, with no listening socket (exporter.output.otlp)
            return self.push_only()
        web = load_web_config(config.web_config_file) if config.web_config_file else None
        for warning in web.warnings if web else ():
            log.warning("web config", note=warning)
        try:
            sockets = bind_sockets(config.listen_addresses)
        except OSError as e:
            self.stop(timeout=0)
            print(f"gpu-exporter: error: cannot listen on {e.strerror or e}", file=sys.stderr)
            return 1
        files = unix_files(sockets)
        reloader = self.reloader = Reloader(config, web, self.reread, apply_live(self.hub),
                                            self.selection, self.select)
        # exporter.app.reload: what changes live, what needs a restart
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, lambda *_: reloader.request("sighup"))
        from exporter.app.early import take_held

        if take_held():  # SIGHUPs that came during start-up (exporter.app.early): one reload
            reloader.request("sighup")
        slots = Slots(connection_limit())
        self.start(connections=slots.counts)
        assert self.renderer is not None  # start() made it: serving
        app = build_app(config, self.hub, self.renderer, web, history=self.history,
                        telemetry=self.telemetry)
        reloader.passwords = getattr(app.state, "passwords", None)
        reloader.start()
        try:  # until SIGTERM or SIGINT
            serve(config, app, web, sockets, reloader.context, reloader.on_connection, slots)
        finally:
            self.stop()
            close_sockets(sockets, files)
        return 0

    def push_only(self) -> int:
        """``--otlp.only``: collect and push, with no listening socket, until SIGTERM/SIGINT."""
        import structlog

        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        if hasattr(signal, "SIGHUP"):  # as with a server: the configuration is read at start
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.start(serving=False)
        endpoint = self.pusher.endpoint if self.pusher is not None else None
        structlog.get_logger(__name__).info(
            "pushing over otlp only; no port is bound", endpoint=endpoint)
        try:
            done.wait()
        finally:
            self.stop()
        return 0


M_ARENA_MAX = -8  # glibc's mallopt() parameter (malloc.h)


def limit_malloc_arenas(arenas: int = 2) -> None:
    """At most ``arenas`` glibc malloc arenas, before any thread starts.

    glibc gives each thread that allocates its own arena (up to 8 x cores), and each
    keeps pages resident: 5 MiB of the daemon's RSS on the H100 (bench/memory.py). The
    same as MALLOC_ARENA_MAX=2, which the unit, image and chart also set; here it holds
    for a plain ``pip install`` too. An explicit MALLOC_ARENA_MAX wins. No-op off glibc.
    """
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass
