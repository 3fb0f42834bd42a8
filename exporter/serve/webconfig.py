"""``--web.config.file``: TLS, basic auth and rate limits in the exporter-toolkit format.

    tls_server_config:
      cert_file: /etc/gpu-exporter/tls.crt          # or inline: cert / key (PEM)
      key_file: /etc/gpu-exporter/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file / client_ca
      client_ca_file: /etc/gpu-exporter/ca.crt
      client_allowed_sans: [prometheus.example.com]
      min_version: TLS12                             # TLS10..TLS13
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]   # Go names, TLS <= 1.2
      prefer_server_cipher_suites: true
      curve_preferences: [CurveP256]
    http_server_config:
      http2: false
      headers: {X-Frame-Options: deny}
    basic_auth_users:
      prometheus: $2b$12$...                        # bcrypt hash (htpasswd -nBC 12 user)
    rate_limit: {interval: 100ms, burst: 10}

Every key of the format (prometheus/exporter-toolkit docs/web-configuration.md) is
accepted; unknown keys are errors (a typo must not silently switch TLS or auth off).
What Python's ssl cannot do is said once at start: HTTP/2 (uvicorn serves HTTP/1.1).
Every problem with the file, its certificates or its hashes is one line at start.

TLS defaults are exporter-toolkit's, which are Go's crypto/tls defaults (the toolkit
sets only MinVersion TLS 1.2): TLS 1.2 offers Go's default suites (``GO_CIPHERS``:
ECDHE with AES-GCM, ChaCha20-Poly1305 or AES-CBC-SHA, never the CBC-SHA256/SHA384
suites OpenSSL adds, nor RSA key exchange), TLS 1.3 its three suites, and the key
exchange groups are Go's (``GO_CURVES``: X25519, P-256, P-384, P-521; Go's hybrid
X25519MLKEM768 needs OpenSSL 3.5). ``curve_preferences`` sets the groups, in order, through
OpenSSL's ``SSL_CTX_set1_groups_list`` (Python's ssl sets one curve only); where that
cannot be reached, one curve is set through ssl and several are refused at start.

Response headers are limited to exporter-toolkit's security headers, as there.
Inline PEM is loaded through memory and never written to a file that stays (the
container healthcheck loads this file every 30 s). Basic auth and the rate limit are
the ASGI middlewares of exporter.serve.middleware.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import ssl
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from exporter.core import untrusted_file
from exporter.core.config import ConfigError, load_yaml_mapping, parse_bool, parse_duration
from exporter.serve.middleware import OPEN_PATHS

log = structlog.get_logger(__name__)

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "RequireClientCert": ssl.CERT_REQUIRED,  # exporter-toolkit's older name of the above
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# Go's crypto/tls names (tls.CipherSuites(), the ones exporter-toolkit accepts) -> OpenSSL's.
# TLS 1.3 suites are not configurable, in Go as in Python: accepted, left to the library.
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}
# What Go's crypto/tls offers when Config.CipherSuites is unset, in its order
# (cipher_suites.go's cipherSuitesPreferenceOrder without disabledCipherSuites,
# rsaKexCiphers and tdesCiphers; defaults.go), as OpenSSL names.
GO_CIPHERS = ":".join((
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA", "ECDHE-RSA-AES256-SHA"))
# exporter-toolkit's curve names -> OpenSSL's group names (and, for ssl's one-curve
# set_ecdh_curve, its short names).
CURVES = {"CurveP256": "P-256", "CurveP384": "P-384", "CurveP521": "P-521",
          "X25519": "X25519"}
SHORT_NAMES = {"P-256": "prime256v1", "P-384": "secp384r1", "P-521": "secp521r1",
               "X25519": "X25519"}
# Go's defaultCurvePreferences (defaults.go) without X25519MLKEM768.
GO_CURVES = ("X25519", "P-256", "P-384", "P-521")
SSL_CTRL_SET_GROUPS_LIST = 92  # OpenSSL's ssl.h: SSL_CTX_set1_groups_list is this ctrl
TLS_KEYS = {"cert", "key", "client_ca", "cert_file", "key_file", "client_auth_type",
            "client_ca_file", "client_allowed_sans", "min_version", "max_version",
            "cipher_suites", "prefer_server_cipher_suites", "curve_preferences"}
HTTP_KEYS = {"headers", "http2"}
RATE_KEYS = {"interval", "burst"}
TOP_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
__all__ = ["OPEN_PATHS", "WebConfig", "load_web_config", "tls_context"]
# The only headers http_server_config.headers may set, and the values allowed where
# the header has a fixed set: exporter-toolkit's extraHTTPHeaders (web/handler.go in
# prometheus/exporter-toolkit), names as written there.
EXTRA_HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a header value is one line of text
BCRYPT_RE = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}\Z")


@dataclass(frozen=True)
class WebConfig:
    cert_file: str | None = None
    key_file: str | None = None
    cert_pem: str | None = None  # inline (cert:), loaded from memory, never written out
    key_pem: str | None = field(default=None, repr=False)  # inline (key:): a private key
    client_ca_file: str | None = None
    client_ca: str | None = None  # inline PEM
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    ciphers: str = GO_CIPHERS  # OpenSSL cipher string for TLS <= 1.2
    prefer_server_ciphers: bool = True
    groups: tuple[str, ...] = GO_CURVES  # key exchange groups, OpenSSL names, in order
    headers: Mapping[str, str] = field(default_factory=dict)
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    rate_interval: float = 0.0  # seconds between requests; 0 = no limit
    rate_burst: int = 0
    warnings: tuple[str, ...] = ()  # said once at start

    @property
    def tls(self) -> bool:
        return self.cert_file is not None or self.cert_pem is not None


def _section(data: Mapping[str, Any], name: str, allowed: set[str], key: str) -> dict[str, Any]:
    section = data.get(name) or {}
    if not isinstance(section, dict):
        raise ConfigError(key, f"{name} must be a mapping")
    unknown = sorted(str(k) for k in set(section) - allowed)  # keys of any YAML type
    if unknown:
        raise ConfigError(key, f"unknown key {name}.{unknown[0]}")
    return section


def _strings(key: str, name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(key, f"{name} must be a list of strings")
    return list(value)


@contextlib.contextmanager
def _pem_path(text: str) -> Iterator[str]:
    """A path OpenSSL can load ``text`` from (Python's ssl loads a chain only from a
    path), gone when the block ends: an anonymous memory file on Linux (no file system
    needed, so a read-only root file system is fine), else a private temporary file."""
    data = text.encode()
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("gpu-exporter-pem", os.MFD_CLOEXEC)
        try:
            with os.fdopen(os.dup(fd), "wb") as f:
                f.write(data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="gpu-exporter-tls-")
    path = os.path.join(directory, "pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.rmdir(directory)


def tls_context(web: WebConfig) -> ssl.SSLContext:
    """The server's SSLContext: certificate and key (from their files or inline), then
    versions, ciphers and client authentication (apply_tls)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with contextlib.ExitStack() as stack:
        cert = web.cert_file or stack.enter_context(_pem_path(web.cert_pem or ""))
        key = web.key_file or stack.enter_context(_pem_path(web.key_pem or ""))
        context.load_cert_chain(cert, key)
    apply_tls(context, web)
    return context


