"""A small client of the Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``),
on the standard library, for ``gpu-exporter top --prometheus``.

Answers are bounded, so that ``top --prometheus`` stays small whatever the server sends
(bench/fleet_memory.py measures it): one ``ReplyBudget`` per client, shared by the
queries in flight, caps the bytes of the replies being read (gzip included: the inflated
size counts), the JSON values of the reply being decoded (counted on the bytes before
``json.loads``: 16 MiB of ``{}`` is 5.6 million dicts) and the bytes the answers kept
alive hold (given back as each Answer is dropped); replies are decoded one at a time,
each held once. Also a deadline for the whole exchange (not only per socket read), the ``limit``
and ``timeout`` parameters sent with each query (servers that do not know ``limit``
ignore it) and a series cap applied here in any case. Nothing here raises on a bad
reply: an ``Answer`` carries the series, or the reason there are none.

The connection options mirror Prometheus' own ``http_config`` (what promtool reads with
``--http.config.file``): ``basic_auth`` (``username``, ``password``, ``password_file``),
``authorization`` (``type``, ``credentials``, ``credentials_file``; the older
``bearer_token``/``bearer_token_file``), ``tls_config`` (``ca_file``, ``cert_file``,
``key_file``, ``server_name``, ``insecure_skip_verify``). Secret files are read at each
request, as Prometheus does, so a rotated token is picked up, through
exporter.core.untrusted_file (a FIFO is refused, not waited on); a password or token is a
``Secret`` from the moment it is read, and a control character in one is an error that
does not show it.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import math
import ssl
import threading
import time
import urllib.parse
import weakref
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter import __version__
from exporter.client.fetch import certificate_fault, json_values, redact_url
from exporter.core import untrusted_file
from exporter.core.config import load_yaml
from exporter.core.secret import Secret, SecretError, control_character, header_value

DEFAULT_TIMEOUT = 30.0  # seconds for one exchange, connection to last byte
DEFAULT_MAX_BYTES = 16 << 20  # the replies being read, inflated, together
DEFAULT_MAX_VALUES = 400_000  # JSON values of the reply being decoded (20k series; ~40 MB)
DEFAULT_MAX_HELD = 40 << 20  # bytes the answers alive hold (a fleet load's ~13 answers)
# What a kept series costs, for Answer.held: the objects (a Series, its dict, a float)
# and per label pair its two strings and dict entry, plus their text; a point is a tuple
# of two floats. Measured with tracemalloc on CPython 3.11, rounded up.
_SERIES_COST, _LABEL_COST, _POINT_COST = 400, 120, 110
DEFAULT_MAX_SERIES = 20_000  # one answer
_CHUNK = 64 << 10


class ConfigError(ValueError):
    """An HTTP client configuration that cannot be used (the message says which key)."""


@dataclass(frozen=True)
class BasicAuth:
    username: str = ""
    password: Secret = Secret("")
    password_file: str = ""


@dataclass(frozen=True)
class Authorization:
    """``Authorization: <type> <credentials>``; Prometheus' default type is Bearer."""

    type: str = "Bearer"
    credentials: Secret = Secret("")
    credentials_file: str = ""


@dataclass(frozen=True)
class TLSConfig:
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""
    insecure_skip_verify: bool = False


@dataclass(frozen=True)
class HTTPClientConfig:
    """Prometheus' ``http_config``, the parts this client honours."""

    basic_auth: BasicAuth | None = None
    authorization: Authorization | None = None
    tls_config: TLSConfig = TLSConfig()

    def validate(self) -> None:
        """Raise ConfigError for combinations Prometheus rejects too."""
        if self.basic_auth is not None and self.authorization is not None:
            raise ConfigError("at most one of basic_auth, authorization and bearer_token")
        if self.basic_auth and self.basic_auth.password and self.basic_auth.password_file:
            raise ConfigError("basic_auth: at most one of password and password_file")
        if self.authorization is not None:
            a = self.authorization
            if a.credentials and a.credentials_file:
                raise ConfigError("authorization: at most one of credentials and "
                                  "credentials_file")
            if not a.type or any(c.isspace() for c in a.type):
                raise ConfigError("authorization: type must be one word (Bearer)")
            if (bad := control_character(a.credentials.reveal())) is not None:
                raise ConfigError(f"authorization: the credentials contain {bad}")
        tls = self.tls_config
        if bool(tls.cert_file) != bool(tls.key_file):
            raise ConfigError("tls_config: cert_file and key_file go together")


