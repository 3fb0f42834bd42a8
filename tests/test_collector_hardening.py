"""Hardening of the hub and of backends' bookkeeping: state-change logs, stale starts,
stable failure reasons, process identity.

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

from exporter.attribution.kubernetes.backend import KubernetesBackend
from exporter.core.config import Config
from exporter.pipeline.hub import Hub
from exporter.pipeline.registry import COLLECTORS, build_backends
from exporter.sources.base import Cycle
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML, FakeProcess
from tests.test_collector import scrape, wait_for

FIXTURES = Path(__file__).parent / "fixtures"


def test_fdinfo_devices_do_not_log_gpu_gone_every_cycle() -> None:
    """The processes backend's (augmenting) device was compared as "old" with only the
    primary new ones: a ``gpu gone`` WARNING per cycle per card with DRM clients."""
    root = FIXTURES / "amd-rdna3-rx7800xt"
    config = Config(sysfs=str(root / "sys"), procfs=str(root / "proc"))
    backends = [b for b in build_backends(config) if b.name in ("amd", "fdinfo")]
    assert sorted(b.name for b in backends) == ["amd", "fdinfo"]
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


def test_an_amd_backend_stale_before_its_first_sample_keeps_its_source() -> None:
    """Its GPU's ``gpu_up 0`` carries the source its samples would (``sysfs``, what the
    RX 7800 XT's first sample says below), not the backend's name: the series an alert
    watches is the one the first sample continues."""
    root = FIXTURES / "amd-rdna3-rx7800xt"
    config = Config(sysfs=str(root / "sys"), procfs=str(root / "proc"), interval=0.05,
                    stale_after=0.3)
    backend = next(b for b in build_backends(config) if b.name == "amd")
    release = threading.Event()
    real_sample = backend.sample

    def hang_first(slow: bool) -> Cycle:  # its first sample() never returns until released
        release.wait()
        return real_sample(slow)

    backend.sample = hang_first  # type: ignore[method-assign]
    hub = Hub(config, [backend])
    hub.start()
    try:
        wait_for(lambda: hub.snapshot.backends[0].stale)
        assert hub.snapshot.backends[0].last is None
        got = scrape(hub)
    finally:
        release.set()
        hub.stop()
    up = {dict(labels)["source"]: value for (name, labels), value in got.items()
          if name == "gpu_up"}
    assert up == {"sysfs": 0.0}
    # what a sample of this card says its source is, read independently of the hub
    once = Hub(config, [b for b in build_backends(config) if b.name == "amd"])
    sources = {d.source for _, d in once.collect_once().devices}
    once.stop()
    assert sources == {"sysfs"}


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


def a_process(proc: Path, pid: int, comm: str, start: int) -> None:
    """/proc/<pid> with ``comm``, ``statm`` and ``stat`` (``start``: field 22)."""
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "comm").write_text(comm + "\n")
    (d / "statm").write_text("900 100 10 5 0 300 0\n")
    (d / "stat").write_text(f"{pid} ({comm}) S {' '.join(['0'] * 18)} {start} 0 0\n")


def test_nvml_process_names_follow_a_reused_pid(tmp_path: Path) -> None:
    """The NVIDIA backend cached a pid's name for ever: a pid NVML kept listing while
    another process took it (the job restarted under a new name) kept the old name."""
    proc = tmp_path / "proc"
    a_process(proc, 4242, "python3", start=1000)
    fake = FakeNVML([FakeGPU(processes=[FakeProcess(pid=4242, used_memory_bytes=1 << 20)])])
    b = NvidiaBackend(Config(procfs=str(proc)), nvml=fake)
    b.open()

    def name(slow: bool) -> str:
        (d,) = b.sample(slow=slow).devices
        (p,) = d.processes
        return p.process

    assert name(slow=True) == "python3"
    a_process(proc, 4242, "vllm", start=2000)  # pid 4242 now belongs to another process
    assert name(slow=False) == "python3"  # identity is read on the slow tier
    assert name(slow=True) == "vllm"
    (proc / "4242" / "comm").write_text("renamed\n")  # same process (same start time)
    assert name(slow=True) == "vllm"  # read once per identity
    b.close()
