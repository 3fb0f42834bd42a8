"""Pure parser for one line of ``macmon pipe`` (Apple Silicon): JSON -> base units.

Owns what each field of macmon's output means in docs/metrics.md terms, across the
releases whose output differs (vladkens/macmon, changelog.md and readme.md):

- v0.4-v0.5: ``gpu_usage: [freq_mhz, ratio]``, ``gpu_power`` (W),
  ``temp.gpu_temp_avg`` (°C), ``memory.ram_total`` / ``ram_usage`` (bytes); keys
  unsorted, no ``timestamp``. v0.6.0 adds ``timestamp``; v0.6.1 adds the ``soc``
  object (``chip_name``, ``gpu_freqs`` in MHz) with ``--soc-info``; v0.7 adds
  ``cpu_usage_pct``.
- v0.8.0: ``gpu_freq_mhz``, ``gpu_scaled_ratio`` (what the pair's ratio was) and
  ``gpu_active_ratio`` (residency, new), ``fans: [{name, rpm, max_rpm}]``;
  development builds before it named the scaled ratio ``gpu_usage_ratio``.
  v0.8.1 prints the v0.7 names again as aliases (src_app/main.rs ``JsonMetrics``).

Choices, each because of what the field measures:
- ``gpu_utilization_ratio`` is ``gpu_active_ratio`` where macmon gives it: the
  fraction of the interval the GPU was not idle, which is what the family means on
  every other vendor (NVML util.gpu, amdgpu gpu_busy_percent). Older releases only
  give the frequency-scaled ratio (busy time x average clock / top clock), which is
  used there and reads lower at low clocks (docs/vendors-apple.md).
- ``gpu_temp_avg`` of exactly 0 is macmon's "no sensor read" (``zero_div`` of an
  empty list in ``get_temp_smc`` / ``get_temp_hid``), not a reading: no series.
- Unified memory is ``gpu_shared_memory_*`` (docs/metrics.md: "Apple unified").
- CPU, ANE, DRAM and system power, CPU temperature and swap have no docs/metrics.md
  family and are not read here.

A field that is absent gives no value; one of the wrong type or outside its unit's
range is dropped and counted (``MacmonValues.dropped``). Unknown fields are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.core.units import clamp_ratio, scaled

MHZ = 1_000_000
_FAN_NAME_RE = re.compile(r"fan(\d{1,2})\Z")
_EMPTY: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True)
class MacmonValues:
    """One macmon line in base units; None or an absent key = macmon did not give it."""

    chip_name: str = ""  # soc.chip_name ("Apple M1 Max"), only with --soc-info
    gpu_clock_hertz: float | None = None
    gpu_clock_max_hertz: float | None = None  # top of soc.gpu_freqs
    gpu_utilization_ratio: float | None = None
    gpu_power_watts: float | None = None
    gpu_temperature_celsius: float | None = None
    unified_memory_total_bytes: float | None = None
    unified_memory_used_bytes: float | None = None
    fan_speed_ratio: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    dropped: int = 0  # values present but unusable


def decode_line(raw: bytes) -> dict[str, object] | None:
    """A line of macmon's stdout -> its JSON object, or None when it is not one."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    return doc if isinstance(doc, dict) else None


class _Reader:
    """Reads fields of one document, counting the ones present but unusable."""

    def __init__(self) -> None:
        self.dropped = 0

    def number(self, doc: object, key: str, unit: str, scale: int = 1) -> float | None:
        if not isinstance(doc, Mapping) or key not in doc:
            return None
        return self.value(doc[key], unit, scale)

    def value(self, raw: object, unit: str, scale: int = 1) -> float | None:
        # JSON numbers only: bool is an int to Python, and a string is not macmon's.
        number = raw if isinstance(raw, (int, float)) and not isinstance(raw, bool) else None
        value = scaled(number, scale, unit)
        if value is None:
            self.dropped += 1
        return value

    def pair(self, doc: Mapping[str, object], key: str) -> tuple[object, object] | None:
        """macmon's ``[freq_mhz, ratio]`` tuples; anything else is counted."""
        raw = doc.get(key)
        if raw is None:
            return None
        if isinstance(raw, list) and len(raw) == 2:
            return raw[0], raw[1]
        self.dropped += 1
        return None


