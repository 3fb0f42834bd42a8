"""The one harness of the end-to-end tests: exporters on fixture machines, scraped every
second by a real Prometheus (the Debian package's binary) with the given rule files.

``scraped(...)`` yields the Prometheus API URL once every exporter is ready and
Prometheus has scraped each at least once; a test module's fixture waits for whatever
else it needs (rate() windows, pending alerts), then yields it.
``victoria_metrics(...)`` does the same with a second engine, VictoriaMetrics (the Debian
package's single-node binary, scraping the targets itself; it runs no rules), for the
readers that must answer from either.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"


@dataclass(frozen=True)
class Exporter:
    """One exporter to start: its flags (besides the listen address) and environment."""

    args: Sequence[str]
    env: Mapping[str, str]
    name: str = "exporter"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""


def wait_for(url: str, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if get(url)[0] == 200:
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:]
    pytest.fail(f"{log.stem} not ready at {url} (exit code {proc.poll()}):\n{tail}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def query(api: str, expr: str) -> list[dict[str, Any]]:
    status, body = get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert status == 200, (expr, body[:500])
    data = json.loads(body)
    assert data["status"] == "success", (expr, data)
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


@contextmanager
def scraped(tmp: Path, exporters: Sequence[Exporter], rule_files: Sequence[Path],
            job: str = "gpu-exporter") -> Iterator[str]:
    """Start the exporters and Prometheus; yield the API URL; stop them all."""
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        targets = []
        for e in exporters:
            port = free_port()
            log = (tmp / f"{e.name}.log").open("wb")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "exporter.app.cli", "--web.listen-address",
                 f"127.0.0.1:{port}", *e.args],
                cwd=ROOT, env=dict(e.env), stdout=log, stderr=subprocess.STDOUT))
            wait_for(f"http://127.0.0.1:{port}/-/ready", 30, procs[-1], tmp / f"{e.name}.log")
            targets.append(f"127.0.0.1:{port}")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(r) for r in rule_files],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom_port = free_port()
        with (tmp / "prometheus.log").open("wb") as prom_log:
            procs.append(subprocess.Popen(
                [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=prom_log, stderr=subprocess.STDOUT))
        api = f"http://127.0.0.1:{prom_port}"
        wait_for(f"{api}/-/ready", 30, procs[-1], tmp / "prometheus.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(query(api, "up == 1")) < len(exporters):
            time.sleep(0.5)
        yield api
    finally:
        for proc in reversed(procs):
            stop(proc)
        for log in logs:
            log.close()


@contextmanager
def victoria_metrics(tmp: Path, targets: Sequence[str], job: str = "gpu-exporter") -> Iterator[str]:
    """VictoriaMetrics scraping ``targets`` (host:port) every second as ``job``; yield its
    Prometheus-compatible API URL once it has scraped each, and stop it.

    ``-search.latencyOffset=1s``: by default it hides the last 30 s of samples from
    queries (data still arriving); a second is the scrape interval here."""
    config = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}]}
    (tmp / "victoria-metrics.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (tmp / "victoria-metrics.log").open("wb") as log:
        proc = subprocess.Popen(
            [VICTORIA_METRICS, f"-httpListenAddr=127.0.0.1:{port}",
             f"-storageDataPath={tmp / 'victoria-metrics-data'}",
             f"-promscrape.config={tmp / 'victoria-metrics.yml'}",
             "-search.latencyOffset=1s", "-retentionPeriod=1d", "-loggerLevel=WARN"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        api = f"http://127.0.0.1:{port}"
        wait_for(f"{api}/health", 30, proc, tmp / "victoria-metrics.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(query(api, "up == 1")) < len(targets):
            time.sleep(0.5)
        yield api
    finally:
        stop(proc)
