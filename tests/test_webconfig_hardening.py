"""The web config and the YAML files under hostile or careless input (issue 21):
response headers, inline PEM, YAML alias bombs, and the healthcheck on a TLS unix
socket. Each test failed before its fix."""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest

from exporter.app import healthcheck
from exporter.core.config import ConfigError, load_yaml_mapping
from exporter.serve.webconfig import load_web_config, tls_context
from tests.daemon import running
from tests.test_server import _self_signed, no_gpu_args, run_cli

# nine levels of nine aliases: 9^9 (387 million) strings from 540 bytes of YAML
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n"
    for p, n in zip("abcdefgh", "bcdefghi", strict=True))
DEEP = "a: " + "[" * 100_000 + "]" * 100_000 + "\n"


@pytest.mark.parametrize(("headers", "needle"), [
    ("{X-Frame-Options: \"deny\\r\\nX-Evil: 1\"}", "one of deny, sameorigin"),
    ("{Content-Security-Policy: \"default-src 'self'\\r\\nX-Evil: 1\"}", "control characters"),
    ("{Content-Length: '0'}", "'Content-Length' can not be configured"),
    ("{'X Frame Options': deny}", "'X Frame Options' can not be configured"),
    ("{X-Frame-Options: allow}", "one of deny, sameorigin"),
    ("{X-Content-Type-Options: sniff}", "one of nosniff"),
])
def test_response_headers_are_exporter_toolkits_allow_list(tmp_path: Path, headers: str,
                                                            needle: str) -> None:
    """21.4: a CRLF, Content-Length or a name with a space started fine, then every
    response failed with a traceback."""
    web = tmp_path / "web.yml"
    web.write_text(f"http_server_config:\n  headers: {headers}\n")
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        load_web_config(str(web))
    web.write_text("http_server_config:\n  headers:\n"
                   "    Strict-Transport-Security: max-age=31536000\n"
                   "    X-Content-Type-Options: nosniff\n    X-Frame-Options: sameorigin\n"
                   "    X-XSS-Protection: '1; mode=block'\n"
                   "    Content-Security-Policy: \"default-src 'self'\"\n")
    assert len(load_web_config(str(web)).headers) == 5


