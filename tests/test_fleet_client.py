"""exporter.client.fleet.promapi: the Prometheus HTTP API client of the fleet reader.

The replies' shape follows Prometheus' API documentation (querying/api: the JSON envelope
``status``/``data``/``errorType``/``error``/``warnings``, ``resultType`` vector, matrix or
scalar, sample values as strings, 400/422/503 with an error body); the real server is
checked in tests/test_fleet_prometheus_e2e.py. Here a local HTTP server answers with
canned bytes, including replies a broken or hostile server could send: none of them
raises out of the client, each becomes an answer with its reason.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench.flood import self_signed
from exporter.client.fleet.nodes import Progress, load_fleet, load_node
from exporter.client.fleet.promapi import (
    Authorization,
    BasicAuth,
    ConfigError,
    HTTPClientConfig,
    PrometheusAPI,
    TLSConfig,
    http_config_from_mapping,
    load_http_config,
    parse_reply,
)
from exporter.core.secret import Secret


def vector(*series: tuple[dict[str, str], str]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": m, "value": [1700000000.5, v]} for m, v in series]}}).encode()


# ---------------------------------------------------------------- parsing


def test_a_vector_scalar_and_matrix_are_read() -> None:
    a = parse_reply("q", vector(({"instance": "n1"}, "0.25"), ({"instance": "n2"}, "1e3")))
    assert a.ok and [(s.labels["instance"], s.value) for s in a.series] == [("n1", 0.25),
                                                                            ("n2", 1000.0)]
    a = parse_reply("q", b'{"status":"success","data":{"resultType":"scalar",'
                         b'"result":[1700000000,"0.05"]}}')
    assert [s.value for s in a.series] == [0.05]
    a = parse_reply("q", json.dumps({"status": "success", "data": {
        "resultType": "matrix", "result": [{"metric": {"gpu": "0"}, "values": [
            [1700000000, "0.5"], [1700000060, "NaN"], [1700000120, "0.7"]]}]}}).encode())
    assert a.ranges[0].points == ((1700000000.0, 0.5), (1700000120.0, 0.7))
    assert a.dropped == 1  # NaN is no value


@pytest.mark.parametrize("body, error", [
    (b"<html>502 Bad Gateway</html>", "not JSON"),
    (b"[1, 2]", "not a Prometheus API reply"),
    (b'{"status":"error","errorType":"bad_data","error":"parse error at char 4"}',
     "bad_data: parse error at char 4"),
    (b'{"status":"error"}', "HTTP 200"),
    (b'{"status":"success"}', "no result"),
    (b'{"status":"success","data":{"resultType":"streams","result":[]}}',
     "unexpected result type streams"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # deeper than the parser recurses
])
def test_a_reply_that_is_not_an_answer_is_an_error_never_an_exception(body: bytes,
                                                                       error: str) -> None:
    a = parse_reply("q", body)
    assert not a.ok and a.series == ()
    assert error in (a.error or "")


def test_bad_series_are_dropped_and_counted_and_the_cap_holds() -> None:
    body = json.dumps({"status": "success", "warnings": ["too many samples", 7],
                       "data": {"resultType": "vector", "result": [
                           {"metric": {"a": "1"}, "value": [1, "1"]},
                           {"metric": {"a": 2}, "value": [1, "1"]},  # a label that is no str
                           {"metric": {"a": "3"}, "value": [1, 1]},  # a value that is no str
                           {"metric": {"a": "4"}, "value": [1, "+Inf"]},
                           {"metric": {"a": "5"}, "value": [1, "oops"]},
                           "not an object",
                           {"metric": {"a": "7"}, "value": [1, "7"]},
                           {"metric": {"a": "8"}, "value": [1, "8"]}]}}).encode()
    a = parse_reply("q", body, max_series=7)
    assert [s.labels["a"] for s in a.series] == ["1", "7"]
    assert a.dropped == 5 and a.truncated  # the eighth is past the cap
    assert a.warnings == ("too many samples",)


# ---------------------------------------------------------------- a local server


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    drip: float = 0.0  # seconds between chunks of 16 bytes
    stall: float = 0.0  # seconds before the body


Script = Callable[[BaseHTTPRequestHandler, dict[str, str]], Reply]


@dataclass
class Server:
    url: str
    seen: list[tuple[str, str, dict[str, str], dict[str, str]]]  # method, path, headers, form


@contextmanager
def serving(script: Script, tls: ssl.SSLContext | None = None) -> Iterator[Server]:
    seen: list[tuple[str, str, dict[str, str], dict[str, str]]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, form: dict[str, str]) -> None:
            seen.append((self.command, self.path.partition("?")[0], dict(self.headers), form))
            reply = script(self, form)
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            time.sleep(reply.stall)
            try:
                if not reply.drip:
                    self.wfile.write(reply.body)
                    return
                for i in range(0, len(reply.body), 16):
                    self.wfile.write(reply.body[i:i + 16])
                    self.wfile.flush()
                    time.sleep(reply.drip)
            except OSError:
                pass  # the client gave up

        def do_GET(self) -> None:  # noqa: N802
            query = urllib.parse.urlsplit(self.path).query
            self._answer(dict(urllib.parse.parse_qsl(query)))

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            self._answer(dict(urllib.parse.parse_qsl(self.rfile.read(length).decode())))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls else "http"
    try:
        yield Server(f"{scheme}://127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def answering(body: bytes, **kw: Any) -> Script:
    return lambda handler, form: Reply(body=body, **kw)


OK = vector(({"instance": "n1"}, "1"))


def test_a_query_is_a_form_post_with_limit_and_timeout_under_the_path_prefix() -> None:
    with serving(answering(OK)) as s:
        api = PrometheusAPI(s.url + "/prometheus/", timeout=7, max_series=500)
        a = api.query("up", at=1700000000.25)
        assert a.ok and a.series[0].value == 1.0 and a.seconds > 0
        r = api.query_range("up", 1700000000, 1700003600, 60)
    (m1, path1, headers, form), (_, path2, _, form2) = s.seen
    assert (m1, path1, path2) == ("POST", "/prometheus/api/v1/query",
                                  "/prometheus/api/v1/query_range")
    assert form == {"query": "up", "time": "1700000000.250", "limit": "501", "timeout": "7s"}
    assert form2["start"] == "1700000000.000" and form2["step"] == "60.000"
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert "Authorization" not in headers
    assert r.ok  # a vector where a matrix was expected is still read


def test_a_get_only_server_is_asked_again_with_get() -> None:
    def script(handler: BaseHTTPRequestHandler, form: dict[str, str]) -> Reply:
        return Reply(status=405) if handler.command == "POST" else Reply(body=OK)

    with serving(script) as s:
        a = PrometheusAPI(s.url).query("up")
    assert a.ok and [m for m, *_ in s.seen] == ["POST", "GET"]
    assert s.seen[1][3]["query"] == "up"


def test_basic_auth_from_the_url_and_bearer_tokens_read_at_each_request(tmp_path: Path) -> None:
    with serving(answering(OK)) as s:
        PrometheusAPI(s.url.replace("//", "//ops:p%40ss@")).query("up")
        token = tmp_path / "token"
        token.write_text("first\n")
        api = PrometheusAPI(s.url, HTTPClientConfig(
            authorization=Authorization(credentials_file=str(token))))
        api.query("up")
        token.write_text("second")  # rotated, as a projected service-account token is
        api.query("up")
        password = tmp_path / "password"
        password.write_text("  s3cret  \n")
        PrometheusAPI(s.url, HTTPClientConfig(
            basic_auth=BasicAuth("ops", password_file=str(password)))).query("up")
    auth = [h["Authorization"] for _, _, h, _ in s.seen]
    assert auth[0] == "Basic " + base64.b64encode(b"ops:p@ss").decode()
    assert auth[1:3] == ["Bearer first", "Bearer second"]
    assert auth[3] == "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert "p@ss" not in PrometheusAPI(s.url.replace("//", "//ops:p%40ss@")).display


def test_a_missing_secret_file_is_an_answer() -> None:
    api = PrometheusAPI("http://127.0.0.1:9", HTTPClientConfig(
        authorization=Authorization(credentials_file="/nonexistent/token")))
    a = api.query("up")
    assert a.error is not None and a.error.startswith("secret file:")


@pytest.mark.parametrize("reply, error", [
    (Reply(status=302, headers={"Location": "http://elsewhere/"}), "redirect (not followed"),
    (Reply(status=401), "HTTP 401"),
    (Reply(status=503, body=b'{"status":"error","errorType":"timeout",'
                            b'"error":"query timed out in expression evaluation"}'),
     "timeout: query timed out"),
    (Reply(status=502, body=b"upstream connect error"), "HTTP 502"),
    (Reply(status=500, body=OK), "HTTP 500"),  # a success body under an error status
    (Reply(body=b"x" * (2 << 20)), "reply larger than 1 MiB"),
    (Reply(body=gzip.compress(b" " * (64 << 20)), headers={"Content-Encoding": "gzip"}),
     "reply larger than 1 MiB"),  # 64 MiB of spaces in 64 KiB: the inflated size counts
    (Reply(body=b"\x1f\x8b not gzip", headers={"Content-Encoding": "gzip"}), "not valid gzip"),
    pytest.param(Reply(body=OK * 40, drip=0.05), "within 1 s",  # drips past the deadline
                 marks=pytest.mark.slow),
    pytest.param(Reply(body=OK, stall=3), "within 1 s", marks=pytest.mark.slow),  # says nothing
])
def test_a_broken_or_hostile_server_gives_an_error_never_an_exception(reply: Reply,
                                                                      error: str) -> None:
    with serving(lambda handler, form: reply) as s:
        started = time.monotonic()
        a = PrometheusAPI(s.url, timeout=1, max_bytes=1 << 20).query("up")
        took = time.monotonic() - started
    assert not a.ok and error in (a.error or ""), a.error
    assert a.series == ()
    assert took < 2.5  # the deadline bounds the whole exchange


def test_a_gzip_reply_is_read() -> None:
    with serving(answering(gzip.compress(OK), headers={"Content-Encoding": "gzip"})) as s:
        a = PrometheusAPI(s.url).query("up")
    assert a.ok and a.series[0].labels == {"instance": "n1"}
    assert s.seen[0][2]["Accept-Encoding"] == "gzip"


def test_nothing_listening_is_an_answer() -> None:
    a = PrometheusAPI("http://127.0.0.1:9", timeout=2).query("up")
    assert not a.ok and "127.0.0.1:9" in (a.error or "")


# ---------------------------------------------------------------- TLS


def _cert_for(tmp: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate valid for ``name`` only."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    crt, pem = tmp / f"{name}.crt", tmp / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def _server_tls(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def test_tls_verifies_against_the_ca_file_or_skips_only_when_told(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)  # localhost and 127.0.0.1
    with serving(answering(OK), _server_tls(cert, key)) as s:
        assert PrometheusAPI(s.url, HTTPClientConfig(
            tls_config=TLSConfig(ca_file=str(cert)))).query("up").ok
        unknown = PrometheusAPI(s.url, timeout=3).query("up")  # the system's CAs
        assert not unknown.ok and "TLS" in (unknown.error or "")
        assert PrometheusAPI(s.url, HTTPClientConfig(
            tls_config=TLSConfig(insecure_skip_verify=True))).query("up").ok


def test_server_name_is_the_name_verified(tmp_path: Path) -> None:
    cert, key = _cert_for(tmp_path, "prometheus.internal")
    with serving(answering(OK), _server_tls(cert, key)) as s:
        plain = PrometheusAPI(s.url, HTTPClientConfig(
            tls_config=TLSConfig(ca_file=str(cert)))).query("up")
        assert not plain.ok  # the certificate does not name 127.0.0.1
        named = PrometheusAPI(s.url, HTTPClientConfig(tls_config=TLSConfig(
            ca_file=str(cert), server_name="prometheus.internal"))).query("up")
        assert named.ok, named.error


def test_a_client_certificate_is_presented(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    client_crt, client_key = _cert_for(tmp_path, "gpu-exporter-top")
    with serving(answering(OK), _server_tls(cert, key, client_ca=client_crt)) as s:
        without = PrometheusAPI(s.url, HTTPClientConfig(
            tls_config=TLSConfig(ca_file=str(cert))), timeout=3).query("up")
        assert not without.ok
        with_cert = PrometheusAPI(s.url, HTTPClientConfig(tls_config=TLSConfig(
            ca_file=str(cert), cert_file=str(client_crt), key_file=str(client_key)))).query("up")
        assert with_cert.ok, with_cert.error


# ---------------------------------------------------------------- http_config


def test_prometheus_http_config_files_are_read(tmp_path: Path) -> None:
    path = tmp_path / "http.yml"
    path.write_text("basic_auth:\n  username: ops\n  password_file: /run/secrets/pw\n"
                    "tls_config:\n  ca_file: ca.crt\n  server_name: prom.internal\n"
                    "  insecure_skip_verify: false\n")
    config = load_http_config(path)
    assert config.basic_auth == BasicAuth("ops", password_file="/run/secrets/pw")
    assert config.tls_config == TLSConfig(ca_file="ca.crt", server_name="prom.internal")
    assert http_config_from_mapping({"bearer_token_file": "/t"}).authorization == \
        Authorization(credentials_file="/t")
    assert "s3cret" not in repr(http_config_from_mapping({"bearer_token": "s3cret"}))


@pytest.mark.parametrize("data, error", [
    ({"proxy_url": "http://proxy:3128"}, "not supported here: proxy_url"),
    ({"oauth2": {}}, "not supported here: oauth2"),
    ({"tls_config": {"min_version": "TLS13"}}, "tls_config: not supported here: min_version"),
    ({"basic_auth": {"username": "a", "password": "b", "password_file": "c"}},
     "password and password_file"),
    ({"basic_auth": {"username": "a"}, "bearer_token": "t"}, "at most one"),
    ({"authorization": {"credentials": "t"}, "bearer_token_file": "f"}, "at most one"),
    ({"tls_config": {"cert_file": "c"}}, "cert_file and key_file go together"),
    ({"tls_config": {"insecure_skip_verify": "yes"}}, "must be a bool"),
    ({"authorization": {"type": "Bearer token"}}, "one word"),
    (["basic_auth"], "must be a mapping"),
])
def test_an_http_config_we_cannot_honour_is_refused(data: Any, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        http_config_from_mapping(data)


def test_bad_urls_are_refused() -> None:
    for url in ("ftp://prom:9090", "http://", "http://prom:99999"):
        with pytest.raises(ValueError):
            PrometheusAPI(url)
    with pytest.raises(ConfigError, match="credentials in the URL"):
        PrometheusAPI("http://a:b@prom:9090", HTTPClientConfig(
            authorization=Authorization(credentials=Secret("t"))))


# ---------------------------------------------------------------- the fleet over it


def test_a_fleet_load_with_every_query_failing_is_no_data_and_errors() -> None:
    seen: list[Progress] = []

    def callback(p: Progress) -> None:
        seen.append(p)
        raise RuntimeError("a view's bug")  # never stops the load

    with serving(lambda h, f: Reply(status=503, body=b"overloaded")) as s:
        api = PrometheusAPI(s.url)
        fleet = load_fleet(api, progress=callback)
        node = load_node(api, "n1")
    assert fleet.nodes == () and fleet.series == 0
    assert len(fleet.errors) == len(seen) == seen[-1].total
    assert all("HTTP 503" in e for e in fleet.errors)
    assert sorted(p.done for p in seen) == list(range(1, seen[-1].total + 1))
    assert node.gpus == () and node.processes == () and node.errors


def test_a_node_that_only_some_queries_answer_has_no_data_for_the_rest() -> None:
    """Each value of a row is None where its query gave nothing: never 0."""
    def script(handler: BaseHTTPRequestHandler, form: dict[str, str]) -> Reply:
        q = form["query"]
        if q.startswith("count by (instance) (count by (instance, gpu) (gpu_up))"):
            return Reply(body=vector(({"instance": "n1"}, "8")))
        if q.startswith("sum by (instance) (gpu_power_watts)"):
            return Reply(body=vector(({"instance": "n1"}, "not a number")))
        return Reply(body=vector())

    with serving(script) as s:
        fleet = load_fleet(PrometheusAPI(s.url))
    (node,) = fleet.nodes
    assert node.node == "n1" and node.gpus == 8
    assert node.utilization is None and node.power_watts is None and node.health is None
    assert node.up is None and not node.waste.any
    assert fleet.errors == () and fleet.idle_threshold == 0.05


def test_nodes_sort_by_waste_then_down_then_name() -> None:
    from exporter.client.fleet.nodes import NodeSummary, Waste, sort_by_waste

    nodes = [NodeSummary("a", up=True), NodeSummary("b", up=False),
             NodeSummary("c", up=True, waste=Waste(idle_processes=3, idle_memory_bytes=1e9)),
             NodeSummary("d", up=True, waste=Waste(idle_gpus=1, idle_watts=60)),
             NodeSummary("e", up=True, waste=Waste(idle_gpus=1, idle_watts=90)),
             NodeSummary("f", up=True, waste=Waste(alerts=1))]
    assert [n.node for n in sort_by_waste(nodes)] == ["f", "e", "d", "c", "b", "a"]
