"""Slow readers: keep-alive connections that pipeline requests and never read the answers.

    python bench/slow_readers.py [--repo PATH] [--connections 260] [--seconds 30]
                                 [--path /metrics] [--tls] [--auth] [--gpus 8]

Starts the daemon of ``--repo`` (default: this checkout) on 127.0.0.1 with the fake
NVML generating ``--gpus`` GPUs, then opens ``--connections`` connections with a 4 KB
receive buffer; each sends pipelined ``GET --path`` requests as fast as the server
takes them and never reads a byte, for ``--seconds``, then all close. Meanwhile a
probe opens a new connection every 0.25 s for ``/-/healthy`` (``--probe-timeout``,
default 2 s). The readers run in a process of their own. Prints
the probes' success rate and latency p50/p99, the daemon's RSS before, at its highest
during, and 5 s after the flood, and the kernel's TCP memory (pages) at its highest.

``--repo`` runs another checkout (e.g. ``git archive fae41ea | tar -x -C /tmp/old``)
with the same clients, so the figures compare. Loopback only; bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import multiprocessing
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
from flood import basic, free_port, rss_and_fds, self_signed  # noqa: E402
from scrape_latency import FAKE_ONLY, fake_env, percentile, stop  # noqa: E402

RCVBUF = 4096


@contextlib.contextmanager
def daemon(repo: Path, tmp: Path, gpus: int, web: Path | None,
           extra: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """The daemon of ``repo`` with ``gpus`` fake GPUs (8 processes each) on a free port."""
    port = free_port()
    env = fake_env(repo, gpus, 8, tmp)
    log = tmp / f"daemon-{port}.log"
    args = [sys.executable, "-m", "exporter", "--web.listen-address", f"127.0.0.1:{port}",
            "--log.format", "json", *FAKE_ONLY, *extra]
    if web is not None:
        args += ["--web.config.file", str(web)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc, port, log
    finally:
        stop(proc)


def tcp_mem_pages() -> int:
    """Pages of TCP socket memory the kernel holds (/proc/net/sockstat ``mem``)."""
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                fields = line.split()
                return int(fields[fields.index("mem") + 1])
    return 0


def probe(port: int, context: ssl.SSLContext | None, timeout: float = 2.0) -> float | None:
    """Seconds one ``/-/healthy`` on a new connection took, None when it failed."""
    t0 = time.perf_counter()
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
        if context is not None else http.client.HTTPConnection("127.0.0.1", port,
                                                                timeout=timeout))
    try:
        conn.request("GET", "/-/healthy")
        resp = conn.getresponse()
        resp.read()
        return time.perf_counter() - t0 if resp.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


async def _reader(port: int, request: bytes, deadline: float,
                  context: ssl.SSLContext | None) -> int:
    """One slow reader: connects (again, when the server closes it) and pipelines
    ``request`` until ``deadline``; never reads. Returns how often it connected."""
    connects = 0
    while time.monotonic() < deadline:
        writer = None
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(
                sock, ("127.0.0.1", port)), 5)
            # limit: the client side stops reading once 8 KiB are buffered
            _r, writer = await asyncio.wait_for(asyncio.open_connection(
                sock=sock, ssl=context, server_hostname="localhost" if context else None,
                limit=RCVBUF), 5)
            connects += 1
            while time.monotonic() < deadline:
                writer.write(request * 8)
                await asyncio.wait_for(writer.drain(), max(0.1, deadline - time.monotonic()))
                if writer.is_closing():
                    break
        except (OSError, asyncio.TimeoutError, ssl.SSLError):
            await asyncio.sleep(0.05)
        finally:
            if writer is not None:
                writer.transport.abort()
    return connects


def _flood(port: int, connections: int, seconds: float, request: bytes, tls: bool,
           connects: Any) -> None:
    context = None
    if tls:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    deadline = time.monotonic() + seconds

    async def run() -> None:
        counts = await asyncio.gather(*(_reader(port, request, deadline, context)
                                        for _ in range(connections)))
        connects.value = sum(counts)

    asyncio.run(run())


def flood(port: int, connections: int, seconds: float, request: bytes,
          tls: bool) -> tuple[multiprocessing.Process, Any]:
    """The readers, in a process of their own (not competing with the probe for a GIL)."""
    connects = multiprocessing.Value("i", 0)
    process = multiprocessing.Process(target=_flood, daemon=True, args=(
        port, connections, seconds, request, tls, connects))
    process.start()
    return process, connects


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=HERE, help="checkout whose daemon to run")
    p.add_argument("--connections", type=int, default=260)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--path", default="/metrics", help="what the slow readers ask for")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--probe-timeout", type=float, default=2.0,
                   help="seconds a probe may take (default 2)")
    p.add_argument("--tls", action="store_true")
    p.add_argument("--auth", action="store_true",
                   help="basic auth on (the readers use the open --path /-/healthy then)")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    repo = args.repo.resolve()
    with tempfile.TemporaryDirectory(prefix="slow-readers-") as tmpdir:
        tmp = Path(tmpdir)
        web_lines = []
        context = None
        if args.tls:
            crt, key = self_signed(tmp)
            web_lines += ["tls_server_config:", f"  cert_file: {crt}", f"  key_file: {key}"]
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        headers = b""
        if args.auth:
            import bcrypt

            hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()
            web_lines += ["basic_auth_users:", f"  prometheus: '{hashed}'"]
            headers = b"Authorization: " + basic("prometheus", "s3cret")[
                "Authorization"].encode() + b"\r\n"
        web = None
        if web_lines:
            web = tmp / "web.yml"
            web.write_text("\n".join(web_lines) + "\n")
        request = (f"GET {args.path} HTTP/1.1\r\nHost: x\r\n".encode() + headers +
                   b"Accept-Encoding: identity\r\n\r\n")
        with daemon(repo, tmp, args.gpus, web) as (proc, port, log):
            deadline = time.monotonic() + 60
            while probe(port, context) is None:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("daemon did not come up:\n" + log.read_text()[-2000:])
                time.sleep(0.2)
            time.sleep(2)
            rss0, fds0 = rss_and_fds(proc.pid)
            mem0 = tcp_mem_pages()
            process, connects = flood(port, args.connections, args.seconds, request, args.tls)
            latencies: list[float] = []
            tries = 0
            rss_max, mem_max = rss0, mem0
            end = time.monotonic() + args.seconds
            time.sleep(min(5.0, args.seconds / 4))  # let the readers fill their buffers
            while time.monotonic() < end:
                tries += 1
                took = probe(port, context, args.probe_timeout)
                if took is not None:
                    latencies.append(took)
                rss_max = max(rss_max, rss_and_fds(proc.pid)[0])
                mem_max = max(mem_max, tcp_mem_pages())
                time.sleep(0.25)
            process.join(args.seconds + 30)
            time.sleep(5)
            rss_after, fds_after = rss_and_fds(proc.pid)
            after_ok = probe(port, context) is not None
            text = log.read_text(errors="replace")
    latencies.sort()
    p50 = percentile(latencies, 50) * 1e3 if latencies else float("nan")
    p99 = percentile(latencies, 99) * 1e3 if latencies else float("nan")
    print(f"daemon of {repo}: {args.gpus} GPUs, {args.connections} slow readers of "
          f"{args.path} x {args.seconds:g} s{' over TLS' if args.tls else ''}"
          f"{' with basic auth' if args.auth else ''}")
    print(f"probes ok      {len(latencies)}/{tries} ({100 * len(latencies) / max(1, tries):.0f} %)"
          f", latency p50 {p50:.1f} ms, p99 {p99:.1f} ms; probe after the flood "
          f"{'ok' if after_ok else 'FAILED'}")
    print(f"daemon RSS     before {rss0:.0f} MB, highest during {rss_max:.0f} MB, "
          f"5 s after {rss_after:.0f} MB; fds {fds0} -> {fds_after}")
    print(f"probe timeout  {args.probe_timeout:g} s; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print(f"kernel TCP mem before {mem0} pages, highest during {mem_max} pages "
          f"({mem_max * 4 / 1024:.0f} MiB); reader connects {connects.value}; "
          f"Traceback lines {text.count('Traceback')}")
    refused = [line for line in text.splitlines() if "connection refused" in line]
    print(f"refusal log lines {len(refused)}: {refused[:2]}")


if __name__ == "__main__":
    main()
