"""The HTTP client of a running daemon: ``snapshot --from``, ``top`` and the image's
health check reach the daemon through here (http, https with a CA or without
verification, a unix socket, basic auth in the URL), and a password never reaches a
message.

The other end is not trusted: a reply is bounded in time as a whole (``timeout``: a
watchdog shuts the connection at the deadline, so a reply trickled a byte at a time
ends there, not at the first idle gap) and in size (``max_bytes``: refused from its
Content-Length, else once that much has come, never read whole first). Failures are
``FetchError``s (OSErrors) that say which: ``HTTPStatus`` (with ``status``),
``ReplyTooLarge``, ``ReplyTimeout``; TLS failures stay ``ssl.SSLError``.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading

from exporter.core import untrusted_file
from exporter.core.secret import Secret
from exporter.core.units import printable

MAX_REPLY = 64 << 20  # bytes: /snapshot of a large node is a few MiB


class FetchError(OSError):
    """A reply that did not come, or not as it should."""


class HTTPStatus(FetchError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status


class ReplyTooLarge(FetchError):
    pass


class ReplyTimeout(FetchError, TimeoutError):
    pass


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


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


# OpenSSL's X509_V_ERR_* codes (x509_vfy.h) that ssl.SSLCertVerificationError.verify_code
# holds, by the fault a user can act on.
_SELF_SIGNED = {18, 19}  # DEPTH_ZERO_SELF_SIGNED_CERT, SELF_SIGNED_CERT_IN_CHAIN
_EXPIRED = {10}  # CERT_HAS_EXPIRED
_NOT_YET_VALID = {9}  # CERT_NOT_YET_VALID
_WRONG_HOST = {62, 64}  # HOSTNAME_MISMATCH, IP_ADDRESS_MISMATCH
_UNKNOWN_CA = {2, 20, 21}  # UNABLE_TO_GET_ISSUER_CERT(_LOCALLY), UNABLE_TO_VERIFY_LEAF_SIGNATURE


def certificate_fault(error: ssl.SSLError, host: str) -> str:
    """A TLS failure in the words that say which flag helps: a self-signed, expired or
    not yet valid certificate, one for another host, one from a CA this machine does not
    trust; else OpenSSL's reason. One line, without "CERTIFICATE_VERIFY_FAILED" alone."""
    if not isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS: {error.reason or error}"
    code = error.verify_code
    if code in _SELF_SIGNED:
        return ("TLS: the server's certificate is self-signed: give it (or the CA that "
                "signed it) with --tls.ca-file, or skip the check with "
                "--tls.insecure-skip-verify")
    if code in _EXPIRED:
        return ("TLS: the server's certificate has expired: renew it on the server "
                "(--tls.insecure-skip-verify skips the check)")
    if code in _NOT_YET_VALID:
        return ("TLS: the server's certificate is not valid yet: check this machine's "
                "clock (--tls.insecure-skip-verify skips the check)")
    if code in _WRONG_HOST:
        return (f"TLS: the server's certificate is not for {host}: connect by a name it "
                "holds, or give that name with --tls.server-name")
    if code in _UNKNOWN_CA:
        return ("TLS: the server's certificate is signed by a CA this machine does not "
                "trust: give that CA with --tls.ca-file")
    return f"TLS: {error.verify_message or error.reason or error}"


def json_values(body: bytes | bytearray) -> int:
    """An upper bound on the JSON values ``body`` decodes to, counted without decoding:
    every value but the first follows a ``[``, ``,`` or ``:``, and a ``{`` is counted
    too (an object costs more than a value). Bytes inside strings count as well, which
    only overestimates. A decoded value costs at most about 100 bytes (a one-key dict):
    this bounds a reply's decoded size before it exists (16 MiB of ``{}`` is 5.6 million
    dicts, 1 GB)."""
    return (body.count(b"[") + body.count(b",") + body.count(b":") + body.count(b"{") + 1)


def redact_url(address: str) -> str:
    """``address`` with the password of any ``user:password@`` replaced by ``***``."""
    scheme, sep, rest = address.rpartition("://")
    userinfo, at, host = rest.partition("@")
    if not at or ":" not in userinfo:
        return address
    return f"{scheme}{sep}{userinfo.partition(':')[0]}:***@{host}"


