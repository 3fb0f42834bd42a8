"""The hub's device bookkeeping under hostile conditions: state-change logs and stale starts.

Real backends on committed machines (amdgpu sysfs + /proc fdinfo of the RX 7800 XT)
and the NVIDIA backend on FakeNVML's hang injection; values are checked in the rendered
exposition, parsed with prometheus-client.
"""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from exporter.backends import build_backends
from exporter.backends.nvidia.backend import NvidiaBackend
from exporter.collector import Hub
from exporter.config import Config
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
