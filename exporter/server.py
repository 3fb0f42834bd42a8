"""HTTP: a Starlette app served by uvicorn. Only GET/HEAD; nothing here touches a GPU.

``/metrics`` returns bytes the renderer already made (text 0.0.4 or OpenMetrics by
``Accept``, gzip by ``Accept-Encoding``); ``/-/healthy``, ``/-/ready`` (503 until
the first collection), ``/`` (landing page) and ``/snapshot`` (JSON).

The event loop only moves bytes: a render that is not cached yet and the
``/snapshot`` JSON run on the renderer's thread, bcrypt on a small thread pool of
its own. Under attack the loop stays responsive so the probes answer: connections
are bounded (``MAX_CONNECTIONS``), a request must finish its headers within
``HEADER_TIMEOUT``, accept failures (out of file descriptors) are one rate-limited
log line, and an idle server does not wake up at all (no periodic tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import html
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import h11
import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from exporter import __version__
from exporter.collector import Hub
from exporter.config import Config, split_listen_address
from exporter.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Renderer
from exporter.snapshot import snapshot_json
from exporter.webconfig import (
    BasicAuthMiddleware,
    HeadersMiddleware,
    PasswordChecker,
    RateLimitMiddleware,
    WebConfig,
    apply_tls,
)

log = structlog.get_logger(__name__)

MAX_CONNECTIONS = 256  # open HTTP connections at most (fewer when file descriptors are scarce)
HEADER_TIMEOUT = 10.0  # seconds a connection may take to send a complete request head
LOG_EVERY = 60.0  # seconds between two log lines about the same loop error


def _accepts(header: str, wanted: str) -> bool:
    """Whether a comma-separated ``Accept``/``Accept-Encoding`` list takes ``wanted`` (q > 0)."""
    for item in header.split(","):
        name, *params = (part.strip() for part in item.split(";"))
        if name.lower() != wanted:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False


def negotiate(accept: str, accept_encoding: str) -> str:
    """The exposition variant a scraper asked for (see render.VARIANTS)."""
    variant = "openmetrics" if _accepts(accept, "application/openmetrics-text") else "text"
    return f"{variant}+gzip" if _accepts(accept_encoding, "gzip") else variant


def build_app(config: Config, hub: Hub, renderer: Renderer, web: WebConfig | None = None,
              start_collection: bool = True) -> Starlette:
    async def metrics(request: Request) -> Response:
        variant = negotiate(request.headers.get("accept", ""),
                            request.headers.get("accept-encoding", ""))
        body, _ = await renderer.body_async(variant)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if variant.endswith("+gzip"):
            headers["Content-Encoding"] = "gzip"
        media = OPENMETRICS_CONTENT_TYPE if variant.startswith("openmetrics") else \
            TEXT_CONTENT_TYPE
        return Response(body, headers=headers, media_type=media)

    async def healthy(request: Request) -> Response:
        return PlainTextResponse("OK\n")

    async def ready(request: Request) -> Response:
        if hub.snapshot.ready:
            return PlainTextResponse("Ready\n")
        return PlainTextResponse("Not ready: first collection not complete\n", status_code=503)

    async def snapshot(request: Request) -> Response:
        current = hub.snapshot
        otlp = renderer.otlp() if renderer.otlp is not None else None
        body = await asyncio.wrap_future(
            renderer.worker.call(lambda: snapshot_json(current, indent=2, otlp=otlp)))
        return Response(body, media_type="application/json")

    async def landing(request: Request) -> Response:
        rows = "".join(
            f"<tr><td>{html.escape(s.name)}</td><td>{'up' if s.up and not s.stale else 'down'}"
            f"</td><td>{html.escape('stale' if s.stale else s.reason)}</td><td>"
            f"{len(s.last.devices) if s.last else 0}</td></tr>"
            for s in hub.snapshot.backends)
        path = html.escape(config.telemetry_path)
        if renderer.otlp is not None:
            otlp = renderer.otlp()
            rows += (f"<tr><td>otlp push</td><td>{'failing' if otlp['last_error'] else 'ok'}"
                     f"</td><td>{html.escape(otlp['last_error'] or otlp['endpoint'])}</td>"
                     "<td></td></tr>")
        return HTMLResponse(
            "<!doctype html><html><head><title>gpu-exporter</title></head><body>"
            f"<h1>gpu-exporter {html.escape(__version__)}</h1>"
            f"<p><a href=\"{path}\">Metrics</a> · <a href=\"/snapshot\">Snapshot (JSON)</a> · "
            "<a href=\"/-/healthy\">Health</a> · <a href=\"/-/ready\">Readiness</a></p>"
            "<h2>Backends</h2><table border=\"1\"><tr><th>backend</th><th>state</th>"
            f"<th>reason</th><th>devices</th></tr>{rows}</table></body></html>")

    server_threads = renderer.cpu_threads.setdefault("server", [])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(LoopErrors().handle)
        server_threads.append(threading.current_thread())
        renderer.render_now(hub.snapshot)
        if start_collection:
            hub.listener = renderer.submit
            threading.Thread(target=hub.start, name="collector-start", daemon=True).start()
        try:
            yield
        finally:
            renderer.stop()
            hub.stop()

    get = ["GET", "HEAD"]
    app = Starlette(routes=[
        Route(config.telemetry_path, metrics, methods=get),
        Route("/-/healthy", healthy, methods=get),
        Route("/-/ready", ready, methods=get),
        Route("/snapshot", snapshot, methods=get),
        Route("/", landing, methods=get),
    ], lifespan=lifespan)
    # A redirect for "/metrics/" would be built from the client's Host header.
    app.router.redirect_slashes = False
    if web is not None and web.headers:
        app.add_middleware(HeadersMiddleware, headers=web.headers)
    if web is not None and web.basic_auth_users:
        passwords = PasswordChecker(web.basic_auth_users)
        passwords.on_thread = server_threads.append
        app.add_middleware(BasicAuthMiddleware, checker=passwords)
    if web is not None and web.rate_interval:
        app.add_middleware(RateLimitMiddleware, interval=web.rate_interval,
                           burst=web.rate_burst)
    return app


class LoopErrors:
    """The event loop's exception handler: one log line per kind of error per minute.

    asyncio logs every failed ``accept()`` (EMFILE when connections exhaust the file
    descriptors) with a traceback: 193 MB of logs in 30 s under a connection flood.
    """

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "event loop error"))
        exc = context.get("exception")
        now = time.monotonic()
        if now - self._last.get(message, -LOG_EVERY) < LOG_EVERY:
            self._suppressed[message] = self._suppressed.get(message, 0) + 1
            return
        suppressed = self._suppressed.pop(message, 0)
        self._last[message] = now
        log.warning("http server error", message=message,
                    error=repr(exc) if exc is not None else None,
                    suppressed_since_last=suppressed)


class BoundedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a bound on connections and on request-head time.

    uvicorn waits forever for a request that never completes its headers (slowloris).
    Here a request head must be complete within HEADER_TIMEOUT of its first byte (or
    of the connection, for one that sends nothing); an idle keep-alive connection is
    closed by uvicorn's keep-alive timeout. At MAX_CONNECTIONS the connection that has
    waited longest without a request in progress makes room for the new one, so a
    probe that sends its request at once is served even during a connection flood.
    """

    max_connections = MAX_CONNECTIONS
    header_timeout = HEADER_TIMEOUT
    allowed_sans: frozenset[str] = frozenset()
    idle: dict[BoundedH11, None]  # per server (see serve()): oldest first

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        if not self._san_allowed(transport) or not self._make_room():
            transport.abort()
            return
        super().connection_made(transport)
        self.idle[self] = None
        self._arm()

    def _make_room(self) -> bool:
        if len(self.connections) < self.max_connections:
            return True
        oldest = next(iter(self.idle), None)
        if oldest is None:
            return False
        oldest.transport.abort()
        self.idle.pop(oldest, None)
        return True

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
            self._arm()  # part of a request head: it has HEADER_TIMEOUT to complete

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # a whole request head arrived
            self.idle.pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.idle[self] = None  # kept alive, waiting for the next request

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.idle.pop(self, None)
        super().connection_lost(exc)


