"""``top --prometheus`` names the fault of a server certificate it refuses, and the flag
that helps: before, a self-signed, an expired and a wrong-host certificate all read
``TLS: CERTIFICATE_VERIFY_FAILED``. Certificates made with ``cryptography``."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from exporter.client.fleet.promapi import HTTPClientConfig, PrometheusAPI, TLSConfig
from tests.test_fleet_client import OK, answering, serving

NOW = datetime.datetime.now(datetime.timezone.utc)
DAY = datetime.timedelta(days=1)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[str, object] | None,
          sans: list[x509.GeneralName], ca: bool, not_before: datetime.datetime,
          not_after: datetime.datetime) -> x509.Certificate:
    issuer_name, issuer_key = issuer or (subject, key)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(issuer_key, hashes.SHA256()))  # type: ignore[arg-type]


def _write(tmp: Path, name: str, cert: x509.Certificate,
           key: ec.EllipticCurvePrivateKey | None = None) -> Path:
    path = tmp / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        (tmp / f"{name}.key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return path


LOCAL = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]


def _server(tmp: Path, fault: str) -> tuple[ssl.SSLContext, Path | None]:
    """(the server's TLS context, the CA file a client is given, None: the system's)."""
    ca_key, key = _key(), _key()
    ca = _cert("test CA", ca_key, None, [x509.DNSName("ca.test")], True, NOW - DAY, NOW + DAY)
    ca_file: Path | None = _write(tmp, "ca", ca)
    issuer = ("test CA", ca_key)
    sans, before, after = LOCAL, NOW - DAY, NOW + DAY
    if fault == "self-signed":
        issuer, ca_file = None, None  # type: ignore[assignment]
    elif fault == "expired":
        before, after = NOW - 10 * DAY, NOW - DAY
    elif fault == "not yet valid":
        before, after = NOW + DAY, NOW + 10 * DAY
    elif fault == "wrong host":
        sans = [x509.DNSName("prometheus.other.example")]
    elif fault == "unknown CA":
        ca_file = None  # the system's CAs, which never signed the test CA
    leaf = _cert("prometheus", key, issuer, sans, False, before, after)
    _write(tmp, "leaf", leaf, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "leaf.crt", tmp / "leaf.key")
    return context, ca_file


@pytest.mark.parametrize("fault, said, flag", [
    ("self-signed", "is self-signed", "--tls.ca-file"),
    ("expired", "has expired", "--tls.insecure-skip-verify"),
    ("not yet valid", "is not valid yet", "clock"),
    ("wrong host", "is not for 127.0.0.1", "--tls.server-name"),
    ("unknown CA", "signed by a CA this machine does not trust", "--tls.ca-file"),
])
def test_the_certificate_fault_and_its_flag_are_named(tmp_path: Path, fault: str, said: str,
                                                      flag: str) -> None:
    context, ca_file = _server(tmp_path, fault)
    with serving(answering(OK), context) as s:
        tls = TLSConfig(ca_file=str(ca_file) if ca_file else "")
        answer = PrometheusAPI(s.url, HTTPClientConfig(tls_config=tls), timeout=5).query("up")
    assert answer.error is not None and said in answer.error and flag in answer.error, \
        answer.error
    assert "CERTIFICATE_VERIFY_FAILED" not in answer.error


def test_a_good_certificate_still_verifies(tmp_path: Path) -> None:
    context, ca_file = _server(tmp_path, "none")
    with serving(answering(OK), context) as s:
        answer = PrometheusAPI(s.url, HTTPClientConfig(
            tls_config=TLSConfig(ca_file=str(ca_file))), timeout=5).query("up")
    assert answer.ok, answer.error
