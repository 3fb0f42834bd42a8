"""The live view: the one typed contract between its producer (exporter.serve.history
and exporter.serve.tables, from the merged snapshot) and its three readers: the page
(exporter.serve.landing, drawn on the server, and ``static/app.js``, which refreshes
it), its JSON (``/api/v1/history``) and ``gpu-exporter top`` (exporter.client.top.command, which
decodes the JSON back into these same classes).

Its words (``State``, ``Heat``, ``OtlpState``, ``HealthStatus``) and their marks are
exporter.serve.words', defined once. Each class writes its JSON (``to_json``) and
reads it back (``from_json``); reading never trusts the other end: a missing key, a
value of the wrong type, a number that is not finite or a word outside its vocabulary
becomes "no data" (``None``, an empty string, an empty table), never an exception, and
every string is stripped of control and escape characters (units.printable) and bounded
before anything draws it. Standard library, exporter.core, exporter.serve.words and
exporter.serve.untrusted only: ``top`` imports this without the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.core.labels import HealthStatus
from exporter.serve.untrusted import count, each, items, name_of, number, numbers, obj, text, word
from exporter.serve.words import MARKS as MARKS
from exporter.serve.words import NO_DATA as NO_DATA
from exporter.serve.words import Heat as Heat
from exporter.serve.words import OtlpState as OtlpState
from exporter.serve.words import State as State
from exporter.serve.words import mark as mark
from exporter.serve.words import size as size

MAX_ROWS = 256  # process rows per GPU in the JSON; the rest are counted in ``more``


@dataclass(frozen=True, slots=True)
class Temperature:
    """The hottest sensor: its name, °C, the limit it is judged against and its heat."""

    sensor: str
    celsius: float
    critical: float | None = None
    heat: Heat | None = None

    def to_json(self) -> dict[str, Any]:
        return {"sensor": self.sensor, "celsius": self.celsius, "critical": self.critical,
                "heat": name_of(self.heat)}

    @classmethod
    def from_json(cls, value: Any) -> Temperature | None:
        data = obj(value)
        celsius = number(data.get("celsius"))
        if celsius is None:
            return None
        return cls(text(data.get("sensor"), 64), celsius, number(data.get("critical")),
                   word(Heat, data.get("heat")))


@dataclass(frozen=True, slots=True)
class Clocks:
    graphics: float | None = None
    memory: float | None = None
    sm: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"graphics": self.graphics, "memory": self.memory, "sm": self.sm}

    @classmethod
    def from_json(cls, value: Any) -> Clocks:
        data = obj(value)
        return cls(number(data.get("graphics")), number(data.get("memory")), number(data.get("sm")))


@dataclass(frozen=True, slots=True)
class Pcie:
    generation: float | None = None
    width: float | None = None
    max_generation: float | None = None
    max_width: float | None = None
    tx: float | None = None  # bytes per second
    rx: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "width": self.width,
                "max_generation": self.max_generation, "max_width": self.max_width,
                "tx": self.tx, "rx": self.rx}

    @classmethod
    def from_json(cls, value: Any) -> Pcie:
        data = obj(value)
        return cls(*(number(data.get(k)) for k in ("generation", "width", "max_generation",
                                                   "max_width", "tx", "rx")))


@dataclass(frozen=True, slots=True)
class Reason:
    """One health finding: its check, its own verdict and the reason for people."""

    check: str
    status: HealthStatus | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "status": name_of(self.status), "reason": self.reason}

    @classmethod
    def from_json(cls, value: Any) -> Reason:
        data = obj(value)
        return cls(text(data.get("check"), 64), word(HealthStatus, data.get("status")),
                   text(data.get("reason")))


@dataclass(frozen=True, slots=True)
class Health:
    status: HealthStatus | None = None  # None: no verdict (no data)
    reasons: tuple[Reason, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"status": name_of(self.status) or "",
                "reasons": [r.to_json() for r in self.reasons]}

    @classmethod
    def from_json(cls, value: Any) -> Health:
        data = obj(value)
        return cls(word(HealthStatus, data.get("status")),
                   tuple(Reason.from_json(r) for r in items(data.get("reasons"))[:32]))


CELLS = ("state", "utilization", "memory", "power", "temperature", "health")


@dataclass(frozen=True, slots=True)
class Cells:
    """The page's GPU table text, written once by the producer so that the server's
    render and app.js's refresh show the same words."""

    state: str = NO_DATA
    utilization: str = NO_DATA
    memory: str = NO_DATA
    power: str = NO_DATA
    temperature: str = NO_DATA
    health: str = NO_DATA

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in CELLS}

    @classmethod
    def from_json(cls, value: Any) -> Cells:
        data = obj(value)
        return cls(*(text(data.get(k), 128) or NO_DATA for k in CELLS))


