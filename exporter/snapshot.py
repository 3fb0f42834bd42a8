"""A Snapshot as plain JSON: what ``/snapshot`` and ``gpu-exporter snapshot`` print.

The first thing to look at when a metric is missing: every backend with its state
and the reason it is off, and every value each backend read, by GPU.
"""

from __future__ import annotations

import dataclasses
import json
import ssl
from collections.abc import Mapping
from typing import Any

from exporter import __version__
from exporter.state import Snapshot


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is None or (isinstance(v, (Mapping, tuple)) and not v):
                continue  # "not exposed": left out, as in /metrics
            out[f.name] = _plain(v)
        return out
    if isinstance(value, Mapping):
        return {("/".join(map(str, k)) if isinstance(k, tuple) else str(k)): _plain(v)
                for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def snapshot_dict(s: Snapshot, otlp: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``otlp``: the OTLP pusher's status (endpoint, exports, last error), when it runs."""
    backends = []
    for state in s.backends:
        entry: dict[str, Any] = {
            "backend": state.name,
            "up": state.up and not state.stale,
            "reason": "no completed collection within --stale-after" if state.stale
            else state.reason,
            "last_collection_timestamp": state.last_success,
            "errors_total": dict(state.errors_total),
        }
        if state.last is not None:
            devices = []
            for d in state.last.devices:
                index = s.gpu_index.get(d.info.parent_key or d.info.key)
                # A string, as the ``gpu`` label and devices[] below give it.
                item = {"gpu": None if index is None else str(index)}
                item.update(_plain(d))
                devices.append(item)
            entry["duration_seconds"] = state.last.duration_seconds
            entry["devices"] = devices
        backends.append(entry)
    verdicts = {id(d): v for _, d, v in s.health}
    merged = []
    for gpu, d in s.devices:
        one: dict[str, Any] = {"gpu": gpu, **_plain(d)}
        if (verdict := verdicts.get(id(d))) is not None:
            one["health"] = verdict.as_dict()
        merged.append(one)
    out = {"version": __version__, "generation": s.generation, "created": s.created,
           "ready": s.ready, "processes_truncated_total": s.processes_truncated_total,
           "backends": backends, "devices": merged}
    if otlp is not None:
        out["otlp"] = dict(otlp)
    return out


def snapshot_json(s: Snapshot, indent: int | None = None,
                  otlp: Mapping[str, Any] | None = None) -> bytes:
    return json.dumps(snapshot_dict(s, otlp), indent=indent, sort_keys=False).encode()


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

    from exporter.healthcheck import UnixHTTPConnection

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