def _headers(key: str, headers: Any) -> dict[str, str]:
    if not isinstance(headers, dict):
        raise ConfigError(key, "http_server_config.headers must be a mapping")
    out = {}
    for name, value in headers.items():
        name, value = str(name), str(value)
        allowed = EXTRA_HEADERS.get(name)
        if allowed is None:
            raise ConfigError(key, f"http_server_config.headers: {name!r} can not be "
                                   f"configured (allowed: {', '.join(EXTRA_HEADERS)})")
        if allowed and value not in allowed:
            raise ConfigError(key, f"http_server_config.headers.{name}: one of "
                                   f"{', '.join(allowed)}, got {value!r}")
        if CONTROL_RE.search(value):
            raise ConfigError(key, f"http_server_config.headers.{name}: control characters "
                                   "(line breaks) are not allowed in a value")
        out[name] = value
    return out


def load_web_config(path: str, key: str = "web.config.file") -> WebConfig:
    data = load_yaml_mapping(key, path)
    unknown = sorted(str(k) for k in set(data) - TOP_KEYS)  # keys of any YAML type
    if unknown:
        raise ConfigError(key, f"unknown key {unknown[0]} in {path}")
    tls = _section(data, "tls_server_config", TLS_KEYS, key)
    http = _section(data, "http_server_config", HTTP_KEYS, key)
    rate = _section(data, "rate_limit", RATE_KEYS, key)
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError(key, "basic_auth_users must map user names to bcrypt hashes")

    base = os.path.dirname(os.path.abspath(path))  # relative paths are relative to the file

    def file_of(name: str) -> str | None:
        value = tls.get(name)
        if value is None:
            return None
        full = os.path.join(base, str(value))
        try:  # ssl opens it itself: a FIFO there would hold that open() for good
            untrusted_file.check(full, untrusted_file.PEM)
        except OSError as e:
            raise ConfigError(key, f"tls_server_config.{name}: {e}") from None
        return full

    for inline, file_key in (("cert", "cert_file"), ("key", "key_file"),
                             ("client_ca", "client_ca_file")):
        if tls.get(inline) and tls.get(file_key):
            raise ConfigError(key, f"tls_server_config: {inline} and {file_key} are exclusive")
    cert, key_file, ca = file_of("cert_file"), file_of("key_file"), file_of("client_ca_file")
    cert_pem = str(tls["cert"]) if tls.get("cert") else None
    key_pem = str(tls["key"]) if tls.get("key") else None
    if (cert is None and cert_pem is None) != (key_file is None and key_pem is None):
        raise ConfigError(key, "tls_server_config needs a certificate and its key "
                               "(cert_file or cert, key_file or key)")
    client_ca = str(tls["client_ca"]) if tls.get("client_ca") else None
    auth_type = str(tls.get("client_auth_type", "NoClientCert"))
    if auth_type not in CLIENT_AUTH:
        raise ConfigError(key, f"tls_server_config.client_auth_type: unknown {auth_type!r}")
    if auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and \
            ca is None and client_ca is None:
        raise ConfigError(key, f"client_auth_type {auth_type} needs client_ca_file")
    warnings: list[str] = []
    if auth_type in ("RequireAnyClientCert", "RequireClientCert"):
        # exporter-toolkit (Go) requires a certificate there and accepts any; Python's
        # ssl has no way to accept a certificate it cannot verify, so without a CA every
        # client would be turned away in its handshake, with nothing said.
        if ca is None and client_ca is None:
            raise ConfigError(key, f"client_auth_type {auth_type} (any client certificate, "
                                   "unverified) is not supported; give client_ca_file and "
                                   "use RequireAndVerifyClientCert")
        warnings.append(f"tls_server_config.client_auth_type {auth_type}: client "
                        "certificates are verified against the client CA (exporter-toolkit "
                        "accepts any)")
    sans = _strings(key, "tls_server_config.client_allowed_sans", tls.get("client_allowed_sans"))
    if sans and auth_type not in ("RequireAnyClientCert", "RequireClientCert",
                                  "RequireAndVerifyClientCert"):
        raise ConfigError(key, "client_allowed_sans needs client_auth_type "
                               "RequireAnyClientCert or RequireAndVerifyClientCert")
    for name in ("min_version", "max_version"):
        if name in tls and str(tls[name]) not in TLS_VERSIONS:
            raise ConfigError(key, f"tls_server_config.{name}: one of {', '.join(TLS_VERSIONS)}")
    min_version = str(tls.get("min_version", "TLS12"))
    max_version = str(tls.get("max_version", "TLS13"))
    if TLS_VERSIONS[min_version] > TLS_VERSIONS[max_version]:
        raise ConfigError(key, f"tls_server_config: min_version {min_version} is above "
                               f"max_version {max_version}")
    suites = _strings(key, "tls_server_config.cipher_suites", tls.get("cipher_suites"))
    for suite in suites:
        if suite not in CIPHER_SUITES:
            raise ConfigError(key, f"tls_server_config.cipher_suites: unknown {suite!r}")
    ciphers = ":".join(CIPHER_SUITES[s] for s in suites if CIPHER_SUITES[s]) or GO_CIPHERS
    curves = _strings(key, "tls_server_config.curve_preferences", tls.get("curve_preferences"))
    for curve in curves:
        if curve not in CURVES:
            raise ConfigError(key, f"tls_server_config.curve_preferences: unknown {curve!r}")
    groups = tuple(dict.fromkeys(CURVES[c] for c in curves)) or GO_CURVES
    if len(groups) > 1 and _groups_setter() is None:
        if curves:
            raise ConfigError(key, "tls_server_config.curve_preferences: this Python's ssl "
                                   "module sets one curve only; list one")
        warnings.append("tls_server_config: this Python's ssl module cannot set Go's "
                        "curves; OpenSSL's defaults are used")
    prefer = parse_bool(f"{key}: tls_server_config.prefer_server_cipher_suites",
                        tls.get("prefer_server_cipher_suites", True))
    if parse_bool(f"{key}: http_server_config.http2", http.get("http2", False)):
        warnings.append("http_server_config.http2: HTTP/2 is not supported; serving HTTP/1.1")

    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not BCRYPT_RE.match(str(hashed)):
            raise ConfigError(key, f"basic_auth_users.{user}: not a bcrypt hash")
        hashes[str(user)] = str(hashed).encode()
    headers = _headers(key, http.get("headers") or {})
    interval = 0.0
    burst = 0
    if rate:
        raw = rate.get("interval", 0)
        interval = 0.0 if raw in (0, "0", "0s") else parse_duration(
            f"{key}: rate_limit.interval", raw)
        try:
            burst = int(rate.get("burst", 1))
        except (TypeError, ValueError):
            raise ConfigError(key, "rate_limit.burst must be an integer") from None
        if interval and burst < 1:
            raise ConfigError(key, "rate_limit.burst must be at least 1")
    web = WebConfig(cert_file=cert, key_file=key_file, cert_pem=cert_pem, key_pem=key_pem,
                    client_ca_file=ca, client_ca=client_ca,
                    client_auth_type=auth_type, client_allowed_sans=tuple(sans),
                    min_version=min_version, max_version=max_version, ciphers=ciphers,
                    prefer_server_ciphers=prefer, groups=groups, headers=headers,
                    basic_auth_users=hashes, rate_interval=interval, rate_burst=burst,
                    warnings=tuple(warnings))
    if web.tls:
        # Load it all once now, so a bad certificate, key or CA is one line at start.
        try:
            tls_context(web)
        except (ssl.SSLError, OSError, ValueError) as e:
            raise ConfigError(key, f"tls_server_config: {e}") from None
    return web