_DEVICE_NUMBERS = ("utilization", "memory_utilization", "encoder", "decoder",
                   "memory_used_bytes", "memory_total_bytes", "memory_free_bytes",
                   "shared_memory_used_bytes", "shared_memory_total_bytes", "power_watts",
                   "power_limit_watts", "fan")


@dataclass(frozen=True, slots=True)
class Device:
    """One whole GPU now: identity, state, current values (None: not reported, never 0),
    the hottest sensor, the health verdict and the page's table text."""

    gpu: str
    name: str = ""
    vendor: str = ""
    uuid: str = ""
    state: State | None = None
    utilization: float | None = None  # ratios 0-1
    memory_utilization: float | None = None
    encoder: float | None = None
    decoder: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    memory_free_bytes: float | None = None
    shared_memory_used_bytes: float | None = None  # GTT / unified memory: an APU's memory
    shared_memory_total_bytes: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    fan: float | None = None  # the fastest, 0-1
    temperature: Temperature | None = None
    temperatures: Mapping[str, float] = field(default_factory=dict)
    clocks: Clocks = Clocks()
    pcie: Pcie = Pcie()
    health: Health = Health()
    cells: Cells = Cells()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpu": self.gpu, "name": self.name, "vendor": self.vendor,
                               "uuid": self.uuid, "state": name_of(self.state)}
        for k in _DEVICE_NUMBERS:
            out[k] = getattr(self, k)
        out.update(temperature=None if self.temperature is None else self.temperature.to_json(),
                   temperatures=dict(self.temperatures), clocks=self.clocks.to_json(),
                   pcie=self.pcie.to_json(), health=self.health.to_json(),
                   cells=self.cells.to_json())
        return out

    @classmethod
    def from_json(cls, value: Any) -> Device | None:
        data = obj(value)
        gpu = text(data.get("gpu"), 16)
        if not gpu:
            return None  # a GPU without its label cannot be told apart: left out
        values: dict[str, Any] = {k: number(data.get(k)) for k in _DEVICE_NUMBERS}
        return cls(gpu, text(data.get("name"), 128), text(data.get("vendor"), 32),
                   text(data.get("uuid"), 128), word(State, data.get("state")), **values,
                   temperature=Temperature.from_json(data.get("temperature")),
                   temperatures=numbers(data.get("temperatures")),
                   clocks=Clocks.from_json(data.get("clocks")),
                   pcie=Pcie.from_json(data.get("pcie")),
                   health=Health.from_json(data.get("health")),
                   cells=Cells.from_json(data.get("cells")))


@dataclass(frozen=True, slots=True)
class Process:
    """One process on one GPU, as operators read it (procps top, nvtop): who runs it,
    what, its GPU memory and engine use, and its pod where known."""

    pid: int
    process: str  # the kernel's comm
    memory_bytes: float | None = None  # device-local memory
    pod: str = ""  # namespace/pod, or empty
    container: str = ""
    utilization: float | None = None  # the busiest engine's share, 0-1
    user: str = ""
    command: str = ""  # the command line, bounded
    shared_memory_bytes: float | None = None  # system (GTT) memory charged to it
    engines: Mapping[str, float] = field(default_factory=dict)  # engine -> share

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "process": self.process, "memory_bytes": self.memory_bytes,
                "pod": self.pod, "container": self.container, "utilization": self.utilization,
                "user": self.user, "command": self.command,
                "shared_memory_bytes": self.shared_memory_bytes, "engines": dict(self.engines)}

    @classmethod
    def from_json(cls, value: Any) -> Process | None:
        data = obj(value)
        pid = count(data.get("pid"))
        if pid is None:
            return None
        return cls(pid, text(data.get("process"), 64), number(data.get("memory_bytes")),
                   text(data.get("pod"), 256), text(data.get("container"), 128),
                   number(data.get("utilization")), text(data.get("user"), 32),
                   text(data.get("command"), 256), number(data.get("shared_memory_bytes")),
                   numbers(data.get("engines")))


@dataclass(frozen=True, slots=True)
class Processes:
    """A GPU's processes, largest memory first, and how many more it had."""

    rows: tuple[Process, ...] = ()
    more: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"rows": [p.to_json() for p in self.rows], "more": self.more}

    @classmethod
    def from_json(cls, value: Any) -> Processes:
        data = obj(value)
        rows = (Process.from_json(p) for p in items(data.get("rows"))[:MAX_ROWS])
        return cls(tuple(p for p in rows if p is not None), count(data.get("more")) or 0)


@dataclass(frozen=True, slots=True)
class Backend:
    backend: str
    state: State | None = None
    reason: str = ""
    devices: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "state": name_of(self.state), "reason": self.reason,
                "devices": self.devices}

    @classmethod
    def from_json(cls, value: Any) -> Backend | None:
        data = obj(value)
        name = text(data.get("backend"), 64)
        return None if not name else cls(name, word(State, data.get("state")),
                                         text(data.get("reason")), count(data.get("devices")) or 0)