_KNOWN = {
    "basic_auth": {"username", "password", "password_file"},
    "authorization": {"type", "credentials", "credentials_file"},
    "tls_config": {"ca_file", "cert_file", "key_file", "server_name", "insecure_skip_verify"},
}
_TOP = {*_KNOWN, "bearer_token", "bearer_token_file"}


def http_config_from_mapping(data: Mapping[str, Any]) -> HTTPClientConfig:
    """An ``http_config`` mapping (the YAML of promtool's ``--http.config.file``) ->
    HTTPClientConfig. Keys this client cannot honour (proxy_url, oauth2, ...) are an
    error, never silently dropped."""
    if not isinstance(data, Mapping):
        raise ConfigError("the HTTP client configuration must be a mapping")
    unknown = sorted(str(k) for k in data if k not in _TOP)
    if unknown:
        raise ConfigError(f"not supported here: {', '.join(unknown)}")
    sections: dict[str, dict[str, Any]] = {}
    for name, keys in _KNOWN.items():
        section = data.get(name)
        if section is None:
            continue
        if not isinstance(section, Mapping):
            raise ConfigError(f"{name}: must be a mapping")
        bad = sorted(str(k) for k in section if k not in keys)
        if bad:
            raise ConfigError(f"{name}: not supported here: {', '.join(bad)}")
        for key, value in section.items():
            want = bool if key == "insecure_skip_verify" else str
            if not isinstance(value, want):
                raise ConfigError(f"{name}.{key}: must be a {want.__name__}")
        sections[name] = dict(section)
    for name, key in (("basic_auth", "password"), ("authorization", "credentials")):
        if key in sections.get(name, {}):
            sections[name][key] = Secret(sections[name][key])
    authorization = None
    if "authorization" in sections:
        authorization = Authorization(**sections["authorization"])
    for key in ("bearer_token", "bearer_token_file"):
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a str")
        if authorization is not None:
            raise ConfigError("at most one of authorization, bearer_token and "
                              "bearer_token_file")
        authorization = (Authorization(credentials=Secret(value)) if key == "bearer_token"
                         else Authorization(credentials_file=value))
    config = HTTPClientConfig(
        basic_auth=BasicAuth(**sections["basic_auth"]) if "basic_auth" in sections else None,
        authorization=authorization,
        tls_config=TLSConfig(**sections.get("tls_config", {})))
    config.validate()
    return config


def load_http_config(path: str | Path) -> HTTPClientConfig:
    """Read an ``http_config`` YAML file (ConfigError when unreadable or invalid; the
    message names the file and the fault, never a line of it: it holds passwords)."""
    try:
        data = load_yaml(str(path)) or {}
    except (OSError, ValueError) as e:  # UnreadableFile names the file and the rule
        raise ConfigError(str(e)) from None
    return http_config_from_mapping(data)


def _secret(path: str) -> Secret:
    """A secret file (at most untrusted_file.SECRET's 64 KiB, a regular file), surrounding
    whitespace trimmed as Prometheus does."""
    return Secret(untrusted_file.read_text(path, untrusted_file.SECRET, "replace").strip())


def _ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """ssl opens the CA, certificate and key files itself: each is checked first as
    untrusted_file reads them (a FIFO would hold ssl's open() for good)."""
    for path in (tls.ca_file, tls.cert_file, tls.key_file):
        if path:
            untrusted_file.check(path, untrusted_file.PEM)
    context = ssl.create_default_context(cafile=tls.ca_file or None)
    if tls.cert_file:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


# ---------------------------------------------------------------- answers


