"""HTTP: a Starlette app served by uvicorn. Only GET/HEAD; nothing here touches a GPU.

``/metrics`` returns bytes the renderer already made (text 0.0.4 or OpenMetrics by
``Accept``, gzip by ``Accept-Encoding``); ``/-/healthy``, ``/-/ready`` (503 until
the first collection), ``/`` (landing page) and ``/snapshot`` (JSON).
"""

from __future__ import annotations

import contextlib
import html
import os
import socket
import threading
from collections.abc import AsyncIterator

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from exporter import __version__
from exporter.collector import Hub
from exporter.config import Config, split_listen_address
from exporter.render import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, Renderer
from exporter.snapshot import snapshot_json
from exporter.webconfig import BasicAuthMiddleware, HeadersMiddleware, WebConfig, apply_tls

log = structlog.get_logger(__name__)


def negotiate(accept: str, accept_encoding: str) -> str:
    """The exposition variant a scraper asked for (see render.VARIANTS)."""
    variant = "openmetrics" if "application/openmetrics-text" in accept else "text"
    encodings = {e.split(";")[0].strip().lower() for e in accept_encoding.split(",")}
    return f"{variant}+gzip" if "gzip" in encodings else variant


def build_app(config: Config, hub: Hub, renderer: Renderer, web: WebConfig | None = None,
              start_collection: bool = True) -> Starlette:
    async def metrics(request: Request) -> Response:
        variant = negotiate(request.headers.get("accept", ""),
                            request.headers.get("accept-encoding", ""))
        body, _ = renderer.body(variant)
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
        return Response(snapshot_json(hub.snapshot, indent=2), media_type="application/json")

    async def landing(request: Request) -> Response:
        rows = "".join(
            f"<tr><td>{html.escape(s.name)}</td><td>{'up' if s.up and not s.stale else 'down'}"
            f"</td><td>{html.escape('stale' if s.stale else s.reason)}</td><td>"
            f"{len(s.last.devices) if s.last else 0}</td></tr>"
            for s in hub.snapshot.backends)
        path = html.escape(config.telemetry_path)
        return HTMLResponse(
            "<!doctype html><html><head><title>gpu-exporter</title></head><body>"
            f"<h1>gpu-exporter {html.escape(__version__)}</h1>"
            f"<p><a href=\"{path}\">Metrics</a> · <a href=\"/snapshot\">Snapshot (JSON)</a> · "
            "<a href=\"/-/healthy\">Health</a> · <a href=\"/-/ready\">Readiness</a></p>"
            "<h2>Backends</h2><table border=\"1\"><tr><th>backend</th><th>state</th>"
            f"<th>reason</th><th>devices</th></tr>{rows}</table></body></html>")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        renderer.render_now(hub.snapshot)
        if start_collection:
            hub.listener = renderer.submit
            renderer.start()
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
    if web is not None and web.headers:
        app.add_middleware(HeadersMiddleware, headers=web.headers)
    if web is not None and web.basic_auth_users:
        app.add_middleware(BasicAuthMiddleware, users=web.basic_auth_users)
    return app


def bind_sockets(addresses: tuple[str, ...]) -> list[socket.socket]:
    """Bind every --web.listen-address before serving, so a bad one fails at start-up."""
    sockets = []
    for address in addresses:
        if address.startswith("unix:"):
            path = address[len("unix:"):]
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(path)
        else:
            host, port = split_listen_address(address)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only for
            # sockets that say they are TCP; without it Nagle holds the body of a
            # keep-alive response back until the scraper's delayed ACK (~40 ms).
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        sock.listen(128)
        sock.set_inheritable(True)
        sockets.append(sock)
    return sockets


def serve(config: Config, app: Starlette, web: WebConfig | None,
          sockets: list[socket.socket]) -> None:
    uv = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on",
                        server_header=False, proxy_headers=False,
                        ssl_certfile=web.cert_file if web and web.tls else None,
                        ssl_keyfile=web.key_file if web and web.tls else None,
                        timeout_graceful_shutdown=2)
    uv.load()
    if web is not None and web.tls and uv.ssl is not None:
        apply_tls(uv.ssl, web)
    log.info("listening", addresses=list(config.listen_addresses), tls=bool(web and web.tls),
             basic_auth=bool(web and web.basic_auth_users), path=config.telemetry_path)
    uvicorn.Server(uv).run(sockets=sockets)