def parse_macmon(doc: Mapping[str, object]) -> MacmonValues:
    """One decoded line of any macmon release -> the values docs/metrics.md has a family for."""
    r = _Reader()
    pair = r.pair(doc, "gpu_usage")
    if "gpu_freq_mhz" in doc:
        clock = r.number(doc, "gpu_freq_mhz", "hertz", MHZ)
    else:
        clock = r.value(pair[0], "hertz", MHZ) if pair else None
    for key in ("gpu_active_ratio", "gpu_scaled_ratio", "gpu_usage_ratio"):
        if key in doc:
            busy = r.number(doc, key, "ratio")
            break
    else:
        busy = r.value(pair[1], "ratio") if pair else None

    temp = doc.get("temp")
    celsius = r.number(temp, "gpu_temp_avg", "celsius")
    memory = doc.get("memory")
    soc = doc.get("soc")
    return MacmonValues(
        chip_name=_chip_name(soc),
        gpu_clock_hertz=clock,
        gpu_clock_max_hertz=_max_clock(r, soc),
        gpu_utilization_ratio=busy,
        gpu_power_watts=r.number(doc, "gpu_power", "watts"),
        gpu_temperature_celsius=celsius if celsius != 0 else None,
        unified_memory_total_bytes=r.number(memory, "ram_total", "bytes"),
        unified_memory_used_bytes=r.number(memory, "ram_usage", "bytes"),
        fan_speed_ratio=_fans(r, doc.get("fans")),
        dropped=r.dropped,
    )


def _chip_name(soc: object) -> str:
    name = soc.get("chip_name") if isinstance(soc, Mapping) else None
    if not isinstance(name, str):
        return ""
    return "".join(ch for ch in name if ch.isprintable())[:64].strip()


_GENERATION_RE = re.compile(r"\bM(\d{1,2})\b")


def chip_generation(chip_name: str) -> str:
    """The generation of an Apple silicon chip's name ("Apple M1 Max" -> "M1"): the GPU
    architecture every chip of one generation shares (M1, M1 Pro, M1 Max and M1 Ultra
    have the same GPU cores, in different numbers); "" for a name without one."""
    match = _GENERATION_RE.search(chip_name)
    return f"M{match.group(1)}" if match else ""


def _max_clock(r: _Reader, soc: object) -> float | None:
    """``soc.gpu_freqs``: the GPU's DVFS table in MHz (first entry 0 = off)."""
    freqs = soc.get("gpu_freqs") if isinstance(soc, Mapping) else None
    if not isinstance(freqs, list) or not freqs:
        return None
    values = [r.value(f, "hertz", MHZ) for f in freqs]
    usable = [v for v in values if v is not None]
    top = max(usable, default=0.0)
    return top if top > 0 else None


def _fans(r: _Reader, fans: object) -> Mapping[str, float]:
    """v0.8 ``fans``: ``[{name: "fan0", rpm, max_rpm}]`` -> fan index -> rpm / max_rpm.

    The SoC's fans are the GPU's cooling (as a board fan is on a discrete card). A fan
    whose maximum macmon could not read (``max_rpm`` null or 0) has no ratio.
    """
    if not isinstance(fans, list):
        return _EMPTY
    out: dict[str, float] = {}
    for position, fan in enumerate(fans[:16]):
        if not isinstance(fan, Mapping):
            r.dropped += 1
            continue
        name = fan.get("name")
        m = _FAN_NAME_RE.match(name) if isinstance(name, str) else None
        label = str(int(m.group(1))) if m else str(position)
        rpm = r.number(fan, "rpm", "rpm")
        top = fan.get("max_rpm")
        if rpm is None or top is None or top == 0:
            continue
        max_rpm = r.value(top, "rpm")
        ratio = clamp_ratio(rpm / max_rpm) if max_rpm else None
        if ratio is not None:
            out[label] = ratio
    return MappingProxyType(out)