@dataclass(frozen=True)
class Series:
    """One series of an instant answer: its labels (``__name__`` included where the
    server kept it) and its value, never NaN or infinite."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range answer: (unix time, value) points, finite values only."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Answer:
    """What one query returned. ``error`` set: no usable reply (the reason, for one line
    of a view). ``truncated``: more series existed than the cap. ``dropped``: series or
    points of the reply that were malformed or not finite, left out."""

    expr: str
    series: tuple[Series, ...] = ()
    ranges: tuple[RangeSeries, ...] = ()
    error: str | None = None
    truncated: bool = False
    dropped: int = 0
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    bytes: int = 0
    held: int = 0  # about how many bytes its series hold (labels' text and objects)

    @property
    def ok(self) -> bool:
        return self.error is None


def _value(raw: Any) -> float | None:
    """``[<unix time>, "<value>"]`` -> the finite value, else None."""
    if not isinstance(raw, list) or len(raw) != 2 or not isinstance(raw[1], str):
        return None
    try:
        v = float(raw[1])
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _labels(raw: Any) -> dict[str, str] | None:
    if not isinstance(raw, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        return None
    return raw


def parse_reply(expr: str, body: bytes | bytearray, max_series: int = DEFAULT_MAX_SERIES,
                status: int = 200, max_values: int = DEFAULT_MAX_VALUES) -> Answer:
    """A Prometheus API reply -> Answer. Never raises. A reply of more than
    ``max_values`` JSON values (exporter.client.fetch.json_values) is refused before it
    is decoded."""
    values = json_values(body)
    if values > max_values:
        return Answer(expr, error=f"reply of about {values:,} JSON values, over the "
                      f"{max_values:,} one reply may hold: narrow the query (a selector)",
                      bytes=len(body))
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        text = "not JSON" if status == 200 else f"HTTP {status}"
        return Answer(expr, error=text, bytes=len(body))
    if not isinstance(doc, dict):
        return Answer(expr, error="not a Prometheus API reply", bytes=len(body))
    warnings = tuple(str(w)[:200] for w in doc.get("warnings") or () if isinstance(w, str)) \
        if isinstance(doc.get("warnings"), list) else ()
    if doc.get("status") != "success":
        kind, msg = doc.get("errorType"), doc.get("error")
        reason = f"{kind}: {msg}" if isinstance(kind, str) and isinstance(msg, str) \
            else f"HTTP {status}"
        return Answer(expr, error=reason[:300], warnings=warnings, bytes=len(body))
    data = doc.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), (list, str)):
        return Answer(expr, error="no result in the reply", bytes=len(body))
    kind, result = data.get("resultType"), data["result"]
    if kind == "scalar":
        v = _value(result)
        return Answer(expr, series=() if v is None else (Series({}, v),),
                      dropped=int(v is None), warnings=warnings, bytes=len(body))
    if kind not in ("vector", "matrix") or not isinstance(result, list):
        return Answer(expr, error=f"unexpected result type {str(kind)[:20]}", bytes=len(body))
    truncated = len(result) > max_series
    dropped = 0
    held = 0
    series: list[Series] = []
    ranges: list[RangeSeries] = []
    for item in result[:max_series]:
        labels = _labels(item.get("metric")) if isinstance(item, dict) else None
        if labels is None:
            dropped += 1
            continue
        if kind == "vector":
            v = _value(item.get("value"))
            if v is None:
                dropped += 1
                continue
            series.append(Series(labels, v))
            held += _labels_cost(labels)
            continue
        raw_points = item.get("values")
        if not isinstance(raw_points, list):
            dropped += 1
            continue
        points = []
        for raw in raw_points:
            v = _value(raw)
            if v is None or not isinstance(raw[0], (int, float)) or isinstance(raw[0], bool):
                dropped += 1
                continue
            points.append((float(raw[0]), v))
        ranges.append(RangeSeries(labels, tuple(points)))
        held += _labels_cost(labels) + _POINT_COST * len(points)
    return Answer(expr, series=tuple(series), ranges=tuple(ranges), truncated=truncated,
                  dropped=dropped, warnings=warnings, bytes=len(body), held=held)


def _labels_cost(labels: Mapping[str, str]) -> int:
    return _SERIES_COST + sum(_LABEL_COST + len(k) + len(v) for k, v in labels.items())


# ---------------------------------------------------------------- transport


class _Failed(Exception):
    """A transport failure, with the message a view may show."""


class ReplyBudget:
    """What the replies and answers of one client may hold at once, shared by the
    queries in flight: ``max_bytes`` of replies being read, ``max_values`` JSON values
    for the one reply being decoded (``decoding``: one at a time, json.loads is bound by
    the interpreter lock anyway), ``max_held`` bytes the answers alive hold (Answer.held,
    given back as each answer is dropped)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_values: int = DEFAULT_MAX_VALUES,
                 max_held: int = DEFAULT_MAX_HELD) -> None:
        self.max_bytes, self.max_values, self.max_held = max_bytes, max_values, max_held
        self.bytes = 0
        self.held = 0
        self.decoding = threading.Lock()
        self._lock = threading.Lock()

    def take_bytes(self, n: int) -> bool:
        with self._lock:
            if self.bytes + n > self.max_bytes:
                return False
            self.bytes += n
            return True

    def give_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes = max(0, self.bytes - n)

    def take_held(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.max_held:
                return False
            self.held += n
            return True

    def give_held(self, n: int) -> None:
        with self._lock:
            self.held = max(0, self.held - n)


class _Reading:
    """The bytes one reply has taken from the budget (given back when it is decoded)."""

    def __init__(self, budget: ReplyBudget) -> None:
        self.budget = budget
        self.taken = 0

    def take(self, n: int) -> None:
        if not self.budget.take_bytes(n):
            mib = self.budget.max_bytes / (1 << 20)
            if self.taken + n > self.budget.max_bytes:
                raise _Failed(f"reply larger than {mib:g} MiB: narrow the query (a "
                              "selector)")
            raise _Failed(f"the replies in flight hold more than {mib:g} MiB together: "
                          "narrow the queries (a selector)")
        self.taken += n

    def close(self) -> None:
        self.budget.give_bytes(self.taken)
        self.taken = 0


class PrometheusAPI:
    """The HTTP API of one Prometheus (or Thanos, Mimir, VictoriaMetrics...) at ``url``
    (``https://prometheus.example:9090``, a path prefix kept: ``.../prometheus``;
    ``user:password@`` in the URL is basic auth). Safe to share between threads: each
    request has its own connection."""

    def __init__(self, url: str, http_config: HTTPClientConfig | None = None,
                 timeout: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_series: int = DEFAULT_MAX_SERIES,
                 budget: ReplyBudget | None = None) -> None:
        config = http_config or HTTPClientConfig()
        config.validate()
        address = url if "://" in url else f"http://{url}"
        parts = urllib.parse.urlsplit(address)  # ValueError: a bad IPv6 literal
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{redact_url(url)}: not an http:// or https:// URL with a host")
        _ = parts.port  # ValueError when not a number or out of range
        if parts.username is not None:
            if config.basic_auth is not None or config.authorization is not None:
                raise ConfigError("credentials in the URL and in the HTTP configuration")
            config = HTTPClientConfig(
                basic_auth=BasicAuth(urllib.parse.unquote(parts.username),
                                     Secret(urllib.parse.unquote(parts.password or ""))),
                tls_config=config.tls_config)
        self.config = config
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/")
        self.display = redact_url(urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc.rpartition("@")[2], self.prefix, "", "")))
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.budget = budget or ReplyBudget(max_bytes)
        self.max_series = max_series
        self._context = _ssl_context(config.tls_config) if self.https else None

    # -- the two queries

    def query(self, expr: str, at: float | None = None) -> Answer:
        """An instant query (``/api/v1/query``), evaluated at ``at`` (unix time) or now."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._call("/api/v1/query", expr, params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> Answer:
        """A range query (``/api/v1/query_range``); ``ranges`` holds the series."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                  "step": f"{max(step, 0.001):.3f}"}
        return self._call("/api/v1/query_range", expr, params)

    # -- plumbing

    def _call(self, endpoint: str, expr: str, params: dict[str, str]) -> Answer:
        params = {**params, "timeout": f"{max(int(self.timeout), 1)}s",
                  "limit": str(self.max_series + 1)}
        started = time.monotonic()
        budget = self.budget
        reading = _Reading(budget)
        try:
            status, body = self._exchange(endpoint, params, started + self.timeout, reading)
            size = len(body)
            with budget.decoding:  # one decode at a time, the reply's bytes held once
                answer = parse_reply(expr, body, self.max_series, status, budget.max_values)
            del body
        except _Failed as e:
            return Answer(expr, error=str(e), seconds=time.monotonic() - started)
        finally:
            reading.close()
        if answer.ok and status != 200:  # a success body under an error status
            answer = Answer(expr, error=f"HTTP {status}", bytes=size)
        elif answer.held and not budget.take_held(answer.held):
            mib = budget.max_held / (1 << 20)
            answer = Answer(expr, error=f"the answers kept would hold more than {mib:g} MiB "
                            "together: narrow the queries (a selector)", bytes=size)
        answer = dataclasses.replace(answer, seconds=time.monotonic() - started)
        if answer.held:  # given back when the answer is dropped
            weakref.finalize(answer, budget.give_held, answer.held)
        return answer

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip",
                   "User-Agent": f"gpu-exporter/{__version__}"}
        try:
            auth = self.config.basic_auth
            if auth is not None:
                password = _secret(auth.password_file) if auth.password_file else auth.password
                token = base64.b64encode(
                    f"{auth.username}:{password.reveal()}".encode()).decode()
                headers["Authorization"] = header_value("basic_auth", "Basic", token)
            bearer = self.config.authorization
            if bearer is not None:
                credentials = (_secret(bearer.credentials_file) if bearer.credentials_file
                               else bearer.credentials)
                headers["Authorization"] = header_value(
                    "the credentials" + (f" of {bearer.credentials_file}"
                                         if bearer.credentials_file else ""),
                    bearer.type, credentials)
        except untrusted_file.UnreadableFile as e:  # names the file and the rule only
            raise _Failed(f"secret file: {e}") from None
        except SecretError as e:
            raise _Failed(str(e)) from None
        return headers

    def _connection(self, deadline: float) -> http.client.HTTPConnection:
        timeout = max(deadline - time.monotonic(), 0.001)
        if not self.https:
            return http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        server_name = self.config.tls_config.server_name
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                           context=self._context)
        if server_name:  # verify (and send SNI) for this name, connect to the URL's host
            context = self._context
            assert context is not None

            def connect() -> None:
                http.client.HTTPConnection.connect(conn)
                conn.sock = context.wrap_socket(conn.sock, server_hostname=server_name)

            conn.connect = connect  # type: ignore[method-assign]
        return conn

    def _exchange(self, endpoint: str, params: dict[str, str], deadline: float,
                  reading: _Reading) -> tuple[int, bytearray]:
        body = urllib.parse.urlencode(params)
        headers = self._headers()
        path = self.prefix + endpoint
        for method in ("POST", "GET"):
            conn = self._connection(deadline)
            try:
                if method == "POST":
                    conn.request("POST", path, body=body, headers={
                        **headers, "Content-Type": "application/x-www-form-urlencoded"})
                else:
                    conn.request("GET", f"{path}?{body}", headers=headers)
                response = conn.getresponse()
                if response.status == 405 and method == "POST":  # a GET-only proxy
                    continue
                if 300 <= response.status < 400:
                    raise _Failed(f"HTTP {response.status} redirect (not followed: give the "
                                  "final URL)")
                if response.status in (401, 403):
                    raise _Failed(f"HTTP {response.status} {response.reason[:60]}: check the "
                                  "credentials")
                return response.status, self._read(response, deadline, reading)
            except ssl.SSLError as e:
                raise _Failed(certificate_fault(e, self.config.tls_config.server_name
                                                or self.host)) from None
            except TimeoutError:
                raise _Failed(f"no answer from {self.display} within {self.timeout:g} s") \
                    from None
            except (OSError, http.client.HTTPException) as e:
                raise _Failed(f"{self.display}: {type(e).__name__}: {e}"[:300]) from None
            finally:
                conn.close()
        raise _Failed("HTTP 405: the server takes neither POST nor GET")

    def _read(self, response: http.client.HTTPResponse, deadline: float,
              reading: _Reading) -> bytearray:
        """The body, each chunk (inflated) taken from the budget before it is kept."""
        gzipped = response.getheader("Content-Encoding", "").strip().lower() == "gzip"
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        sock = getattr(getattr(response.fp, "raw", None), "_sock", None)
        out = bytearray()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Failed(f"reply from {self.display} not complete within "
                              f"{self.timeout:g} s")
            if sock is not None:  # each read waits at most until the deadline
                sock.settimeout(left)
            raw = response.read1(_CHUNK)
            if inflate is None:
                reading.take(len(raw))
                out += raw
            else:
                # Inflated a chunk at a time, each taken from the budget before it is
                # kept: a bomb is inflated no further than the budget's room.
                try:
                    data = inflate.decompress(raw, _CHUNK) if raw else inflate.flush()
                    while True:
                        reading.take(len(data))
                        out += data
                        if not inflate.unconsumed_tail:
                            break
                        data = inflate.decompress(inflate.unconsumed_tail, _CHUNK)
                except zlib.error:
                    raise _Failed("reply is not valid gzip") from None
            if not raw:
                break
        return out
