"""The live view: the one typed contract between its producer (exporter.serve.history,
from the merged snapshot) and its three readers: the page (exporter.serve.landing, drawn
on the server, and ``static/app.js``, which refreshes it), its JSON (``/api/v1/history``)
and ``gpu-exporter top`` (exporter.client.top, which decodes the JSON back into these
same classes).

The state and verdict words are defined here once (``State``, ``Heat``, ``OtlpState``;
the health verdict is exporter.core.labels' ``HealthStatus``), with the marks the page
and ``top`` write them with (``MARKS``). Each class writes its JSON (``to_json``) and
reads it back (``from_json``); reading never trusts the other end: a missing key, a
value of the wrong type, a number that is not finite or a word outside its vocabulary
becomes "no data" (``None``, an empty string, an empty table), never an exception, and
every string is stripped of control and escape characters (units.printable) and bounded
before anything draws it. Standard library and exporter.core only: ``top`` imports this
without the daemon.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exporter.core.labels import HealthStatus, Vocabulary
from exporter.core.units import printable

NO_DATA = "no data"
MAX_TEXT = 512  # characters of any one string read back (a health reason is the longest)
MAX_ROWS = 256  # process rows per GPU in the JSON; the rest are counted in ``more``


class State(Vocabulary):
    """A GPU's or a backend's state: ``up``; ``down`` (the exporter saw it go, or the
    backend failed); ``stale`` (its backend has not completed a collection within
    ``--stale-after``: its values are not known to be current)."""

    UP = "up"
    DOWN = "down"
    STALE = "stale"


class Heat(Vocabulary):
    """The hottest sensor against its critical limit: below 60 %, 85 %, 100 %, at or
    above it (with no known limit: below 50 °C, 75 °C, above)."""

    COOL = "cool"
    WARM = "warm"
    HOT = "hot"
    CRITICAL = "critical"


class OtlpState(Vocabulary):
    OK = "ok"
    FAILING = "failing"


# What a state or verdict reads as, with a symbol, so that it is readable without colour.
MARKS: dict[str, str] = {
    State.UP: "● up", State.DOWN: "✖ down", State.STALE: "◌ stale",
    HealthStatus.HEALTHY: "✔ healthy", HealthStatus.DEGRADED: "▲ degraded",
    HealthStatus.FAILED: "✖ failed", OtlpState.OK: "● ok", OtlpState.FAILING: "✖ failing"}


def mark(word: str | None) -> str:
    """A state or verdict as the page and ``top`` write it; no word: "no data"."""
    return MARKS.get(word or "", word or NO_DATA)


def size(n: float | None) -> str:
    """Bytes in the unit that reads best: ``2.0 MiB``, ``512 MiB``, ``3.00 GiB`` (never
    ``0.00 GiB`` for two megabytes); None: "no data". static/app.js's ``size``: the same."""
    if n is None:
        return NO_DATA
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{n:.0f} B"


# -- reading JSON that may be anything ------------------------------------------------------

E = TypeVar("E", bound=Vocabulary)


def text(value: Any, limit: int = MAX_TEXT) -> str:
    """A string from the other end: printable characters only, at most ``limit``."""
    return printable(value, limit) if isinstance(value, str) else ""


