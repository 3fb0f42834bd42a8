"""``--web.config.file``: TLS and basic auth in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: /etc/gpu-exporter/tls.crt
      key_file: /etc/gpu-exporter/tls.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: /etc/gpu-exporter/ca.crt
      min_version: TLS12                             # TLS10..TLS13
    http_server_config:
      headers: {X-Frame-Options: deny}
    basic_auth_users:
      prometheus: $2b$12$...                        # bcrypt hash (htpasswd -nBC 12 user)

Unknown keys are errors (a typo must not silently switch TLS or auth off). Basic auth
is an ASGI middleware; the probe endpoints /-/healthy and /-/ready stay open so a
kubelet or Docker health check needs no password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import ssl
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from exporter.config import ConfigError, load_yaml_mapping

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version",
            "max_version"}
HTTP_KEYS = {"headers"}
OPEN_PATHS = frozenset({"/-/healthy", "/-/ready"})


@dataclass(frozen=True)
class WebConfig:
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    headers: Mapping[str, str] = field(default_factory=dict)
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.cert_file is not None


def _section(data: Mapping[str, Any], name: str, allowed: set[str], key: str) -> dict[str, Any]:
    section = data.get(name) or {}
    if not isinstance(section, dict):
        raise ConfigError(key, f"{name} must be a mapping")
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ConfigError(key, f"unknown key {name}.{unknown[0]}")
    return section


def load_web_config(path: str, key: str = "web.config.file") -> WebConfig:
    data = load_yaml_mapping(key, path)
    unknown = sorted(set(data) - {"tls_server_config", "http_server_config", "basic_auth_users"})
    if unknown:
        raise ConfigError(key, f"unknown key {unknown[0]} in {path}")
    tls = _section(data, "tls_server_config", TLS_KEYS, key)
    http = _section(data, "http_server_config", HTTP_KEYS, key)
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError(key, "basic_auth_users must map user names to bcrypt hashes")

    base = os.path.dirname(os.path.abspath(path))  # relative paths are relative to the file

    def file_of(name: str) -> str | None:
        value = tls.get(name)
        if value is None:
            return None
        full = os.path.join(base, str(value))
        if not os.path.isfile(full):
            raise ConfigError(key, f"tls_server_config.{name}: no such file {full}")
        return full

    cert, key_file, ca = file_of("cert_file"), file_of("key_file"), file_of("client_ca_file")
    if (cert is None) != (key_file is None):
        raise ConfigError(key, "tls_server_config needs both cert_file and key_file")
    auth_type = str(tls.get("client_auth_type", "NoClientCert"))
    if auth_type not in CLIENT_AUTH:
        raise ConfigError(key, f"tls_server_config.client_auth_type: unknown {auth_type!r}")
    if auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and ca is None:
        raise ConfigError(key, f"client_auth_type {auth_type} needs client_ca_file")
    for name in ("min_version", "max_version"):
        if name in tls and str(tls[name]) not in TLS_VERSIONS:
            raise ConfigError(key, f"tls_server_config.{name}: one of {', '.join(TLS_VERSIONS)}")
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        text = str(hashed)
        if not text.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(key, f"basic_auth_users.{user}: not a bcrypt hash")
        hashes[str(user)] = text.encode()
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise ConfigError(key, "http_server_config.headers must be a mapping")
    return WebConfig(cert_file=cert, key_file=key_file, client_ca_file=ca,
                     client_auth_type=auth_type,
                     min_version=str(tls.get("min_version", "TLS12")),
                     max_version=str(tls.get("max_version", "TLS13")),
                     headers={str(k): str(v) for k, v in headers.items()},
                     basic_auth_users=hashes)


def apply_tls(context: ssl.SSLContext, web: WebConfig) -> None:
    """Tighten the SSLContext uvicorn built from cert/key: versions and client auth."""
    context.minimum_version = TLS_VERSIONS[web.min_version]
    context.maximum_version = TLS_VERSIONS[web.max_version]
    context.verify_mode = CLIENT_AUTH[web.client_auth_type]
    if web.client_ca_file:
        context.load_verify_locations(cafile=web.client_ca_file)


class BasicAuthMiddleware:
    """401 unless the request carries a user/password that matches a bcrypt hash.

    bcrypt is slow on purpose (~100 ms); verified credentials are remembered (as a
    SHA-256 digest, never in clear) so a Prometheus scraping every few seconds does not
    pay it each time. The cache is bounded.
    """

    CACHE_SIZE = 64

    def __init__(self, app: ASGIApp, users: Mapping[str, bytes]) -> None:
        self.app = app
        self.users = dict(users)
        self._verified: OrderedDict[bytes, bool] = OrderedDict()

    def _check(self, header: bytes) -> bool:
        scheme, _, encoded = header.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        hashed = self.users.get(user.decode("utf-8", "replace"))
        if not sep or hashed is None:
            return False
        digest = hashlib.sha256(user + b"\0" + password + b"\0" + hashed).digest()
        if digest in self._verified:
            self._verified.move_to_end(digest)
            return self._verified[digest]
        import bcrypt  # only with basic auth configured

        ok = bcrypt.checkpw(password, hashed)
        self._verified[digest] = ok
        while len(self._verified) > self.CACHE_SIZE:
            self._verified.popitem(last=False)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"")
        if header and self._check(header):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"www-authenticate", b'Basic realm="gpu-exporter"'),
            (b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b"Unauthorized\n"})


class HeadersMiddleware:
    """Adds ``http_server_config.headers`` to every response."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str]) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
