"""Two floods an unauthenticated client can aim at the daemon, and what gets through.

    python bench/flood.py [--repo PATH] [--seconds 20] [--connections 256]

(a) Basic auth (bcrypt cost 12) with ``--connections`` keep-alive connections that
    re-send a wrong password for ``--seconds``: how many ``/-/healthy`` probes and
    right-password scrapes, each on a new connection, succeed (two a second).
(b) TLS with 1000 silent TCP connections (never a ClientHello): the daemon's RSS and
    open file descriptors, and how many TLS probes answer; then the same with 1100
    connections under a 1024 file-descriptor limit, and the log lines about errors.

``--repo`` runs another checkout's daemon (e.g. the code before a change) with the
same clients, so the figures compare. Loopback only; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import http.client
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
from scrape_latency import stop  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def daemon(repo: Path, tmp: Path, web: Path, open_files: int | None = None
           ) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """The daemon of ``repo`` on a free loopback port, with no GPU and ``web``."""
    port = free_port()
    empty = tmp / "empty"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "tests" / "fakes" / "pynvml_shim"),
                                         str(repo)])
    env["FAKE_NVML_JSON"] = str(repo / "tests" / "fixtures" / "no-nvidia.json")
    log = tmp / f"daemon-{port}.log"

    def limit() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--web.listen-address", f"127.0.0.1:{port}",
             "--log.format", "json", "--path.sysfs", str(empty), "--path.procfs", str(empty),
             "--web.config.file", str(web)],
            cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit)
    try:
        yield proc, port, log
    finally:
        stop(proc)


def get(port: int, path: str, headers: dict[str, str] | None = None,
        context: ssl.SSLContext | None = None, timeout: float = 5.0) -> int:
    """Status of one GET on a new connection; 0 when it failed (reset, timeout)."""
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
        if context is not None else http.client.HTTPConnection("127.0.0.1", port,
                                                                timeout=timeout))
    try:
        conn.request("GET", path, headers=headers or {})
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def wait_up(port: int, context: ssl.SSLContext | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while get(port, "/-/healthy", context=context, timeout=2) != 200:
        if time.monotonic() > deadline:
            raise SystemExit("daemon did not come up")
        time.sleep(0.2)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def _keep_alive_guesser(port: int, deadline: float, request: bytes,
                              source: str | None = None) -> int:
    """Re-send ``request`` on one keep-alive connection until ``deadline``, reconnecting
    when the server closes it; returns the responses read. ``source``: the local
    address to connect from (any 127.0.0.x is one on Linux)."""
    answered = 0
    while time.monotonic() < deadline:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", port, local_addr=(source, 0) if source else None), 5)
            while time.monotonic() < deadline:
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                answered += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
            await asyncio.sleep(0.05)
        finally:
            if writer is not None:
                writer.close()
    return answered


def wrong_password_flood(port: int, connections: int, seconds: float,
                         sources: Sequence[str] = ()) -> threading.Thread:
    """The flood, started on a thread of its own; it stops by itself after ``seconds``.
    ``sources``: local addresses the connections come from, in turn (default: one)."""
    request = (b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: "
               + basic("prometheus", "wrong")["Authorization"].encode() + b"\r\n\r\n")
    deadline = time.monotonic() + seconds

    async def flood() -> None:
        await asyncio.gather(*(_keep_alive_guesser(
            port, deadline, request, sources[i % len(sources)] if sources else None)
            for i in range(connections)))

    thread = threading.Thread(target=asyncio.run, args=(flood(),), daemon=True)
    thread.start()
    return thread


def silent_connections(port: int, count: int) -> list[socket.socket]:
    """``count`` TCP connections that never send a byte (no TLS ClientHello)."""
    held = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        held.append(s)
    return held


def rss_and_fds(pid: int) -> tuple[float, int]:
    """(VmRSS in MB, open file descriptors) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A key and a certificate for ``localhost`` and 127.0.0.1, valid for a day, as
    tls.key / tls.crt in ``tmp`` (the tests' TLS daemons use it too)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                       x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(san, critical=False).sign(key, hashes.SHA256()))
    crt, pem = tmp / "tls.crt", tmp / "tls.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def auth_flood(repo: Path, tmp: Path, connections: int, seconds: float) -> None:
    import bcrypt

    web = tmp / "auth.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=12)).decode()
    web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    with daemon(repo, tmp, web) as (_proc, port, log):
        wait_up(port)
        right = basic("prometheus", "s3cret")
        get(port, "/metrics", right, timeout=10)  # Prometheus has scraped before
        flood = wrong_password_flood(port, connections, seconds)
        time.sleep(min(3.0, seconds / 4))  # let the flood fill the slots
        probes = scrapes = tries = 0
        end = time.monotonic() + seconds - min(3.0, seconds / 4)
        while time.monotonic() < end:
            tries += 1
            probes += get(port, "/-/healthy", timeout=5) == 200
            scrapes += get(port, "/metrics", right, timeout=10) == 200
            time.sleep(0.5)
        flood.join(40)
        lines = log.read_text(errors="replace").count("\n")
    print(f"(a) auth flood, {connections} keep-alive connections x {seconds:g} s, cost 12: "
          f"probes {probes}/{tries} ok, right-password scrapes {scrapes}/{tries} ok, "
          f"log lines {lines}")


def tls_flood(repo: Path, tmp: Path, count: int, open_files: int | None) -> None:
    crt, pem = self_signed(tmp)
    web = tmp / "tls.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {crt}\n  key_file: {pem}\n")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with daemon(repo, tmp, web, open_files) as (proc, port, log):
        wait_up(port, context)
        rss0, fds0 = rss_and_fds(proc.pid)
        held = silent_connections(port, count)
        try:
            time.sleep(3)
            rss1, fds1 = rss_and_fds(proc.pid)
            ok = sum(get(port, "/-/healthy", context=context, timeout=3) == 200
                     for _ in range(10))
            rss2, fds2 = rss_and_fds(proc.pid)
        finally:
            for s in held:
                s.close()
        time.sleep(1)
        text = log.read_text(errors="replace")
    limit = f", fd limit {open_files}" if open_files else ""
    print(f"(b) TLS, {count} silent TCP connections{limit}: RSS {rss0:.0f} -> {rss1:.0f} "
          f"-> {rss2:.0f} MB, fds {fds0} -> {fds1} -> {fds2}, TLS probes {ok}/10 ok, "
          f"EMFILE lines {text.count('Too many open files')}, "
          f"log lines {text.count(chr(10))}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=HERE, help="checkout whose daemon to run")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--connections", type=int, default=256)
    p.add_argument("--only", choices=("auth", "tls"), default=None)
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this side holds 1100 sockets
    print(f"daemon of {args.repo.resolve()}")
    with tempfile.TemporaryDirectory(prefix="flood-") as tmp:
        if args.only in (None, "auth"):
            auth_flood(args.repo.resolve(), Path(tmp), args.connections, args.seconds)
        if args.only in (None, "tls"):
            tls_flood(args.repo.resolve(), Path(tmp), 1000, None)
            tls_flood(args.repo.resolve(), Path(tmp), 1100, 1024)


if __name__ == "__main__":
    main()
