"""TLS as exporter-toolkit serves it, and TLS clients under load: the server's cipher
suites and curves against real OpenSSL clients, the alert a refused client certificate
gets, connection slots of clients that open a new connection per request, and the
password check that concurrent first requests share. In-process servers on loopback
(the daemon's own app, protocol factory and TLS context), bounded in time."""

from __future__ import annotations

import asyncio
import base64
import datetime
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
from structlog.testing import capture_logs

from exporter.core.config import Config, ConfigError
from exporter.core.logs import Every
from exporter.output.render import Renderer
from exporter.output.render.telemetry import Telemetry
from exporter.pipeline.hub import Hub
from exporter.serve import webconfig
from exporter.serve.middleware import OK, PasswordChecker
from exporter.serve.server import build_app
from exporter.serve.slots import IDLE, STALLED, UNPROVEN, Slots, peer_closed
from exporter.serve.webconfig import GO_CIPHERS, WebConfig, load_web_config, tls_context
from tests.test_server import _self_signed
from tests.test_server_auth_queue import count_checks
from tests.test_server_slow_readers import serving

# Go's crypto/tls default TLS 1.2 suites (cipher_suites.go's cipherSuitesPreferenceOrder
# less disabledCipherSuites, rsaKexCiphers, tdesCiphers), by the certificate's key type.
GO_TLS12 = {
    "ec": {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
           "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-ECDSA-AES128-SHA",
           "ECDHE-ECDSA-AES256-SHA"},
    "rsa": {"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-RSA-AES256-GCM-SHA384",
            "ECDHE-RSA-CHACHA20-POLY1305", "ECDHE-RSA-AES128-SHA", "ECDHE-RSA-AES256-SHA"},
}


def rsa_self_signed(tmp: Path) -> tuple[Path, Path]:
    """As bench.flood.self_signed, with an RSA key (the RSA suites need one)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    crt, pem = tmp / "rsa.crt", tmp / "rsa.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def web_config(tmp: Path, cert: Path, key: Path, extra: str = "") -> WebConfig:
    web = tmp / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n{extra}")
    return load_web_config(str(web))


@contextmanager
def tls_server(web: WebConfig, slots: Slots | None = None,
               renderer: Renderer | None = None) -> Iterator[tuple[int, Slots]]:
    """The daemon's app over TLS on a loopback port, in this process."""
    slots = slots or Slots(64)
    hub = Hub(Config(), [])
    renderer = renderer or Renderer()
    renderer.render_now(hub.collect_once())
    app = build_app(Config(), hub, renderer, web)
    with serving(app, slots, tls_context(web)) as served:
        yield served


def handshake(port: int, client: ssl.SSLContext) -> ssl.SSLSocket | None:
    """A finished handshake's socket, or None when the server refused it."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        return client.wrap_socket(raw)
    except (ssl.SSLError, OSError):
        raw.close()
        return None


def client_context(cafile: Path, maximum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
                   ) -> ssl.SSLContext:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.load_verify_locations(cafile=str(cafile))
    client.maximum_version = maximum
    return client


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ec", "rsa"])
def test_tls12_offers_gos_default_suites_only(tmp_path: Path, kind: str) -> None:
    """ECDHE-RSA-AES128-SHA256 and -AES256-SHA384 (CBC, LUCKY13) were accepted: Go's
    defaults, exporter-toolkit's, never offer them. Every TLS 1.2 suite this OpenSSL
    knows is offered alone; the server takes exactly Go's for its key type."""
    cert, key = _self_signed(tmp_path) if kind == "ec" else rsa_self_signed(tmp_path)
    every = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    every.set_ciphers("ALL:@SECLEVEL=0")
    # "protocol": the first version a suite exists in (TLSv1.0 for the CBC-SHA ones)
    suites = sorted({c["name"] for c in every.get_ciphers() if c["protocol"] != "TLSv1.3"})
    assert {"ECDHE-RSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA384"} <= set(suites)
    accepted = set()
    with tls_server(web_config(tmp_path, cert, key)) as (port, _):
        for suite in suites:
            client = client_context(cert, ssl.TLSVersion.TLSv1_2)
            client.set_ciphers(suite + ":@SECLEVEL=0")
            done = handshake(port, client)
            if done is not None:
                accepted.add(suite)
                done.close()
        tls13 = handshake(port, client_context(cert))
        assert tls13 is not None and tls13.version() == "TLSv1.3"
        tls13.close()
    assert accepted == GO_TLS12[kind]
    assert set(GO_CIPHERS.split(":")) == GO_TLS12["ec"] | GO_TLS12["rsa"]


