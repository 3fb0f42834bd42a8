"""The live view's tables, from one snapshot: every whole GPU (``device_view``: its
identity, state, current values, hottest sensor with its limit and heat, health verdict
and the page's table text), every backend (``backend_view``), each GPU's processes
(``top_processes``) and the OTLP pusher's state: exporter.serve.view's classes, the one
function for each that the page's server render and ``/api/v1/history`` (through
exporter.serve.history) share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.core.labels import Clock, Direction, Engine, HealthStatus, Sensor
from exporter.core.model import DeviceSample, ProcessSample
from exporter.pipeline.health import Verdict
from exporter.pipeline.state import BackendState, Snapshot
from exporter.serve import view
from exporter.serve.view import NO_DATA, Heat, State

TOP_PROCESSES = 5  # the rows of a GPU's "Top processes" table on the page
STATUS = tuple(HealthStatus)  # by Verdict.status (gpu_health_status's value)
# Where two sensors read the same, the one named first (die, edge, package) is shown.
TEMPERATURE_SENSORS = (Sensor.GPU, Sensor.EDGE, Sensor.PACKAGE, Sensor.JUNCTION,
                       Sensor.MEMORY, Sensor.VRAM)
# The limit a temperature is drawn and judged against, the first a GPU has: the hottest
# sensor's own (amdgpu hwmon's crit), else the GPU's: the one where the GPU starts to slow
# itself down, which the health verdict counts as degraded (docs/health.md), before the
# one where it shuts down. NVIDIA's memory sensor has a limit of its own.
CRITICAL_THRESHOLDS = ("critical", "slowdown", "shutdown", "max_operating")
SENSOR_THRESHOLDS: dict[str, str] = {Sensor.MEMORY: "memory_max_operating"}
GIB = float(1 << 30)


def hottest(d: DeviceSample) -> tuple[str, float] | None:
    """(sensor, °C) of the GPU's hottest sensor (the one its health and Grafana watch)."""
    temps = d.temperatures_celsius
    if not temps:
        return None
    order: dict[str, int] = {s: i for i, s in enumerate(TEMPERATURE_SENSORS)}
    sensor = min(temps, key=lambda s: (-float(temps[s]), order.get(s, len(order)), s))
    return str(sensor), float(temps[sensor])
def temperature(d: DeviceSample) -> float | None:
    """The hottest sensor's temperature: what the page's chart and table show."""
    hot = hottest(d)
    return None if hot is None else hot[1]


def critical(d: DeviceSample, sensor: str) -> float | None:
    """The temperature at which ``sensor`` is critical: its own limit where the source
    reads one per sensor (amdgpu hwmon), else the GPU's threshold."""
    for name in CRITICAL_THRESHOLDS:
        limit = d.temperature_limits_celsius.get((sensor, name))
        if limit is not None:
            return float(limit)
    thresholds = d.temperature_thresholds_celsius
    own = SENSOR_THRESHOLDS.get(sensor)
    if own is not None and own in thresholds:
        return float(thresholds[own])
    return next((float(thresholds[n]) for n in CRITICAL_THRESHOLDS if n in thresholds), None)


def heat(celsius: float | None, limit: float | None) -> Heat | None:
    """cool / warm / hot / critical: a share of the critical limit (below 60 %, 85 %,
    100 %, at or above it), or with no known limit 50 / 75 °C and above."""
    if celsius is None:
        return None
    if limit:
        share = celsius / limit
        return (Heat.COOL if share < 0.6 else Heat.WARM if share < 0.85 else
                Heat.HOT if share < 1.0 else Heat.CRITICAL)
    return Heat.COOL if celsius < 50 else Heat.WARM if celsius < 75 else Heat.HOT


def memory_ratio(d: DeviceSample) -> float | None:
    if d.memory_used_bytes is None or not d.memory_total_bytes:
        return None
    return min(1.0, max(0.0, d.memory_used_bytes / d.memory_total_bytes))


def process_row(p: ProcessSample) -> view.Process:
    engines = {str(k): float(v) for k, v in p.utilization_ratio.items()}
    return view.Process(
        pid=p.pid, process=p.process, memory_bytes=p.memory_used_bytes,
        pod=f"{p.namespace}/{p.pod}" if p.pod else "", container=p.container or "",
        utilization=max(engines.values(), default=None), user=p.user or "",
        command=p.command or "", shared_memory_bytes=p.shared_memory_used_bytes,
        engines=engines)


def top_processes(d: DeviceSample, limit: int = view.MAX_ROWS) -> view.Processes:
    """The ``limit`` processes using the most memory, largest first (pid, name, user,
    command line, memory, shared memory, engine shares, pod as namespace/pod, container),
    and how many more there are. The one ranking behind the server render, the JSON and
    ``gpu-exporter top``."""
    ranked = sorted(d.processes, key=lambda p: (-(p.memory_used_bytes or 0), p.pid))
    rows = tuple(process_row(p) for p in ranked[:limit])
    return view.Processes(rows, len(d.processes) - len(rows))


