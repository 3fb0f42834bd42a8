#!/usr/bin/env python3
"""Healthy TLS clients that open a new connection per request, many at once, with the
right basic-auth password: how many are reset, refused (429) or fail, and how many
sockets the daemon holds at its peak.

    python bench/tls_flood.py [--repo PATH] [--clients 200] [--requests 2000]
                              [--cost 10] [--processes 4] [--ab]

The daemon (no GPU, TLS and basic auth from a web config, a bcrypt hash of ``--cost``)
starts fresh, so the first requests all find the password unchecked. ``--clients``
threads (over ``--processes`` processes, so the clients are not one interpreter's GIL)
each send ``GET /metrics`` on a new TLS connection, read the answer and close, until
``--requests`` are done. Printed: answers by status, failures by kind (``reset``:
ECONNRESET or EPIPE, ``eof``: the server closed without an answer, ``tls``: a TLS
error, ``timeout``), the peak of the daemon's open sockets (sampled every 20 ms), the
daemon's ``gpu_exporter_http_connections_evicted_total`` and requests per second. With
``--ab``, the same load again from ApacheBench (``ab -c CLIENTS -n REQUESTS -A``;
Debian's apache2-utils), its failed and non-2xx counts and its errors.

``--repo`` runs another checkout's daemon (e.g. the code before a change) with the
same clients. Loopback only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import base64
import collections
import http.client
import multiprocessing
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
from flood import daemon, self_signed, wait_up  # noqa: E402

USER, PASSWORD = "prometheus", "s3cret"


def classify(error: BaseException) -> str:
    if isinstance(error, (ConnectionResetError, BrokenPipeError)):
        return "reset"
    if isinstance(error, (ssl.SSLEOFError, http.client.RemoteDisconnected,
                          http.client.IncompleteRead, ConnectionAbortedError)):
        return "eof"
    if isinstance(error, ssl.SSLError):
        return "tls"
    if isinstance(error, TimeoutError):
        return "timeout"
    return type(error).__name__


def one(port: int, context: ssl.SSLContext, auth: str) -> str:
    """One request on a new connection: its status, or the kind of failure."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": auth})
        response = conn.getresponse()
        response.read()
        return str(response.status)
    except (OSError, http.client.HTTPException) as e:
        return classify(e)
    finally:
        conn.close()


def client_process(port: int, cert: str, threads: int, left: Any,
                   out: multiprocessing.Queue[dict[str, int]]) -> None:
    """``threads`` clients until ``left`` (a shared int) runs out; their counts to ``out``."""
    context = ssl.create_default_context(cafile=cert)
    auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with left.get_lock():
                if left.value <= 0:
                    return
                left.value -= 1
            outcome = one(port, context, auth)
            with lock:
                counts[outcome] += 1

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(dict(counts))


def sockets_of(pid: int) -> int:
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    n += 1
            except OSError:
                pass
    except OSError:
        pass
    return n


class Peak(threading.Thread):
    """The most sockets ``pid`` held at once, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, sockets_of(self.pid))


def evicted(port: int, context: ssl.SSLContext) -> str:
    auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": auth})
        text = conn.getresponse().read().decode()
    except (OSError, http.client.HTTPException):
        return "?"
    finally:
        conn.close()
    found = re.findall(r'^gpu_exporter_http_connections_evicted_total\{state="(\w+)"\} (\S+)',
                       text, re.M)
    return ", ".join(f"{s} {float(v):.0f}" for s, v in found) or "not served"


def python_clients(port: int, cert: Path, clients: int, requests: int,
                   processes: int) -> tuple[collections.Counter[str], float]:
    left = multiprocessing.Value("i", requests)
    out: multiprocessing.Queue[dict[str, int]] = multiprocessing.Queue()
    per = [clients // processes + (i < clients % processes) for i in range(processes)]
    procs = [multiprocessing.Process(target=client_process,
                                     args=(port, str(cert), n, left, out)) for n in per]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    total: collections.Counter[str] = collections.Counter()
    for _ in procs:
        total.update(out.get(timeout=600))
    for p in procs:
        p.join(30)
    return total, time.monotonic() - t0


def ab(port: int, clients: int, requests: int) -> str:
    exe = shutil.which("ab")
    if exe is None:
        return "ab: not installed (apt-get install apache2-utils)"
    done = subprocess.run([exe, "-q", "-r", "-s", "30", "-n", str(requests), "-c", str(clients),
                           "-A", f"{USER}:{PASSWORD}", f"https://127.0.0.1:{port}/metrics"],
                          capture_output=True, text=True, timeout=900)
    lines = (done.stdout + done.stderr).splitlines()
    keep = [line.strip() for line in lines
            if re.match(r"(Complete requests|Failed requests|Non-2xx|Requests per second|"
                        r"\s+\(Connect)", line)]
    errors = collections.Counter(line.strip() for line in lines
                                 if re.match(r"(apr_|SSL (read|handshake|write))", line))
    keep += [f"{n} x {error}" for error, n in errors.most_common()]
    return "\n".join("  ab: " + line for line in keep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", type=Path, default=HERE)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--cost", type=int, default=10, help="bcrypt cost of the password hash")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--ab", action="store_true", help="also run ApacheBench")
    args = ap.parse_args()
    import bcrypt

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        cert, key = self_signed(tmp)
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=args.cost)).decode()
        web = tmp / "web.yml"
        web.write_text(f"tls_server_config: {{cert_file: {cert}, key_file: {key}}}\n"
                       f"basic_auth_users: {{{USER}: '{hashed}'}}\n")
        context = ssl.create_default_context(cafile=str(cert))
        runs = [("python", None)] + ([("ab", None)] if args.ab else [])
        for kind, _ in runs:
            with daemon(args.repo, tmp, web) as (proc, port, _log):
                wait_up(port, context)
                peak = Peak(proc.pid)
                peak.start()
                if kind == "python":
                    counts, seconds = python_clients(port, cert, args.clients, args.requests,
                                                     args.processes)
                    peak.done.set()
                    ok = counts.get("200", 0)
                    failed = {k: v for k, v in sorted(counts.items()) if k != "200"}
                    print(f"{args.repo.name or args.repo}: {args.clients} clients, "
                          f"{sum(counts.values())} requests in {seconds:.1f} s "
                          f"({sum(counts.values()) / seconds:.0f}/s): 200 {ok}, "
                          f"others {failed or 'none'}; resets {counts.get('reset', 0)}; "
                          f"peak sockets {peak.peak}; evicted {evicted(port, context)}")
                else:
                    report = ab(port, args.clients, args.requests)
                    peak.done.set()
                    print(f"{args.repo.name or args.repo} (ab): peak sockets {peak.peak}; "
                          f"evicted {evicted(port, context)}\n{report}")


if __name__ == "__main__":
    main()