def _accepted_groups(port: int, cert: Path) -> set[str]:
    accepted = set()
    for group in ("X25519", "X448", "prime256v1", "secp384r1", "secp521r1"):
        for maximum in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
            client = client_context(cert, maximum)
            client.set_ecdh_curve(group)  # the client offers this one group only
            done = handshake(port, client)
            if done is not None:
                accepted.add(f"{group}/{done.version()}")
                done.close()
    return accepted


def test_curve_preferences_are_honoured_and_the_default_is_gos(tmp_path: Path) -> None:
    """Two curve_preferences fell back to OpenSSL's defaults (X25519, X448 and P-521
    offered, one log line); with none, X448 was offered, which Go never does."""
    cert, key = _self_signed(tmp_path)
    two = web_config(tmp_path, cert, key, "  curve_preferences: [CurveP384, CurveP256]\n")
    assert two.groups == ("P-384", "P-256") and not two.warnings
    with tls_server(two) as (port, _):
        # (TLS 1.2 also needs the certificate's own curve, P-256, among the client's.)
        assert _accepted_groups(port, cert) == {
            "prime256v1/TLSv1.2", "prime256v1/TLSv1.3", "secp384r1/TLSv1.3"}
    with tls_server(web_config(tmp_path, cert, key)) as (port, _):
        accepted = _accepted_groups(port, cert)
    assert {g.split("/")[0] for g in accepted} == {"X25519", "prime256v1", "secp384r1",
                                                  "secp521r1"}


def test_several_curves_are_refused_at_start_where_ssl_cannot_set_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where OpenSSL's group list cannot be reached (not CPython, a libssl without
    SSL_CTX_ctrl), several curves are a configuration error (exit 2), one still works."""
    cert, key = _self_signed(tmp_path)
    monkeypatch.setattr(webconfig, "_groups_setter", lambda: None)
    with pytest.raises(ConfigError, match="sets one curve only"):
        web_config(tmp_path, cert, key, "  curve_preferences: [CurveP256, X25519]\n")
    one = web_config(tmp_path, cert, key, "  curve_preferences: [CurveP256]\n")
    with tls_server(one) as (port, _):
        assert {g.split("/")[0] for g in _accepted_groups(port, cert)} == {"prime256v1"}


def _alert_of(port: int, client: ssl.SSLContext) -> str:
    """What a client sees when it sends a request: the alert's reason, or EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with client.wrap_socket(raw) as tls:  # TLS 1.3: the client's side is done
                tls.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
                data = tls.recv(100)
                return "answered" if data else "EOF"
        except ssl.SSLError as e:
            return str(e.reason)
        except OSError as e:
            return type(e).__name__