class Server(uvicorn.Server):
    """uvicorn's server without its 10-per-second tick: it sleeps until told to exit."""

    async def main_loop(self) -> None:
        self._exit = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        await self.on_tick(0)  # sets the default headers once
        if not self.should_exit:
            await self._exit.wait()

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        loop, event = getattr(self, "_loop", None), getattr(self, "_exit", None)
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)


def connection_limit() -> int:
    """MAX_CONNECTIONS, or half the file descriptors where fewer are allowed: the other
    half stays for the backends (sysfs, /proc, NVML), which must never see EMFILE."""
    try:
        import resource
    except ImportError:
        return MAX_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft // 2))


class AddressInUse(OSError):
    """A listen address another process serves (with the address in the message)."""


def _unix_socket(path: str) -> socket.socket:
    """Bind a unix socket; a stale file is replaced, a live one (another instance) is not."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise AddressInUse(errno.EEXIST, f"unix:{path} exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # left behind by a process that is gone
        except OSError:
            pass
        else:
            raise AddressInUse(errno.EADDRINUSE,
                               f"unix:{path} is in use by another process")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    return sock


def bind_sockets(addresses: tuple[str, ...]) -> list[socket.socket]:
    """Bind every --web.listen-address before serving, so a bad one fails at start-up."""
    sockets: list[socket.socket] = []
    try:
        for address in addresses:
            if address.startswith("unix:"):
                sock = _unix_socket(address[len("unix:"):])
            else:
                host, port = split_listen_address(address)
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only
                # for sockets that say they are TCP; without it Nagle holds the body of a
                # keep-alive response back until the scraper's delayed ACK (~40 ms).
                sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((host, port))
                except OSError as e:
                    sock.close()
                    raise AddressInUse(e.errno, f"{address}: {e.strerror}") from None
            sock.listen(128)
            sock.set_inheritable(True)
            sockets.append(sock)
    except OSError:
        close_sockets(sockets, unix_files(sockets))
        raise
    return sockets


def unix_files(sockets: list[socket.socket]) -> list[tuple[str, int]]:
    """(path, inode) of each unix socket file: what close_sockets may remove later."""
    out = []
    for sock in sockets:
        if sock.family == socket.AF_UNIX:
            path = sock.getsockname()
            if isinstance(path, str) and path:
                out.append((path, os.stat(path).st_ino))
    return out


def close_sockets(sockets: list[socket.socket], files: list[tuple[str, int]]) -> None:
    """Close the listeners (uvicorn may have already) and remove the unix socket files
    this process created, unless another process has replaced them since."""
    for sock in sockets:
        sock.close()
    for path, inode in files:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                os.unlink(path)


def serve(config: Config, app: Starlette, web: WebConfig | None,
          sockets: list[socket.socket]) -> None:
    protocol = type("Protocol", (BoundedH11,), {
        "allowed_sans": frozenset(web.client_allowed_sans) if web else frozenset(),
        "max_connections": connection_limit(), "idle": {}})
    uv = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                        server_header=False, date_header=False, proxy_headers=False,
                        # The asyncio loop, never uvloop: one more library in memory for
                        # a server that answers a scrape every few seconds.
                        http=protocol, ws="none", loop="asyncio",
                        # longer than Prometheus's usual 15 s scrape interval: it reuses
                        # the connection instead of opening a new one every scrape
                        timeout_keep_alive=20,
                        ssl_certfile=web.cert_file if web and web.tls else None,
                        ssl_keyfile=web.key_file if web and web.tls else None,
                        timeout_graceful_shutdown=2)
    uv.load()
    if web is not None and web.tls and uv.ssl is not None:
        apply_tls(uv.ssl, web)
    log.info("listening", addresses=list(config.listen_addresses), tls=bool(web and web.tls),
             basic_auth=bool(web and web.basic_auth_users), path=config.telemetry_path)
    # uvicorn re-raises the signal that stopped it once it is done; the default SIGINT
    # handler would then print a KeyboardInterrupt traceback. A stop is a clean exit.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    Server(uv).run(sockets=sockets)