def apply_tls(context: ssl.SSLContext, web: WebConfig) -> None:
    """Versions, ciphers and client authentication on a context holding the key."""
    context.minimum_version = TLS_VERSIONS[web.min_version]
    context.maximum_version = TLS_VERSIONS[web.max_version]
    context.verify_mode = CLIENT_AUTH[web.client_auth_type]
    if web.client_ca_file or web.client_ca:
        context.load_verify_locations(cafile=web.client_ca_file, cadata=web.client_ca)
    context.set_ciphers(web.ciphers)
    if web.prefer_server_ciphers:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    set_groups(context, web.groups)


@functools.cache
def _groups_setter() -> Callable[[ssl.SSLContext, bytes], bool] | None:
    """A function that sets an SSLContext's key exchange groups from OpenSSL's list
    syntax (``X25519:P-256``), or None where OpenSSL cannot be reached that way: CPython's
    SSLContext object holds its ``SSL_CTX *`` right after the object header, and the
    ``_ssl`` extension links the libssl whose ``SSL_CTX_ctrl`` takes it. Checked on a
    context first: ``SSL_CTX_get_options`` through the pointer must read what
    ``context.options`` reads."""
    try:
        import _ssl
        import ctypes

        lib = ctypes.CDLL(getattr(_ssl, "__file__", None))
        ctrl, get_options = lib.SSL_CTX_ctrl, lib.SSL_CTX_get_options
        clear = lib.ERR_clear_error
    except (ImportError, OSError, AttributeError):
        return None
    ctrl.restype, ctrl.argtypes = ctypes.c_long, [ctypes.c_void_p, ctypes.c_int,
                                                  ctypes.c_long, ctypes.c_char_p]
    get_options.restype, get_options.argtypes = ctypes.c_uint64, [ctypes.c_void_p]

    def pointer(context: ssl.SSLContext) -> int | None:
        ptr = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
        return ptr if ptr and get_options(ptr) == int(context.options) else None

    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    probe.options |= ssl.OP_NO_TICKET  # a value to recognise
    if sys.implementation.name != "cpython" or pointer(probe) is None:
        return None

    def setter(context: ssl.SSLContext, groups: bytes) -> bool:
        ptr = pointer(context)
        if ptr is not None and ctrl(ptr, SSL_CTRL_SET_GROUPS_LIST, 0, groups) == 1:
            return True
        clear()  # the error OpenSSL queued is not for the next ssl call to report
        return False

    return setter


def set_groups(context: ssl.SSLContext, groups: tuple[str, ...]) -> None:
    """The key exchange groups the server accepts, in order of preference (ValueError
    when they cannot be set: refused at start). Where OpenSSL's list cannot be reached,
    one group is set through ssl and Go's default list leaves OpenSSL's own."""
    setter = _groups_setter()
    if setter is not None:
        if not setter(context, ":".join(groups).encode()):
            raise ValueError(f"OpenSSL refused the curves {', '.join(groups)}")
    elif len(groups) == 1:
        context.set_ecdh_curve(SHORT_NAMES[groups[0]])
    elif groups != GO_CURVES:
        raise ValueError("this Python's ssl module sets one curve only")