def test_a_refused_client_certificate_gets_an_alert_and_one_log_line(tmp_path: Path) -> None:
    """Prometheus showed EOF and curl "Empty reply", and nothing was logged; Go's server
    sends "certificate required" / "bad certificate". OpenSSL's alerts: certificate
    required (TLS 1.3), handshake failure (TLS 1.2), unknown CA (another CA's)."""
    server_dir, ca_dir, other_dir = tmp_path / "server", tmp_path / "ca", tmp_path / "other"
    for d in (server_dir, ca_dir, other_dir):
        d.mkdir()
    cert, key = _self_signed(server_dir)
    client_cert, client_key = _self_signed(ca_dir)  # self-signed: the client CA itself
    other_cert, other_key = _self_signed(other_dir)
    web = web_config(tmp_path, cert, key, "  client_auth_type: RequireAndVerifyClientCert\n"
                     f"  client_ca_file: {client_cert}\n")
    slots = Slots(64)
    slots._refused = Every(0.5)  # a line per reason per half second here, not per minute
    good = client_context(cert)
    good.load_cert_chain(str(client_cert), str(client_key))
    foreign = client_context(cert)
    foreign.load_cert_chain(str(other_cert), str(other_key))
    with capture_logs() as logs, tls_server(web, slots) as (port, _):
        assert _alert_of(port, good) == "answered"
        seen = [_alert_of(port, client_context(cert)) for _ in range(3)]
        seen.append(_alert_of(port, client_context(cert, ssl.TLSVersion.TLSv1_2)))
        seen.append(_alert_of(port, foreign))
        time.sleep(0.6)
        seen.append(_alert_of(port, client_context(cert)))
    assert seen == ["TLSV13_ALERT_CERTIFICATE_REQUIRED"] * 3 + [
        "SSLV3_ALERT_HANDSHAKE_FAILURE", "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV13_ALERT_CERTIFICATE_REQUIRED"], seen
    lines = [(e["reason"], e["suppressed_since_last"]) for e in logs
             if e["event"] == "TLS handshake refused"]
    assert lines == [("PEER_DID_NOT_RETURN_A_CERTIFICATE", 0),
                     ("CERTIFICATE_VERIFY_FAILED", 0),
                     ("PEER_DID_NOT_RETURN_A_CERTIFICATE", 3)], lines


def _request(port: int, client: ssl.SSLContext, headers: dict[str, str]) -> str:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=20, context=client)
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        response.read()
        return str(response.status)
    except (OSError, http.client.HTTPException) as e:
        return type(e).__name__
    finally:
        conn.close()


