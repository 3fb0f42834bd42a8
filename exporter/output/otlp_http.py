"""The OTLP push's HTTP session: a receiver is not trusted (exporter.output.otlp sends through it).

The OpenTelemetry SDK's exporter is given ``PushSession``: it never follows a redirect (a
3xx fails the push, naming where it pointed), reads at most ``MAX_RESPONSE_BYTES`` of an
answer and closes the connection, and shuts the socket down when the push's wall-clock
deadline (``--otlp.timeout``, retries included) has passed, whatever the receiver sends.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import requests

MAX_RESPONSE_BYTES = 64 * 1024  # an OTLP answer is a few bytes (a partial_success at most)
_current = threading.local()  # the deadline of the request this thread is sending


class RedirectRefused(requests.exceptions.RequestException):  # type: ignore[misc,unused-ignore]
    """A 3xx: the SDK counts any status below 400 as delivered; nothing was."""


class DeadlinePassed(requests.exceptions.RequestException):  # type: ignore[misc,unused-ignore]
    """The receiver did not answer in full within --otlp.timeout."""


class _Deadline:
    """Shuts the request's sockets down when its time is up: a socket timeout bounds one
    read, and a receiver that sends a byte a second never lets one run out."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self.fire)
        self._timer.daemon = True

    def watch(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            fired = self.fired
        if fired:
            self._shut(sock)

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        try:  # the raw socket's, under TLS too: the reading thread sees EOF at once
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass

    def __enter__(self) -> _Deadline:
        _current.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        _current.deadline = None


def _watched(base: type[Any]) -> type[Any]:
    """A urllib3 connection class whose socket the current request's deadline can shut."""

    class Watched(base):  # type: ignore[misc]
        def connect(self) -> None:
            super().connect()
            if (deadline := getattr(_current, "deadline", None)) is not None:
                deadline.watch(self.sock)

        def request(self, *args: Any, **kwargs: Any) -> Any:
            if self.sock is not None and (deadline := getattr(_current, "deadline", None)):
                deadline.watch(self.sock)  # a kept-alive connection, connected before
            return super().request(*args, **kwargs)

    Watched.__name__ = Watched.__qualname__ = base.__name__  # as errors name it
    return Watched


class _WatchedAdapter(requests.adapters.HTTPAdapter):  # type: ignore[misc,unused-ignore]
    """Every connection it opens (direct or through a proxy) is watched."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self._watch_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        self._watch_pools(manager)
        return manager

    @staticmethod
    def _watch_pools(manager: Any) -> None:
        import urllib3

        pools = {}
        for scheme, pool in urllib3.poolmanager.pool_classes_by_scheme.items():
            connection = getattr(pool, "ConnectionCls")  # noqa: B009 - untyped in the stubs
            pools[scheme] = type(pool.__name__, (pool,),
                                 {"ConnectionCls": _watched(connection)})
        manager.pool_classes_by_scheme = pools


class PushSession(requests.Session):  # type: ignore[misc,unused-ignore]
    """The session the SDK sends with; it does not trust the receiver.

    - one request holds for at most its timeout and the export's ``deadline``
      (``--otlp.timeout``) in wall-clock time: a watchdog shuts its socket down then;
    - redirects are not followed, and a 3xx is an error (the SDK counts any status
      below 400 as delivered);
    - at most MAX_RESPONSE_BYTES of a response body are read, undecoded; the rest is
      left unread and the connection closed.

    With ``ca_file``, its CA wins over REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE: plain
    requests lets those variables replace a session's ``verify`` (psf/requests#3829,
    #4650), and many images set them, so --otlp.ca-file was ignored.
    """

    def __init__(self, ca_file: bool = False) -> None:
        super().__init__()
        self.ca_file = ca_file
        self.deadline: float | None = None  # time.monotonic() by which the export ends
        self.timeout: float | None = None  # --otlp.timeout, as the error names it
        self.current: _Deadline | None = None
        adapter = _WatchedAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def merge_environment_settings(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        settings: dict[str, Any] = super().merge_environment_settings(*args, **kwargs)
        if self.ca_file:
            settings["verify"] = self.verify
        return settings

    def abort(self) -> None:
        """Ends the request in flight now (the daemon is stopping)."""
        self.deadline = 0.0
        if (current := self.current) is not None:
            current.fire()

    def request(  # type: ignore[override]
            self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:
        kwargs["allow_redirects"] = False
        kwargs["stream"] = True  # the body is read here, bounded
        limits = [t for t in (kwargs.get("timeout"),) if isinstance(t, (int, float))]
        if self.deadline is not None:
            limits.append(self.deadline - time.monotonic())
        seconds = min(limits) if limits else 10.0
        if seconds <= 0:
            raise DeadlinePassed("no time left of --otlp.timeout for this try")
        kwargs["timeout"] = seconds
        with _Deadline(seconds) as deadline:
            self.current = deadline
            try:
                response: requests.Response = super().request(method, url, *args, **kwargs)
                body = _read_bounded(response)
            except Exception:  # noqa: BLE001 - urllib3 raises its own on a cut read
                if deadline.fired:
                    raise DeadlinePassed(self._late(seconds)) from None
                raise
            finally:
                self.current = None
        if deadline.fired:  # cut mid-headers, an EOF can read as a complete answer
            raise DeadlinePassed(self._late(seconds))
        response._content = body
        response._content_consumed = True
        if 300 <= response.status_code < 400:
            where = response.headers.get("Location", "")[:200]
            raise RedirectRefused(
                f"HTTP {response.status_code} {response.reason} to {where or '(no Location)'}:"
                " redirects are not followed; set --otlp.endpoint to the final URL")
        return response


    def _late(self, seconds: float) -> str:
        return (f"no complete answer within --otlp.timeout ({self.timeout or seconds:g}s); "
                "the connection was closed")


def _read_bounded(response: requests.Response) -> bytes:
    """At most MAX_RESPONSE_BYTES of the body, as sent (not decompressed); a longer body
    is cut there and its connection closed rather than drained."""
    chunks, size = [], 0
    raw = response.raw
    while size <= MAX_RESPONSE_BYTES:
        chunk = raw.read(min(16384, MAX_RESPONSE_BYTES + 1 - size), decode_content=False)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    response.close()  # a body not read to its end: urllib3 closes the connection
    return b"".join(chunks)[:MAX_RESPONSE_BYTES]
