"""HTTP: a Starlette app served by uvicorn. Only GET/HEAD; nothing here touches a GPU.

``/metrics`` returns bytes the renderer already made (text 0.0.4 or OpenMetrics by
``Accept``, gzip by ``Accept-Encoding``); ``/-/healthy``, ``/-/ready`` (503 until
the first collection), ``/`` (landing page, exporter.serve.landing, with its ``/static/``
script and style), ``/api/v1/history`` (the landing page's ring buffer as JSON,
exporter.serve.history) and ``/snapshot`` (JSON).

The event loop only moves bytes: a render that is not cached yet and the
``/snapshot`` JSON run on the renderer's thread, bcrypt on a small thread pool of
its own. Under attack the loop stays responsive so the probes answer: connections
are bounded from accept, TLS handshakes and request heads are timed
(exporter.serve.connections), accept failures (out of file descriptors) are one
rate-limited log line, and an idle server does not wake up at all (no periodic tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import ssl
import stat
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, TypeVar

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive

from exporter.core.config import Config, split_listen_address
from exporter.core.fs import open_files_limit
from exporter.core.logs import Every
from exporter.output.render import Renderer, Worker
from exporter.output.render.exposition import Busy, Variant
from exporter.output.render.telemetry import Telemetry
from exporter.pipeline.hub import Hub
from exporter.pipeline.state import Snapshot
from exporter.serve.connections import MAX_CONNECTIONS, Slots, protocol_factory
from exporter.serve.history import History
from exporter.serve.installed import RESTART, Installed, PackageChanged
from exporter.serve.middleware import (
    BasicAuthMiddleware,
    ChunkedBodyMiddleware,
    HeadersMiddleware,
    PasswordChecker,
    RateLimitMiddleware,
)
from exporter.serve.untrusted import param_count, param_number
from exporter.serve.view import MAX_ROWS
from exporter.serve.webconfig import WebConfig, tls_context

log = structlog.get_logger(__name__)

STATIC_CACHE = {"Cache-Control": "max-age=3600"}
BACKLOG = 128  # pending connections in the kernel, and accepted per event-loop wake-up


def _quality(header: str, wanted: str) -> float:
    """The highest q a comma-separated ``Accept``/``Accept-Encoding`` list gives
    ``wanted`` (0 when it is not listed)."""
    best = 0.0
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
        best = max(best, q if 0 <= q <= 1 else 0.0)
    return best


def negotiate(accept: str, accept_encoding: str) -> Variant:
    """The exposition variant a scraper asked for: OpenMetrics when the client rates it
    at least as high as text/plain; gzip when it accepts it at all."""
    openmetrics = _quality(accept, "application/openmetrics-text")
    return Variant.of(openmetrics=openmetrics > 0 and
                      openmetrics >= _quality(accept, "text/plain"),
                      gzip=_quality(accept_encoding, "gzip") > 0)


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has hung up (uvicorn's ``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass


T = TypeVar("T")


async def off_loop(request: Request, worker: Worker, fn: Callable[[], T]) -> T | Response:
    """``fn`` run on ``worker`` (the pages' thread), unless the client has hung up by
    the time it would start: nothing is queued for a client already gone, and a queued
    call is dropped when its client goes. 503 when the queue is full (PAGE_QUEUE)."""
    gone = asyncio.ensure_future(_disconnected(request.receive))
    await asyncio.sleep(0)  # a disconnect already received is seen now
    if gone.done():
        return Response(status_code=499)  # never sent: there is no one to send it to
    try:
        future = worker.call(fn)
    except Busy:
        gone.cancel()
        return PlainTextResponse("Busy: too many page renders waiting; retry\n",
                                 status_code=503, headers={"Retry-After": "1"})
    result = asyncio.wrap_future(future)
    waiting: set[asyncio.Future[Any]] = {result, gone}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not result.done():  # the client hung up: drop the call if it has not started
        future.cancel()
        result.cancel()
        return Response(status_code=499)
    return result.result()


# The live page, its script and style, and the /snapshot JSON are imported on their first
# request (on the pages' thread), not by every daemon: a daemon whose page nobody opens
# does not hold them (tests/test_imports.py). Through ``installed``: never from files an
# upgrade put there after this process started (exporter.serve.installed).
def _landing_page(installed: Installed, snapshot: Snapshot, history: History,
                  telemetry_path: str, otlp: Mapping[str, Any] | None) -> str:
    page: str = installed.load("exporter.serve.landing").page(snapshot, history,
                                                              telemetry_path, otlp)
    return page


def _csp(installed: Installed) -> str:
    csp: str = installed.load("exporter.serve.landing").CSP
    return csp


def _static(installed: Installed, name: str) -> str:
    text: str = getattr(installed.load("exporter.serve.landing_static"), name)
    return text


def _snapshot_json(installed: Installed, snapshot: Snapshot,
                   otlp: Mapping[str, Any] | None) -> bytes:
    body: bytes = installed.load("exporter.serve.snapshot").snapshot_json(
        snapshot, indent=2, otlp=otlp)
    return body


async def _package_changed(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(RESTART, status_code=503, headers={"Cache-Control": "no-store"})


def build_app(config: Config, hub: Hub, renderer: Renderer, web: WebConfig | None = None,
              history: History | None = None, telemetry: Telemetry | None = None
              ) -> Starlette:
    """The routes over a Hub and a Renderer that the caller (exporter.app.daemon) starts and
    stops; ``history``: the ring buffer the landing page draws, fed by the caller;
    ``telemetry``: the exporter's own threads, OTLP and reload status (the renderer's)."""
    if history is None:
        history = History(config.web_history, config.interval)
    if telemetry is None:
        telemetry = renderer.telemetry
    installed = Installed()

    async def metrics(request: Request) -> Response:
        variant = negotiate(request.headers.get("accept", ""),
                            request.headers.get("accept-encoding", ""))
        body, _ = await renderer.body_async(variant)
        headers = {"Vary": "Accept, Accept-Encoding"}
        if variant.gzip:
            headers["Content-Encoding"] = "gzip"
        return Response(body, headers=headers, media_type=variant.content_type)

    async def healthy(request: Request) -> Response:
        return PlainTextResponse("OK\n")

    async def ready(request: Request) -> Response:
        if hub.snapshot.ready:
            return PlainTextResponse("Ready\n")
        return PlainTextResponse("Not ready: first collection not complete\n", status_code=503)

    async def snapshot(request: Request) -> Response:
        renderer.readers.read()  # a reader of every value, as /metrics is
        current = hub.snapshot
        otlp = telemetry.otlp_status()
        body = await off_loop(request, renderer.pages,
                              lambda: _snapshot_json(installed, current, otlp))
        if isinstance(body, Response):
            return body
        return Response(body, media_type="application/json")

    async def landing(request: Request) -> Response:
        current = hub.snapshot
        otlp = telemetry.otlp_status()
        body = await off_loop(request, renderer.pages, lambda: _landing_page(
            installed, current, history, config.telemetry_path, otlp))
        if isinstance(body, Response):
            return body
        return HTMLResponse(body, headers={"Content-Security-Policy": _csp(installed)})

    async def history_json(request: Request) -> Response:
        # A unix time and a row count per GPU; anything else is the client's mistake,
        # said as such (exporter.serve.untrusted: never an exception, never a 500).
        since = param_number(request.query_params.get("since"), 0.0)
        if since is None:
            return PlainTextResponse("since: not a number of seconds since the epoch\n",
                                     status_code=400)
        rows = param_count(request.query_params.get("processes"), MAX_ROWS, MAX_ROWS)
        if rows is None:
            return PlainTextResponse(f"processes: a number of rows, 0 to {MAX_ROWS}\n",
                                     status_code=400)
        otlp = telemetry.otlp_status()
        body = await off_loop(request, renderer.pages, lambda: json.dumps(
            history.as_json(since, otlp=otlp, rows=rows), separators=(",", ":")).encode())
        if isinstance(body, Response):
            return body
        return Response(body, media_type="application/json",
                        headers={"Cache-Control": "no-store"})

    async def app_js(request: Request) -> Response:
        return Response(_static(installed, "APP_JS"), media_type="text/javascript",
                        headers=STATIC_CACHE)

    async def app_css(request: Request) -> Response:
        return Response(_static(installed, "APP_CSS"), media_type="text/css", headers=STATIC_CACHE)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(LoopErrors().handle)
        telemetry.threads.add("server", threading.current_thread())
        renderer.render_now(hub.snapshot)
        yield  # the Daemon stops the Hub and the renderer: it started them

    get = ["GET", "HEAD"]
    app = Starlette(routes=[
        Route(config.telemetry_path, metrics, methods=get),
        Route("/-/healthy", healthy, methods=get),
        Route("/-/ready", ready, methods=get),
        Route("/snapshot", snapshot, methods=get),
        Route("/", landing, methods=get),
        Route("/api/v1/history", history_json, methods=get),
        Route("/static/app.js", app_js, methods=get),
        Route("/static/app.css", app_css, methods=get),
    ], lifespan=lifespan, exception_handlers={PackageChanged: _package_changed})
    # A redirect for "/metrics/" would be built from the client's Host header.
    app.router.redirect_slashes = False
    # The last one added is the outermost: the headers go on 401 and 429 too.
    app.add_middleware(ChunkedBodyMiddleware)
    if web is not None and web.basic_auth_users:
        passwords = PasswordChecker(
            web.basic_auth_users, on_thread=lambda t: telemetry.threads.add("server", t))
        app.add_middleware(BasicAuthMiddleware, checker=passwords)
        app.state.passwords = passwords  # replaced in place on a reload (exporter.app.reload)
    if web is not None and web.rate_interval:
        app.add_middleware(RateLimitMiddleware, interval=web.rate_interval,
                           burst=web.rate_burst)
    if web is not None and web.headers:
        app.add_middleware(HeadersMiddleware, headers=web.headers)
    return app


class LoopErrors:
    """The event loop's exception handler: one log line per kind of error per minute.

    asyncio logs every failed ``accept()`` (EMFILE when connections exhaust the file
    descriptors) with a traceback: 193 MB of logs in 30 s under a connection flood.
    """

    def __init__(self) -> None:
        self.every = Every()

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", "event loop error"))
        exc = context.get("exception")
        held = self.every.allow(message)
        if held is not None:
            log.warning("http server error", message=message,
                        error=repr(exc) if exc is not None else None,
                        suppressed_since_last=held)


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
    soft = open_files_limit()
    return MAX_CONNECTIONS if soft is None else max(16, min(MAX_CONNECTIONS, soft // 2))


def accept_backlog() -> int:
    """BACKLOG, or an eighth of the file descriptors where fewer are allowed: asyncio
    accepts up to this many connections in one wake-up before the slots close any, so
    they come on top of the slots (a half) and the kept sysfs descriptors (a quarter,
    exporter.core.fs): together at most 7/8 of the limit, and the backends keep the rest."""
    soft = open_files_limit()
    return BACKLOG if soft is None else max(8, min(BACKLOG, soft // 8))


class AddressInUse(OSError):
    """A listen address another process serves (with the address in the message)."""


def _unix_socket(path: str) -> socket.socket:
    """Bind a unix socket; a stale file is replaced, a live one (another instance) is not."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise AddressInUse(errno.EEXIST, f"unix:{path}: exists and is not a socket")
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
                               f"unix:{path}: in use by another process")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as e:  # e.g. "AF_UNIX path too long" (108 bytes on Linux)
        sock.close()
        raise AddressInUse(e.errno or errno.EINVAL, f"unix:{path}: {e.strerror or e}") from None
    return sock