@pytest.mark.slow
def test_clients_opening_a_connection_per_request_are_never_reset(tmp_path: Path) -> None:
    """200 such clients lost 6-12 % to resets: a finished connection kept its slot until
    asyncio had closed its socket, turns of the event loop later, so the slots filled
    and handshakes in progress were evicted. Here 24 clients, 24 slots: each client has
    one connection at a time, so nothing may ever be evicted."""
    cert, key = _self_signed(tmp_path)
    client = client_context(cert)
    outcomes: list[str] = []
    lock = threading.Lock()

    def one_client() -> None:
        for _ in range(15):
            got = _request(port, client, {})
            with lock:
                outcomes.append(got)

    with tls_server(web_config(tmp_path, cert, key), Slots(24)) as (port, slots):
        clients = [threading.Thread(target=one_client) for _ in range(24)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
    assert outcomes.count("200") == len(outcomes) == 24 * 15, \
        {o: outcomes.count(o) for o in set(outcomes)}
    assert slots.counts() == {STALLED: 0, UNPROVEN: 0, IDLE: 0}


def test_a_connection_its_client_has_closed_gives_its_slot_back_first() -> None:
    """The event loop behind: a client's end of file not read yet. Before a live
    connection is evicted, one whose client has closed (TCP CLOSE_WAIT) makes room,
    and no eviction is counted."""

    class Held:  # a connection's slot-side view: its TCP transport and evict()
        def __init__(self, sock: socket.socket) -> None:
            self.sock, self.evicted = sock, False
            self.raw = self

        def get_extra_info(self, name: str) -> socket.socket:
            return self.sock

        def evict(self) -> None:
            self.evicted = True

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        held = [Held(listener.accept()[0]) for _ in clients]
        slots = Slots(2)
        for h in held[:2]:
            assert slots.admit(h)  # type: ignore[arg-type]
        slots.mark(held[0], IDLE)  # type: ignore[arg-type]  # a good client, between requests
        clients[0].close()  # its client is gone; the server has not read the FIN
        deadline = time.monotonic() + 5
        while not peer_closed(held[0].raw):  # type: ignore[arg-type]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not peer_closed(held[1].raw)  # type: ignore[arg-type]
        assert slots.admit(held[2])  # type: ignore[arg-type]
        assert held[0].evicted and not held[1].evicted
        assert slots.counts() == {STALLED: 0, UNPROVEN: 0, IDLE: 0}
        assert slots.admit(Held(clients[1])) and held[1].evicted  # type: ignore[arg-type]
        assert slots.counts() == {STALLED: 0, UNPROVEN: 1, IDLE: 0}  # a real eviction
        for s in clients[1:] + [h.sock for h in held]:
            s.close()


def test_evictions_are_served_by_state(tmp_path: Path) -> None:
    """Evictions were silent: nothing logged or counted."""
    cert, key = _self_signed(tmp_path)
    slots = Slots(2)
    renderer = Renderer(telemetry=Telemetry(connections=slots.counts))
    client = client_context(cert)
    with capture_logs() as logs, tls_server(web_config(tmp_path, cert, key), slots,
                                            renderer) as (port, _):
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        time.sleep(0.3)  # both admitted, in their handshakes
        assert _request(port, client, {}) == "200"  # makes room: one handshake evicted
        renderer.render_now(renderer.current.snapshot)  # type: ignore[union-attr]
        body = renderer.current.body("text")  # type: ignore[union-attr]
        for s in silent:
            s.close()
    text = body.decode() if isinstance(body, bytes) else body[0].decode()
    assert 'gpu_exporter_http_connections_evicted_total{state="unproven"} 1.0' in text
    assert 'gpu_exporter_http_connections_evicted_total{state="idle"} 0.0' in text
    assert [e["state"] for e in logs if e["event"].startswith("connection closed to make")] \
        == ["unproven"]


def test_concurrent_first_requests_share_one_password_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A freshly started daemon answered 170 of 2,000 right-password requests with 429:
    one address's first requests all came before the first check ended, and each
    address has a line of two."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))
    checker = PasswordChecker({"prometheus": hashed})
    checked = count_checks(checker, monkeypatch)
    right = b"Basic " + base64.b64encode(b"prometheus:s3cret")
    wrong = b"Basic " + base64.b64encode(b"prometheus:guess")

    async def run() -> list[str]:
        return list(await asyncio.gather(
            *(checker.check(right, "10.0.0.1") for _ in range(50)),
            *(checker.check(wrong, "10.0.0.2") for _ in range(5))))

    results = asyncio.run(run())
    assert results == [OK] * 50 + ["failed"] * 5
    assert sorted(checked) == [b"guess", b"s3cret"]  # one bcrypt each


def test_a_shared_check_whose_clients_all_left_is_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Sharing keeps the rule that a check nobody waits for any more is not run."""
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4))
    checker = PasswordChecker({"prometheus": hashed})
    checked: list[bytes] = []
    release = threading.Event()

    def blocking(password: bytes, hashed: bytes) -> bool:
        checked.append(password)
        release.wait(5)
        return True

    monkeypatch.setattr(checker, "_bcrypt", blocking)
    first = b"Basic " + base64.b64encode(b"prometheus:one")
    second = b"Basic " + base64.b64encode(b"prometheus:two")

    async def run() -> None:
        busy = asyncio.ensure_future(checker.check(first, "10.0.0.1"))  # takes the worker
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(checker.check(second, "10.0.0.2")) for _ in range(3)]
        await asyncio.sleep(0.05)
        for task in queued:
            task.cancel()  # their clients hang up
        await asyncio.gather(*queued, return_exceptions=True)
        release.set()
        assert await busy == OK
        await asyncio.sleep(0.1)

    asyncio.run(run())
    assert checked == [b"one"]  # "two" was never checked
