"""The HTTP client of a running daemon: ``snapshot --from``, ``top`` and the image's
health check reach the daemon through here (http, https with a CA or without
verification, a unix socket, basic auth in the URL), and a password never reaches a
message."""

from __future__ import annotations

import http.client
import socket
import ssl


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket, in TLS where the listener serves TLS."""

    def __init__(self, path: str, timeout: float, context: ssl.SSLContext | None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path
        self.context = context

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
            self.sock = sock if self.context is None else self.context.wrap_socket(sock)
        except OSError:
            sock.close()
            raise


def redact_url(address: str) -> str:
    """``address`` with the password of any ``user:password@`` replaced by ``***``."""
    scheme, sep, rest = address.rpartition("://")
    userinfo, at, host = rest.partition("@")
    if not at or ":" not in userinfo:
        return address
    return f"{scheme}{sep}{userinfo.partition(':')[0]}:***@{host}"


def _snapshot_url(address: str, endpoint: str = "/snapshot") -> tuple[str, str | None, str | None]:
    """(the ``endpoint`` URL without credentials, user, password); ValueError when bad."""
    import urllib.parse

    url = address if "://" in address else f"http://{address}"
    parts = urllib.parse.urlsplit(url)  # ValueError: "Invalid IPv6 URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")
    port = parts.port  # ValueError: out of range or not a number
    netloc = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if port:
        netloc += f":{port}"
    path = parts.path.rstrip("/")
    target = urllib.parse.urlunsplit((parts.scheme, netloc, f"{path}{endpoint}", "", ""))
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    return target, user, urllib.parse.unquote(parts.password or "")


def _context(https: bool, ca_file: str | None, insecure: bool,
             check_hostname: bool) -> ssl.SSLContext | None:
    """The client TLS context: the system's CAs, or ``ca_file``'s; none verified with
    ``insecure``. None: plain HTTP."""
    if not (https or ca_file or insecure):
        return None
    context = ssl.create_default_context(cafile=ca_file)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif not check_hostname:  # a unix socket has no host name: the chain is still verified
        context.check_hostname = False
    return context


def fetch_snapshot(address: str, timeout: float = 10.0, ca_file: str | None = None,
                   insecure: bool = False, endpoint: str = "/snapshot") -> bytes:
    """The running daemon's ``/snapshot`` (``gpu-exporter snapshot --from URL``), or its
    ``endpoint`` (with its query: ``gpu-exporter top`` reads ``/api/v1/history``).

    ``address`` is a base URL (``http://127.0.0.1:9445``, ``https://user:pw@host:9445``),
    a bare ``host:port``, or ``unix:/path`` (the daemon's unix socket listener; TLS over
    it with ``ca_file`` or ``insecure``). ``ca_file``: the CA that signed the daemon's
    certificate (``--tls.ca-file``); ``insecure``: no verification at all
    (``--tls.insecure-skip-verify``). Raises OSError on failure, with a message that
    never holds the password.
    """
    import base64
    import http.client
    import urllib.parse

    headers = {"Accept": "application/json"}
    conn: http.client.HTTPConnection
    if address.startswith("unix:"):
        conn = UnixHTTPConnection(address[len("unix:"):], timeout,
                                  _context(False, ca_file, insecure, check_hostname=False))
        path = endpoint
    else:
        query = endpoint.partition("?")
        try:
            target, user, password = _snapshot_url(address, query[0])
        except ValueError as e:
            raise OSError(f"bad URL: {e}") from None
        parts = urllib.parse.urlsplit(target)
        host, port, path = parts.hostname or "", parts.port, parts.path + query[1] + query[2]
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=timeout,
                context=_context(True, ca_file, insecure, check_hostname=True))
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body: bytes = response.read()
    except http.client.HTTPException as e:  # a reply that is not HTTP
        raise OSError(f"bad reply: {e!r}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise OSError(f"HTTP {response.status} {response.reason}")
    return body.rstrip(b"\n")