def _snapshot_url(address: str, endpoint: str = "/snapshot"
                  ) -> tuple[str, str | None, Secret]:
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
    return target, user, Secret(urllib.parse.unquote(parts.password or ""))


def _context(https: bool, ca_file: str | None, insecure: bool,
             check_hostname: bool) -> ssl.SSLContext | None:
    """The client TLS context: the system's CAs, or ``ca_file``'s; none verified with
    ``insecure``. None: plain HTTP."""
    if not (https or ca_file or insecure):
        return None
    if ca_file:  # ssl opens it itself: a FIFO would hold that open() for good
        untrusted_file.check(ca_file, untrusted_file.PEM)
    context = ssl.create_default_context(cafile=ca_file)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif not check_hostname:  # a unix socket has no host name: the chain is still verified
        context.check_hostname = False
    return context


def fetch_snapshot(address: str, timeout: float = 10.0, ca_file: str | None = None,
                   insecure: bool = False, endpoint: str = "/snapshot",
                   max_bytes: int = MAX_REPLY) -> bytes:
    """The running daemon's ``/snapshot`` (``gpu-exporter snapshot --from URL``), or its
    ``endpoint`` (with its query: ``gpu-exporter top`` reads ``/api/v1/history``).

    ``address`` is a base URL (``http://127.0.0.1:9445``, ``https://user:pw@host:9445``),
    a bare ``host:port``, or ``unix:/path`` (the daemon's unix socket listener; TLS over
    it with ``ca_file`` or ``insecure``). ``ca_file``: the CA that signed the daemon's
    certificate (``--tls.ca-file``); ``insecure``: no verification at all
    (``--tls.insecure-skip-verify``). ``timeout``: for the whole reply; ``max_bytes``:
    the largest body read. Raises OSError on failure (FetchError, ssl.SSLError, ...),
    with a message that never holds the password.
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
            token = base64.b64encode(f"{user}:{password.reveal()}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                host, port, timeout=timeout,
                context=_context(True, ca_file, insecure, check_hostname=True))
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
    expired = threading.Event()
    sockets: list[socket.socket] = []  # the connection's (http.client lets go of it early)

    def cut() -> None:  # the deadline: whatever is blocked on the socket returns now
        expired.set()
        for sock in [*sockets, conn.sock]:
            if sock is not None:
                try:  # the plain socket's shutdown, under TLS too: the SSL object stays
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass

    watchdog = threading.Timer(timeout, cut)
    watchdog.daemon = True
    watchdog.start()
    response: http.client.HTTPResponse | None = None
    try:
        conn.request("GET", path, headers=headers)
        if conn.sock is not None:
            sockets.append(conn.sock)
        if expired.is_set():  # the deadline came while connecting
            cut()
        response = conn.getresponse()
        if response.status != 200:
            raise HTTPStatus(response.status, printable(response.reason, 200))
        body = _read(response, max_bytes)
    except http.client.HTTPException as e:  # a reply that is not HTTP
        if expired.is_set():
            raise ReplyTimeout(f"no complete reply within {timeout:g} s") from None
        raise FetchError(f"bad reply: {printable(repr(e), 200)}") from None
    except OSError:
        if expired.is_set():
            raise ReplyTimeout(f"no complete reply within {timeout:g} s") from None
        raise
    finally:
        watchdog.cancel()
        if response is not None:
            response.close()  # the socket goes with its last reader: this one, unread
        conn.close()
    if expired.is_set():  # cut while the last bytes came: not known to be whole
        raise ReplyTimeout(f"no complete reply within {timeout:g} s")
    return body.rstrip(b"\n")


def _read(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The body, at most ``max_bytes``: refused at once when its Content-Length says
    more, else as soon as more has come."""
    length = response.getheader("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise ReplyTooLarge(f"reply of {_mib(int(length))}, over the {_mib(max_bytes)} "
                            "accepted")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = response.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise ReplyTooLarge(f"reply over the {_mib(max_bytes)} accepted")
        chunks.append(chunk)