def number(value: Any) -> float | None:
    """A finite number, else None (a bool is not a number)."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:
        return float(value)
    return None


def count(value: Any) -> int | None:
    """A whole number >= 0, else None."""
    return value if type(value) is int and value >= 0 else None


def word(kind: type[E], value: Any) -> E | None:
    """A member of the closed vocabulary ``kind``, else None."""
    try:
        return kind(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _obj(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _numbers(value: Any) -> dict[str, float]:
    out = {}
    for k, v in _obj(value).items():
        n = number(v)
        if n is not None and isinstance(k, str):
            out[text(k, 64)] = n
    return out


def _word(value: Any) -> str | None:
    return None if value is None else str(value)


# -- the view ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Temperature:
    """The hottest sensor: its name, °C, the limit it is judged against and its heat."""

    sensor: str
    celsius: float
    critical: float | None = None
    heat: Heat | None = None

    def to_json(self) -> dict[str, Any]:
        return {"sensor": self.sensor, "celsius": self.celsius, "critical": self.critical,
                "heat": _word(self.heat)}

    @classmethod
    def from_json(cls, value: Any) -> Temperature | None:
        obj = _obj(value)
        celsius = number(obj.get("celsius"))
        if celsius is None:
            return None
        return cls(text(obj.get("sensor"), 64), celsius, number(obj.get("critical")),
                   word(Heat, obj.get("heat")))


@dataclass(frozen=True, slots=True)
class Clocks:
    graphics: float | None = None
    memory: float | None = None
    sm: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"graphics": self.graphics, "memory": self.memory, "sm": self.sm}

    @classmethod
    def from_json(cls, value: Any) -> Clocks:
        obj = _obj(value)
        return cls(number(obj.get("graphics")), number(obj.get("memory")), number(obj.get("sm")))


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
        obj = _obj(value)
        return cls(*(number(obj.get(k)) for k in ("generation", "width", "max_generation",
                                                   "max_width", "tx", "rx")))


@dataclass(frozen=True, slots=True)
class Reason:
    """One health finding: its check, its own verdict and the reason for people."""

    check: str
    status: HealthStatus | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "status": _word(self.status), "reason": self.reason}

    @classmethod
    def from_json(cls, value: Any) -> Reason:
        obj = _obj(value)
        return cls(text(obj.get("check"), 64), word(HealthStatus, obj.get("status")),
                   text(obj.get("reason")))


@dataclass(frozen=True, slots=True)
class Health:
    status: HealthStatus | None = None  # None: no verdict (no data)
    reasons: tuple[Reason, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"status": _word(self.status) or "",
                "reasons": [r.to_json() for r in self.reasons]}

    @classmethod
    def from_json(cls, value: Any) -> Health:
        obj = _obj(value)
        return cls(word(HealthStatus, obj.get("status")),
                   tuple(Reason.from_json(r) for r in _list(obj.get("reasons"))[:32]))


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
        obj = _obj(value)
        return cls(*(text(obj.get(k), 128) or NO_DATA for k in CELLS))


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
                               "uuid": self.uuid, "state": _word(self.state)}
        for k in _DEVICE_NUMBERS:
            out[k] = getattr(self, k)
        out.update(temperature=None if self.temperature is None else self.temperature.to_json(),
                   temperatures=dict(self.temperatures), clocks=self.clocks.to_json(),
                   pcie=self.pcie.to_json(), health=self.health.to_json(),
                   cells=self.cells.to_json())
        return out

    @classmethod
    def from_json(cls, value: Any) -> Device | None:
        obj = _obj(value)
        gpu = text(obj.get("gpu"), 16)
        if not gpu:
            return None  # a GPU without its label cannot be told apart: left out
        values: dict[str, Any] = {k: number(obj.get(k)) for k in _DEVICE_NUMBERS}
        return cls(gpu, text(obj.get("name"), 128), text(obj.get("vendor"), 32),
                   text(obj.get("uuid"), 128), word(State, obj.get("state")), **values,
                   temperature=Temperature.from_json(obj.get("temperature")),
                   temperatures=_numbers(obj.get("temperatures")),
                   clocks=Clocks.from_json(obj.get("clocks")),
                   pcie=Pcie.from_json(obj.get("pcie")),
                   health=Health.from_json(obj.get("health")),
                   cells=Cells.from_json(obj.get("cells")))


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
        obj = _obj(value)
        pid = count(obj.get("pid"))
        if pid is None:
            return None
        return cls(pid, text(obj.get("process"), 64), number(obj.get("memory_bytes")),
                   text(obj.get("pod"), 256), text(obj.get("container"), 128),
                   number(obj.get("utilization")), text(obj.get("user"), 32),
                   text(obj.get("command"), 256), number(obj.get("shared_memory_bytes")),
                   _numbers(obj.get("engines")))


@dataclass(frozen=True, slots=True)
class Processes:
    """A GPU's processes, largest memory first, and how many more it had."""

    rows: tuple[Process, ...] = ()
    more: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"rows": [p.to_json() for p in self.rows], "more": self.more}

    @classmethod
    def from_json(cls, value: Any) -> Processes:
        obj = _obj(value)
        rows = (Process.from_json(p) for p in _list(obj.get("rows"))[:MAX_ROWS])
        return cls(tuple(p for p in rows if p is not None), count(obj.get("more")) or 0)


@dataclass(frozen=True, slots=True)
class Backend:
    backend: str
    state: State | None = None
    reason: str = ""
    devices: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "state": _word(self.state), "reason": self.reason,
                "devices": self.devices}

    @classmethod
    def from_json(cls, value: Any) -> Backend | None:
        obj = _obj(value)
        name = text(obj.get("backend"), 64)
        return None if not name else cls(name, word(State, obj.get("state")),
                                         text(obj.get("reason")), count(obj.get("devices")) or 0)


@dataclass(frozen=True, slots=True)
class Otlp:
    state: OtlpState | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"state": _word(self.state), "detail": self.detail}

    @classmethod
    def from_json(cls, value: Any) -> Otlp | None:
        obj = _obj(value)
        return None if not obj else cls(word(OtlpState, obj.get("state")),
                                        text(obj.get("detail")))


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
        obj = _obj(value)
        key = text(obj.get("key"), 32)
        return None if not key else cls(key, text(obj.get("title"), 64),
                                        text(obj.get("unit"), 16), number(obj.get("max")))


def _samples(value: Any, n: int) -> list[float | None]:
    """A column of ``n`` samples: a number, or None (unknown, or not a number)."""
    out = [v if type(v) is float and v == v else number(v) for v in _list(value)[:n]]
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
        obj = _obj(value)
        gpu = text(obj.get("gpu"), 16)
        if not gpu:
            return None
        times = [t for t in _list(obj.get("t")) if number(t) is not None]
        n = len(times) if len(times) == len(_list(obj.get("t"))) else 0  # a hole: none
        return cls(gpu, text(obj.get("name"), 128), [float(t) for t in times[:n]],
                   {k: _samples(obj.get(k), n) for k in keys}, _numbers(obj.get("max")))


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
        obj = _obj(value)
        series = _each(Series.from_json, obj.get("series"), 16)
        keys = tuple(s.key for s in series)
        gpus = tuple(g for g in (GpuHistory.from_json(v, keys)
                                 for v in _list(obj.get("gpus"))[:64]) if g is not None)
        tables = {text(gpu, 16): Processes.from_json(p)
                  for gpu, p in list(_obj(obj.get("processes")).items())[:64]} if processes else {}
        devices, backends = obj.get("devices"), obj.get("backends")
        return cls(number(obj.get("now")) or 0.0, number(obj.get("interval")) or 0.0,
                   number(obj.get("window")) or 0.0, count(obj.get("capacity")) or 0,
                   series, gpus, tables,
                   None if not isinstance(devices, list) else _each(Device.from_json,
                                                                    devices, 64),
                   None if not isinstance(backends, list) else _each(Backend.from_json,
                                                                     backends, 64),
                   Otlp.from_json(obj.get("otlp")))


T = TypeVar("T")


def _each(read: Callable[[Any], T | None], value: Any, limit: int) -> tuple[T, ...]:
    return tuple(x for x in (read(v) for v in _list(value)[:limit]) if x is not None)