@pytest.mark.slow
def test_a_bad_header_exits_2_with_one_line(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  headers: {Content-Length: '0'}\n")
    result = run_cli("--web.config.file", str(web), *no_gpu_args(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "Content-Length" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_configured_headers_are_on_401_and_429(tmp_path: Path) -> None:
    """21.14: the headers were added inside basic auth and the rate limit."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users: {{prometheus: '{hashed}'}}\n"
                   "rate_limit: {interval: 1m, burst: 1}\n"
                   "http_server_config: {headers: {X-Frame-Options: deny}}\n")
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path) as d:
        first, second = d.get("/metrics"), d.get("/metrics")
        probe = d.get("/-/healthy")
    assert first.status_code == 401 and first.headers["x-frame-options"] == "deny"
    assert second.status_code == 429 and second.headers["x-frame-options"] == "deny"
    assert probe.status_code == 200 and probe.headers["x-frame-options"] == "deny"


def _inline_web(tmp_path: Path) -> Path:
    cert, key = _self_signed(tmp_path)
    indent = "\n      "
    web = tmp_path / "web-inline.yml"
    web.write_text("tls_server_config:\n"
                   f"    cert: |{indent}{indent.join(cert.read_text().splitlines())}\n"
                   f"    key: |{indent}{indent.join(key.read_text().splitlines())}\n")
    return web


@pytest.mark.slow
def test_inline_pem_is_never_left_in_a_temporary_directory(tmp_path: Path) -> None:
    """21.5: every start and every healthcheck left the key in a new
    /tmp/gpu-exporter-tls-*; without a writable temp dir start-up died."""
    web = _inline_web(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    old = tempfile.tempdir
    tempfile.tempdir = str(scratch)
    try:
        context = tls_context(load_web_config(str(web)))
    finally:
        tempfile.tempdir = old
    assert context.get_ca_certs() == [] and list(scratch.iterdir()) == []
    env = {"TMPDIR": str(scratch)}
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False, env=env) as d:
        https = d.base_url.replace("http://", "https://")
        assert _poll(lambda: httpx.get(https + "/-/healthy", verify=False, timeout=3)
                     .status_code == 200)
        assert list(scratch.iterdir()) == []


def _poll(ok: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ok():  # type: ignore[operator]
                return True
        except (httpx.TransportError, OSError):
            pass
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("text", [BOMB, DEEP], ids=["aliases", "depth"])
def test_yaml_alias_bombs_and_deep_nesting_are_refused(tmp_path: Path, text: str) -> None:
    """21.6: an 861-byte --config.file reached 2.2 GB; 100k-deep nesting gave a
    2996-line traceback."""
    path = tmp_path / "bomb.yml"
    path.write_text(text)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="is not valid YAML: (more than|nested deeper)"):
        load_yaml_mapping("config.file", str(path))
    assert time.monotonic() - t0 < 5
    for flag in ("--config.file", "--web.config.file"):
        result = run_cli(flag, str(path), *no_gpu_args(tmp_path))
        assert result.returncode == 2, result.stderr[-500:]
        assert "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_ordinary_aliases_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.yml"
    path.write_text("base: &base {interval: 2s}\ncollector: *base\nlist: [*base, *base]\n")
    data = load_yaml_mapping("config.file", str(path))
    assert data["collector"] == {"interval": "2s"} and len(data["list"]) == 2


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a unix socket path has at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="ge-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_the_healthcheck_speaks_tls_to_a_tls_unix_socket(tmp_path: Path,
                                                          short_dir: Path) -> None:
    """21.9: it spoke plain HTTP to a unix-socket listener that serves TLS."""
    cert, key = _self_signed(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    sock = short_dir / "s.sock"
    argv = ["--web.listen-address", f"unix:{sock}", "--web.config.file", str(web),
            *no_gpu_args(tmp_path)]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    with running(argv, tmp_path, ready=False):
        assert _poll(lambda: sock.exists(), 20)
        assert _poll(lambda: healthcheck.check(argv, environ) is None, 20), \
            healthcheck.check(argv, environ)


@pytest.mark.slow
def test_require_any_client_cert_without_a_ca_is_refused_at_start(tmp_path: Path) -> None:
    """27.8: RequireAnyClientCert without a CA started, then turned every client away in
    its handshake with nothing logged (exporter-toolkit accepts any certificate there;
    Python's ssl cannot accept one it cannot verify): now one line at start."""
    cert, key = _self_signed(tmp_path)
    web = tmp_path / "web.yml"
    for name in ("RequireAnyClientCert", "RequireClientCert"):
        web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                       f"  client_auth_type: {name}\n")
        with pytest.raises(ConfigError, match=f"client_auth_type {name} .*not supported"):
            load_web_config(str(web))
    result = run_cli("--web.config.file", str(web), *no_gpu_args(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "RequireAndVerifyClientCert" in lines[0], result.stderr


@pytest.mark.slow
def test_require_any_client_cert_with_a_ca_requires_a_certificate(tmp_path: Path) -> None:
    """27.8: with a CA, a client certificate is required (and verified against it)."""
    server_dir, client_dir = tmp_path / "server", tmp_path / "client"
    server_dir.mkdir()
    client_dir.mkdir()
    cert, key = _self_signed(server_dir)
    client_cert, client_key = _self_signed(client_dir)  # self-signed: its own CA
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"  client_auth_type: RequireAnyClientCert\n"
                   f"  client_ca_file: {client_cert}\n")
    assert any("verified against the client CA" in w for w in load_web_config(str(web)).warnings)
    with running([*no_gpu_args(tmp_path), "--web.config.file", str(web)], tmp_path,
                 ready=False) as d:
        url = d.base_url.replace("http://", "https://") + "/-/healthy"
        anonymous = ssl.create_default_context(cafile=str(cert))
        identified = ssl.create_default_context(cafile=str(cert))
        identified.load_cert_chain(str(client_cert), str(client_key))
        deadline = time.monotonic() + 20
        with_cert = 0
        while with_cert != 200 and time.monotonic() < deadline:
            try:
                with_cert = httpx.get(url, verify=identified, timeout=3).status_code
            except httpx.TransportError:
                time.sleep(0.2)
        with pytest.raises(httpx.TransportError):
            httpx.get(url, verify=anonymous, timeout=3)  # no client certificate
    assert with_cert == 200