def _fmt(value: float | None, unit: str, digits: int = 0) -> str:
    return NO_DATA if value is None else f"{value:.{digits}f} {unit}"


def _pct(ratio: float | None) -> str:
    return NO_DATA if ratio is None else f"{100 * ratio:.0f} %"


def device_view(d: DeviceSample, health: Verdict | None, stale: bool, gpu: str) -> view.Device:
    """One whole GPU as the page's tables and ``gpu-exporter top`` show it: identity,
    state (up, down, stale), the current values (None: never reported, never 0), the
    hottest sensor with its critical limit and heat, the health verdict with its
    reasons, and ``cells``, the page's table text, so the server render and the page's
    refresh write the same words."""
    hot = hottest(d)
    engines = d.engine_utilization_ratio
    clocks = d.clocks_hertz
    fans = list(d.fan_speed_ratio.values())
    state = State.STALE if stale else State.DOWN if not d.up else State.UP  # stale: unknown
    status = STATUS[health.status] if health is not None else None
    reasons = tuple(view.Reason(str(f.check), STATUS[f.status], f.reason)
                    for f in health.findings) if health is not None else ()
    used, total = d.memory_used_bytes, d.memory_total_bytes
    free = d.memory_free_bytes
    if free is None and used is not None and total:
        free = max(0.0, total - used)
    mem = memory_ratio(d)
    memory_text = NO_DATA if used is None else (
        f"{used / GIB:.1f} / {(total or 0) / GIB:.1f} GiB"
        + ("" if mem is None else f" ({100 * mem:.0f} %)"))
    temperature = None
    temp_text = NO_DATA
    if hot is not None:
        sensor, celsius = hot
        limit = critical(d, sensor)
        temperature = view.Temperature(sensor, celsius, limit, heat(celsius, limit))
        temp_text = f"{celsius:.0f} °C {sensor}" + (
            "" if limit is None else f" (critical {limit:.0f})")
    power_text = _fmt(d.power_watts, "W") + (
        "" if d.power_limit_watts is None or d.power_watts is None
        else f" / {d.power_limit_watts:.0f} W")
    return view.Device(
        gpu=gpu, name=d.info.name or d.info.uuid, vendor=d.info.vendor, uuid=d.info.uuid,
        state=state, utilization=d.utilization_ratio,
        memory_utilization=d.memory_utilization_ratio,
        encoder=engines.get(Engine.ENCODER), decoder=engines.get(Engine.DECODER),
        memory_used_bytes=used, memory_total_bytes=total, memory_free_bytes=free,
        shared_memory_used_bytes=d.shared_memory_used_bytes,
        shared_memory_total_bytes=d.shared_memory_total_bytes,
        power_watts=d.power_watts, power_limit_watts=d.power_limit_watts,
        fan=max(fans) if fans else None, temperature=temperature,
        temperatures={str(k): float(v) for k, v in d.temperatures_celsius.items()},
        clocks=view.Clocks(clocks.get(Clock.GRAPHICS), clocks.get(Clock.MEMORY),
                           clocks.get(Clock.SM)),
        pcie=view.Pcie(d.pcie_link_generation, d.pcie_link_width,
                       d.pcie_link_max_generation, d.pcie_link_max_width,
                       d.pcie_throughput_bytes_per_second.get(Direction.TX),
                       d.pcie_throughput_bytes_per_second.get(Direction.RX)),
        health=view.Health(status, reasons),
        cells=view.Cells(state=str(state), utilization=_pct(d.utilization_ratio),
                         memory=memory_text, power=power_text, temperature=temp_text,
                         health=str(status) if status is not None else NO_DATA))


STALE_REASON = "no completed collection within --stale-after"


def backend_view(s: BackendState) -> view.Backend:
    """One backend as the page's backends table shows it."""
    return view.Backend(s.name, State.STALE if s.stale else State.UP if s.up else State.DOWN,
                        STALE_REASON if s.stale else s.reason,
                        len(s.last.devices) if s.last else 0)


def current(snapshot: Snapshot) -> tuple[tuple[view.Device, ...], tuple[view.Backend, ...]]:
    """Every whole GPU (``device_view``) and every backend (``backend_view``) of a
    snapshot: what the page's tables show, from the one function for both the server
    render and ``/api/v1/history``."""
    stale = {dev.info.key for s in snapshot.backends if s.stale and s.last is not None
             for dev in s.last.devices}
    verdicts = {gpu: v for gpu, _, v in snapshot.health}
    devices = tuple(device_view(d, verdicts.get(gpu), d.info.key in stale, gpu)
                    for gpu, d in snapshot.devices if not d.info.parent_key)
    return devices, tuple(backend_view(s) for s in snapshot.backends)


def otlp_view(otlp: Mapping[str, Any] | None) -> view.Otlp | None:
    """The OTLP pusher's status (its endpoint, last error) as the page shows it."""
    if otlp is None:
        return None
    failing = bool(otlp.get("last_error"))
    return view.Otlp(view.OtlpState.FAILING if failing else view.OtlpState.OK,
                     str(otlp.get("last_error") or otlp.get("endpoint") or ""))