@dataclass(frozen=True, slots=True)
class Otlp:
    state: OtlpState | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"state": name_of(self.state), "detail": self.detail}

    @classmethod
    def from_json(cls, value: Any) -> Otlp | None:
        data = obj(value)
        return None if not data else cls(word(OtlpState, data.get("state")),
                                        text(data.get("detail")))


@dataclass(frozen=True, slots=True)
class Series:
    """One chart: its key in the JSON, title, unit and fixed top (None: autoscaled)."""

    key: str
    title: str
    unit: str
    high: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "unit": self.unit, "max": self.high}

    @classmethod
    def from_json(cls, value: Any) -> Series | None:
        data = obj(value)
        key = text(data.get("key"), 32)
        return None if not key else cls(key, text(data.get("title"), 64),
                                        text(data.get("unit"), 16), number(data.get("max")))


def _samples(value: Any, n: int) -> list[float | None]:
    """A column of ``n`` samples: a number, or None (unknown, or not a number)."""
    out = [v if type(v) is float and v == v else number(v) for v in items(value)[:n]]
    return out + [None] * (n - len(out))


@dataclass(frozen=True, slots=True)
class GpuHistory:
    """One GPU's recorded samples as columns, oldest first: ``t`` (Unix seconds) and one
    list per series key, aligned with it; ``scale``: each chart's top where the GPU has
    one (its power limit, its hottest sensor's critical limit), kept after the GPU is
    lost so that its chart's axis does not jump."""

    gpu: str
    name: str
    t: list[float]
    values: Mapping[str, list[float | None]]
    scale: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "name": self.name, "t": self.t, **self.values,
                "max": dict(self.scale)}

    @classmethod
    def from_json(cls, value: Any, keys: tuple[str, ...]) -> GpuHistory | None:
        data = obj(value)
        gpu = text(data.get("gpu"), 16)
        if not gpu:
            return None
        times = [t for t in items(data.get("t")) if number(t) is not None]
        n = len(times) if len(times) == len(items(data.get("t"))) else 0  # a hole: none
        return cls(gpu, text(data.get("name"), 128), [float(t) for t in times[:n]],
                   {k: _samples(data.get(k), n) for k in keys}, numbers(data.get("max")))


@dataclass(frozen=True, slots=True)
class HistoryView:
    """The body of ``/api/v1/history``: the server's clock, the sampling, the charts'
    series and samples, and (whatever ``since``) the latest recorded tables. ``devices``
    and ``backends`` are None until the exporter has recorded its first sample (not
    known yet, which is not "none")."""

    now: float
    interval: float
    window: float
    capacity: int
    series: tuple[Series, ...]
    gpus: tuple[GpuHistory, ...] = ()
    processes: Mapping[str, Processes] = field(default_factory=dict)
    devices: tuple[Device, ...] | None = None
    backends: tuple[Backend, ...] | None = None
    otlp: Otlp | None = None

    def to_json(self) -> dict[str, Any]:
        return {"now": self.now, "interval": self.interval, "window": self.window,
                "capacity": self.capacity, "series": [s.to_json() for s in self.series],
                "gpus": [g.to_json() for g in self.gpus],
                "processes": {gpu: p.to_json() for gpu, p in self.processes.items()},
                "devices": None if self.devices is None else [d.to_json() for d in self.devices],
                "backends": None if self.backends is None
                else [b.to_json() for b in self.backends],
                "otlp": None if self.otlp is None else self.otlp.to_json()}

    @classmethod
    def from_json(cls, value: Any, processes: bool = True) -> HistoryView:
        """Whatever ``value`` is: what can be read of it, the rest "no data".
        ``processes=False``: the process tables are left for ``Processes.from_json`` of
        the one GPU a reader shows (``top`` decodes 64 rows a frame, not 8 x 64)."""
        data = obj(value)
        series = each(Series.from_json, data.get("series"), 16)
        keys = tuple(s.key for s in series)
        gpus = tuple(g for g in (GpuHistory.from_json(v, keys)
                                 for v in items(data.get("gpus"))[:64]) if g is not None)
        tables = {text(gpu, 16): Processes.from_json(p)
                  for gpu, p in list(obj(data.get("processes")).items())[:64]} if processes else {}
        devices, backends = data.get("devices"), data.get("backends")
        return cls(number(data.get("now")) or 0.0, number(data.get("interval")) or 0.0,
                   number(data.get("window")) or 0.0, count(data.get("capacity")) or 0,
                   series, gpus, tables,
                   None if not isinstance(devices, list) else each(Device.from_json,
                                                                    devices, 64),
                   None if not isinstance(backends, list) else each(Backend.from_json,
                                                                     backends, 64),
                   Otlp.from_json(data.get("otlp")))
