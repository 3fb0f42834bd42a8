"""OTLP as a projection of the typed snapshot: the merged view's series go through the
catalogue's specs into OTLP points directly (exporter.output.otlp.project), and say what the
Prometheus families of the same snapshot say, point for point."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.app.daemon import Daemon
from exporter.app.flags import load_config
from exporter.core.config import Config
from exporter.core.fieldspec import Kind
from exporter.core.model import DeviceInfo, DeviceSample
from exporter.output.render import RenderOptions, device_families
from exporter.output.render.selection import Selection
from exporter.pipeline.hub import Hub
from exporter.sources.base import PLAIN
from tests.daemon import FIXTURES, machine_args
from tests.test_otlp_names import need

need("opentelemetry.sdk")
from exporter.output.otlp import project, to_otlp  # noqa: E402


def _flat(metrics: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for m in metrics:
        data = m.data
        points = sorted((tuple(sorted((k, str(v)) for k, v in p.attributes.items())), p.value)
                        for p in data.data_points)
        out.append((m.name, m.unit, m.description, type(data).__name__,
                    getattr(data, "is_monotonic", None), points))
    return out


def _snapshot(machine: str) -> Any:
    config = load_config([*machine_args(FIXTURES / machine), "--no-collector.nvidia"], {})
    daemon = Daemon(config)
    return daemon.collect_once()


@pytest.mark.parametrize("machine", ["amd-rdna3-rx7800xt", "amd-mi300x", "intel-xe-b580",
                                     "amd-apu-phoenix"])
@pytest.mark.parametrize("selection", [Selection(), Selection(exclude="gpu_power_watts|"
                                                              "gpu_process_.*")])
def test_the_projection_says_what_the_families_say(machine: str, selection: Selection) -> None:
    snapshot = _snapshot(machine)
    options = RenderOptions(selection=selection)
    projected = project(snapshot, options, 1, 2)
    converted = to_otlp(device_families(snapshot, options), 1, 2)
    assert _flat(projected) == _flat(converted)
    names = {m.name for m in projected}
    assert "hw.status" in names and "gpu.info" in names
    if not selection.everything:
        assert "hw.power" not in names and not any(n.startswith("process.") for n in names)


def test_counters_are_monotonic_sums_of_their_spec_and_health_is_projected() -> None:
    """No _total stripped and added back: the spec's type gives the point kind."""
    from exporter.output.render.families import DEVICE_SPECS

    snapshot = _snapshot("amd-rdna3-rx7800xt")
    by_name = {m.name: m for m in project(snapshot, RenderOptions(), 1, 2)}
    counters = [s for _, s in DEVICE_SPECS if s.kind is Kind.COUNTER and s.otlp is not None
                and not s.per_key]
    served = [s for s in counters if s.otlp is not None and s.otlp.name in by_name]
    assert served, "the fixture serves no counter"
    for spec in served:
        assert spec.otlp is not None
        data = by_name[spec.otlp.name].data
        assert type(data).__name__ == "Sum" and data.is_monotonic, spec.name
    [status] = by_name["gpu.health.status"].data.data_points
    assert status.attributes["gpu.source"] == "health" and status.value in (0.0, 1.0, 2.0)


def test_a_gpu_down_projects_its_info_and_status_only() -> None:
    class Down:
        name, source, interval, priority = "amd", "sysfs", None, 0
        capabilities = PLAIN

        def open(self) -> list[DeviceInfo]:
            return []

        def sample(self, slow: bool) -> Any:
            from exporter.sources.base import Cycle

            return Cycle([DeviceSample(info=DeviceInfo(vendor="amd", pci_bus_id="0000:03:00.0",
                                                       uuid="pci-0000:03:00.0"),
                                       source="sysfs", up=False, power_watts=5.0)])

        def close(self) -> None:
            pass

    snapshot = Hub(Config(), [Down()]).collect_once()
    by_name = {m.name: m for m in project(snapshot, RenderOptions(), 1, 2)}
    [point] = by_name["hw.status"].data.data_points
    assert point.value == 0.0 and point.attributes["gpu.source"] == "sysfs"
    assert "hw.power" not in by_name


class _Busy:
    """One NVIDIA GPU with its encoder, decoder and graphics engines busy."""

    name, source, interval, priority = "nvidia", "nvml", None, 0

    def open(self) -> list[DeviceInfo]:
        return []

    def sample(self, slow: bool) -> Any:
        from exporter.sources.base import Cycle

        return Cycle([DeviceSample(
            info=DeviceInfo(vendor="nvidia", pci_bus_id="0000:18:00.0", uuid="GPU-1"),
            source="nvml", utilization_ratio=0.5,
            engine_utilization_ratio={"encoder": 0.25, "decoder": 0.125, "gfx": 0.75})])

    def close(self) -> None:
        pass


@pytest.mark.parametrize("selection", [Selection(), Selection(exclude="gpu_utilization_ratio")])
def test_encoder_and_decoder_use_is_the_conventions_gpu_utilization_by_task(
        selection: Selection) -> None:
    snapshot = Hub(Config(), [_Busy()]).collect_once()
    options = RenderOptions(selection=selection)
    projected = project(snapshot, options, 1, 2)
    assert _flat(projected) == _flat(to_otlp(device_families(snapshot, options), 1, 2))
    by_name = {m.name: m for m in projected}
    assert len(by_name) == len(projected)  # one metric per name
    tasks = {p.attributes.get("hw.gpu.task"): p.value
             for p in by_name["hw.gpu.utilization"].data.data_points}
    want = {"encoder": 0.25, "decoder": 0.125}
    assert tasks == (want if selection.exclude else {**want, "general": 0.5})
    assert all("gpu.engine" not in p.attributes
               for p in by_name["hw.gpu.utilization"].data.data_points)
    engines = {p.attributes["gpu.engine"]: p.value
               for p in by_name["gpu.engine.utilization"].data.data_points}
    assert engines == {"gfx": 0.75}
