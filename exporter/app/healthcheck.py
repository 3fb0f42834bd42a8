"""The container image's HEALTHCHECK: GET ``/-/healthy`` where the running exporter listens.

``python -m exporter.app.healthcheck`` exits 0 when the exporter answers 200, 1 otherwise.
It reads the running exporter's arguments from ``/proc/1/cmdline`` (the image's
ENTRYPOINT is pid 1; behind ``docker run --init`` the arguments after the
``gpu-exporter`` word are still there) and resolves them with the exporter's own
configuration code, so a listen address or web config given on the command line, as
``GPU_EXPORTER_*`` or in ``--config.file`` is followed alike. The probe paths are exempt
from basic auth; with TLS the check speaks HTTPS without verifying the certificate (it
names the host, not 127.0.0.1); where the web config requires a client certificate the
check can only open a connection, so a TCP connect is what it tests.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import sys
from collections.abc import Mapping, Sequence

from exporter.app.flags import load_config
from exporter.client.fetch import UnixHTTPConnection
from exporter.core.config import ConfigError, split_listen_address

PROBE_PATH = "/-/healthy"
TIMEOUT_SECONDS = 4.0
CLIENT_CERT_REQUIRED = {"RequireAnyClientCert", "RequireAndVerifyClientCert"}


def exporter_args(cmdline: bytes) -> list[str]:
    """The flags of an exporter command line (NUL-separated, as in /proc/<pid>/cmdline).

    Everything after the ``gpu-exporter`` script (``python .../gpu-exporter`` when the
    kernel ran its shebang, ``docker-init -- gpu-exporter`` with ``--init``) or after
    ``-m exporter``; a leading ``snapshot`` command is dropped. No exporter word: none.
    """
    words = [w.decode("utf-8", "surrogateescape") for w in cmdline.split(b"\0") if w]
    for i, word in enumerate(words):
        if os.path.basename(word) == "gpu-exporter":
            rest = words[i + 1 :]
            break
        if word == "-m" and i + 1 < len(words) and words[i + 1] in ("exporter", "exporter.app.cli"):
            rest = words[i + 2 :]
            break
    else:
        return []
    return rest[1:] if rest[:1] == ["snapshot"] else rest


def _target(address: str) -> tuple[str, int]:
    host, port = split_listen_address(address)
    # A wildcard listener answers on loopback; a specific address only on itself.
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), port


def _connection(address: str, tls: bool) -> http.client.HTTPConnection:
    context = None
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if address.startswith("unix:"):
        return UnixHTTPConnection(address[len("unix:") :], TIMEOUT_SECONDS, context)
    host, port = _target(address)
    if context is None:
        return http.client.HTTPConnection(host, port, timeout=TIMEOUT_SECONDS)
    return http.client.HTTPSConnection(host, port, timeout=TIMEOUT_SECONDS, context=context)


def check(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """None when the exporter configured by ``argv``/``environ`` is healthy, else why not."""
    try:
        config = load_config(argv, environ)
        tls, client_cert = False, False
        if config.web_config_file is not None:
            from exporter.serve.webconfig import load_web_config

            web = load_web_config(config.web_config_file)
            tls, client_cert = web.tls, web.client_auth_type in CLIENT_CERT_REQUIRED
    except ConfigError as e:
        return f"configuration: {e}"
    address = config.listen_addresses[0]
    try:
        if client_cert and not address.startswith("unix:"):
            socket.create_connection(_target(address), TIMEOUT_SECONDS).close()
            return None
        conn = _connection(address, tls)
        try:
            conn.request("GET", PROBE_PATH)
            status = conn.getresponse().status
        finally:
            conn.close()
    except OSError as e:
        return f"{address}: {e}"
    return None if status == 200 else f"{address}{PROBE_PATH}: HTTP {status}"


def main(cmdline_path: str = "/proc/1/cmdline") -> int:
    try:
        with open(cmdline_path, "rb") as f:
            argv = exporter_args(f.read())
    except OSError:
        argv = []
    problem = check(argv, os.environ)
    if problem is None:
        return 0
    print(f"unhealthy: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