def _tcp_socket(address: str) -> socket.socket:
    """A bound TCP socket. ``:port`` (no host) and ``[::]:port`` listen on IPv6 and IPv4
    (one dual-stack socket, as Go's servers do) where the host has IPv6, else on IPv4;
    ``0.0.0.0:port`` on IPv4 only, ``[::1]:port`` and other IPv6 addresses on IPv6 only."""
    host, port = split_listen_address(address)
    any_host = address.rpartition(":")[0] in ("", "[::]")
    dual = any_host and socket.has_ipv6
    if dual:
        host = "::"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only
        # for sockets that say they are TCP; without it Nagle holds the body of a
        # keep-alive response back until the scraper's delayed ACK (~40 ms).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except OSError:  # IPv6 compiled in but not available (ipv6.disable=1)
        if not dual:
            raise
        return _tcp_socket("0.0.0.0:" + str(port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if dual and e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            return _tcp_socket("0.0.0.0:" + str(port))  # no IPv6 address on this host
        raise AddressInUse(e.errno, f"{address}: {e.strerror}") from None
    return sock


def bind_sockets(addresses: tuple[str, ...]) -> list[socket.socket]:
    """Bind every --web.listen-address before serving, so a bad one fails at start-up."""
    sockets: list[socket.socket] = []
    try:
        for address in addresses:
            if address.startswith("unix:"):
                sock = _unix_socket(address[len("unix:"):])
            else:
                sock = _tcp_socket(address)
            sock.listen(BACKLOG)
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
          sockets: list[socket.socket],
          context: Callable[[], ssl.SSLContext | None] | None = None,
          on_connection: Callable[[], None] | None = None,
          slots: Slots | None = None) -> None:
    """``context``: the TLS context for the next connection (a reload replaces it; default:
    the one built from ``web``); ``on_connection``: called as each connection arrives (the
    web config's reload check); ``slots``: the connection slots (default: new ones of
    ``connection_limit()``)."""
    # TLS is set up here, not by uvicorn: the protocol factory wraps each accepted
    # connection itself, so the connection is counted before its handshake.
    if context is None:
        fixed = tls_context(web) if web is not None and web.tls else None
        context = lambda: fixed  # noqa: E731
    slots = slots if slots is not None else Slots(connection_limit())
    sans = frozenset(web.client_allowed_sans) if web else frozenset()

    def protocol(**kwargs: Any) -> asyncio.BaseProtocol:
        if on_connection is not None:
            on_connection()
        return protocol_factory(slots, context(), sans)(**kwargs)
    uv = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                        server_header=False, date_header=False, proxy_headers=False,
                        # http: a protocol factory (uvicorn calls it like a class)
                        http=protocol,  # type: ignore[arg-type]
                        # The asyncio loop, never uvloop: one more library in memory for
                        # a server that answers a scrape every few seconds.
                        ws="none", loop="asyncio",
                        # longer than Prometheus's usual 15 s scrape interval: it reuses
                        # the connection instead of opening a new one every scrape
                        timeout_keep_alive=20, timeout_graceful_shutdown=2,
                        # asyncio accepts up to this many connections per wake-up before
                        # any is counted (uvicorn's default is 2048): it bounds the file
                        # descriptors a burst of connections holds at once
                        backlog=accept_backlog())
    log.info("listening", addresses=list(config.listen_addresses), tls=bool(web and web.tls),
             basic_auth=bool(web and web.basic_auth_users), path=config.telemetry_path)
    # uvicorn re-raises the signal that stopped it once it is done; the default SIGINT
    # handler would then print a KeyboardInterrupt traceback. A stop is a clean exit.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    Server(uv).run(sockets=sockets)
