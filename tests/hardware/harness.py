"""The real daemon on the machine's GPUs, for the hardware tests: started from this
checkout with the flags a test gives, ready before the test runs, stopped after; and
the readers of its /metrics and of nvidia-smi that the tests compare with."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        body: bytes = r.read()
    return body.decode()


def scrape(port: int) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(get(port, "/metrics")):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    assert len(found) == 1, f"{name}{labels}: {len(found)} series"
    return found[0]


def smi(*args: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line]


@contextmanager
def exporter(*flags: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """The daemon with ``flags``, listening on a free loopback port (yielded) once it
    answers /-/ready; terminated on the way out."""
    port = free_port()
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.app.cli", "--web.listen-address", f"127.0.0.1:{port}",
         *flags], cwd=REPO, env={**os.environ, **(env or {}), "PYTHONPATH": path})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the exporter did not become ready") from None
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
