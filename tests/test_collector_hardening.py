"""The hub's device bookkeeping under hostile conditions: state-change logs and stale starts.

Real backends on committed machines (amdgpu sysfs + /proc fdinfo of the RX 7800 XT)
and the NVIDIA backend on FakeNVML's hang injection; values are checked in the rendered
exposition, parsed with prometheus-client.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from exporter.backends import build_backends
from exporter.backends.nvidia.backend import NvidiaBackend
from exporter.collector import Hub
from exporter.config import COLLECTORS, Config
from exporter.kubernetes.backend import KubernetesBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML
from tests.test_collector import scrape, wait_for

FIXTURES = Path(__file__).parent / "fixtures"


def test_fdinfo_devices_do_not_log_gpu_gone_every_cycle() -> None:
    """The processes backend's (augmenting) device was compared as "old" with only the
    primary new ones: a ``gpu gone`` WARNING per cycle per card with DRM clients."""
    root = FIXTURES / "amd-rdna3-rx7800xt"
    config = Config(sysfs=str(root / "sys"), procfs=str(root / "proc"))
    backends = [b for b in build_backends(config) if b.name in ("amd", "processes")]
    assert sorted(b.name for b in backends) == ["amd", "processes"]
    hub = Hub(config, backends)
    with capture_logs() as logs:
        first = hub.collect_once()
        for _ in range(5):
            for b in backends:
                hub._sample(b, slow=False)
    # both backends report the card: the fdinfo one (not primary) carries its processes
    assert [s.last is not None and len(s.last.devices) for s in first.backends] == [1, 1]
    assert any(p for s in first.backends if s.last for d in s.last.devices for p in d.processes)
    gpu_lines = [(e["event"], e.get("device")) for e in logs if e["event"].startswith("gpu ")]
    assert gpu_lines == []  # no state changed after the first cycle
    warnings = [e for e in logs if e["log_level"] in ("warning", "error")]
    assert warnings == []
    hub.stop()


def test_a_backend_hanging_in_its_first_sample_shows_its_gpus_down() -> None:
    """The GPUs open() returned get ``gpu_up 0`` once the backend is stale, so an alert on
    ``gpu_up == 0`` fires; before, they had no series at all."""
    fake = FakeNVML([FakeGPU(index=0), FakeGPU(index=1)],
                    hang={"function": "nvmlDeviceGetPowerUsage", "after_seconds": 0})
    hub = Hub(Config(interval=0.05, stale_after=0.3), [NvidiaBackend(Config(), nvml=fake)])
    hub.start()
    try:
        wait_for(lambda: hub.snapshot.backends[0].stale)
        snapshot = hub.snapshot
        assert snapshot.backends[0].stale and snapshot.backends[0].last is None
        got = scrape(hub)
    finally:
        fake.release_hang()
        hub.stop()
    up = {dict(labels)["gpu"]: (dict(labels)["source"], value)
          for (name, labels), value in got.items() if name == "gpu_up"}
    assert up == {"0": ("nvml", 0.0), "1": ("nvml", 0.0)}
    assert got[("gpu_exporter_backend_up", frozenset({("backend", "nvidia")}))] == 0
    assert not [n for n, _ in got if n == "gpu_power_watts"]


@pytest.fixture
def garbage_socket(tmp_path: Path) -> Iterator[Path]:
    """A unix socket whose server answers every connection with random bytes."""
    path = tmp_path / "kubelet.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.sendall(os.urandom(64))  # a random first HTTP/2 frame type
                    conn.recv(4096)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield path
    stop.set()
    thread.join(2)
    server.close()


def test_a_garbage_kubelet_socket_logs_down_once(garbage_socket: Path) -> None:
    """grpc's text names the random frame type the peer sent: each retry was a new reason,
    so a new "backend down" line (1.2 lines/s at --kubernetes.interval 1s)."""
    config = Config(collectors={**COLLECTORS, "kubernetes": True},
                    kubernetes_pod_resources_socket=str(garbage_socket))
    backend = KubernetesBackend(config)
    hub = Hub(config, [backend])
    with capture_logs() as logs:
        for _ in range(6):
            assert hub._open(backend) is False
    downs = [e for e in logs if e["event"] == "backend down"]
    assert len(downs) == 1, downs
    reason = f"{garbage_socket}: unavailable: not a gRPC server (bad HTTP/2 frames)"
    assert downs[0]["reason"] == reason
    assert hub.snapshot.backends[0].reason == downs[0]["reason"]
    hub.stop()
