"""Decoder for amdgpu's binary ``gpu_metrics`` sysfs file (pure: bytes in, dataclass out).

The layouts (v1.0 .. v1.8 dGPU, v2.0 .. v2.4 and v3.0 APU) and the table of which
fields each has live in ``amd_gpu_metrics_layouts``. Every version starts with the
same header: ``structure_size`` u16, ``format_revision`` u8, ``content_revision`` u8.

A field of all ones (0xFFFF, 0xFFFFFFFF, ...) means "this ASIC does not fill it" and
decodes to None. A file shorter than its layout (a truncated read) decodes the
fields that fit. Every value goes through exporter.core.units: a field that is filled but
impossible for its unit (a 60,000 °C sensor, 101 % busy after rounding far past the
firmware's overshoot) is dropped and counted in ``GpuMetrics.dropped``. Units differ
by generation, and are normalised here:

- v1.x (dGPU): temperatures in °C, socket power in W (v1.4+: ``curr_socket_power``).
- v2.x, v3.0 (APU): temperatures in centi-°C, power in mW.
- energy_accumulator: 15.259 µJ (2^-16 J) units (the resolution amdsmi reports);
  a value of 0 is taken as "not filled" (RDNA3 firmware never updates it).
- activities in percent (v2.4: hundredths of a percent), clocks in MHz, PCIe speed in
  0.1 GT/s, XGMI accumulators in kilobytes (1000 bytes), XGMI bit rate in Gb/s.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.core import units
from exporter.core.labels import ThrottleReason
from exporter.core.model import copy_with
from exporter.sources.kernel.amdgpu_gpu_metrics_layouts import LAYOUTS, Layout, Nested

# Independent throttle bits (SMU_THROTTLER_*_BIT in amdgpu_smu.h), grouped into the
# `reason` values docs/metrics.md defines: PPT/SPL limits are firmware power capping,
# TDC/EDC are electrical (current) limits, temperature limits are enforced by the
# firmware, VRHOT/PROCHOT are hardware signals from outside the GPU.
THROTTLE_GROUPS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        ThrottleReason.SW_POWER_CAP: tuple(range(0, 8)),
        ThrottleReason.HW_SLOWDOWN: tuple(range(16, 24)),
        ThrottleReason.SW_THERMAL: tuple(range(32, 44)),
        ThrottleReason.HW_THERMAL: (44, 45),
        ThrottleReason.HW_POWER_BRAKE: (46, 47),
    }
)

# MI300's five throttlers, as v1.4/v1.5 set bits in ``throttle_status`` (THROTTLER_*_BIT of
# the kernel's smu13_driver_if_v13_0_6.h) and v1.6+ count them in ``*_residency_acc``,
# in the same order, grouped as above.
MI300_THROTTLERS: Mapping[str, str] = MappingProxyType(
    {
        "prochot": "hw_power_brake",  # bit 0
        "ppt": "sw_power_cap",  # bit 1
        "socket_thm": "sw_thermal",  # bit 2
        "vr_thm": "hw_thermal",  # bit 3, VRHOT
        "hbm_thm": "sw_thermal",  # bit 4
    }
)
_MI300_REASONS = tuple(dict.fromkeys(MI300_THROTTLERS.values()))
# The APU table v3.0 (Strix Point and later, smu_v14_0_0) counts its throttlers in
# ``throttle_residency_<name>``: per the firmware's own header (smu14_driver_if_v14_0_0.h,
# ThrottleResidency_*), "a counter that is incremented on every metrics table update when
# <it> was engaged", in PM_TIMER cycles, a clock whose rate neither header gives, so the
# counters say *that* a throttler held the clocks between two reads, never for how long
# (no gpu_clock_event_seconds_total). Grouped as THROTTLE_GROUPS does: SPL and the fast
# and slow PPT are the firmware's power limits, the core, graphics and SoC thermal limits
# are enforced by the firmware, PROCHOT is the hardware signal from outside the GPU.
APU_THROTTLERS: Mapping[str, str] = MappingProxyType(
    {
        "prochot": "hw_power_brake",
        "spl": "sw_power_cap",
        "fppt": "sw_power_cap",
        "sppt": "sw_power_cap",
        "thm_core": "sw_thermal",
        "thm_gfx": "sw_thermal",
        "thm_soc": "sw_thermal",
    }
)
# Every throttler counted in a residency accumulator, by the name GpuMetrics keys it with
# (MI300's and the APU's share only ``prochot``, grouped alike).
RESIDENCY_THROTTLERS: Mapping[str, str] = MappingProxyType({**MI300_THROTTLERS,
                                                            **APU_THROTTLERS})
_RESIDENCY = tuple((name, f"{name}_residency_acc") for name in MI300_THROTTLERS)
_APU_RESIDENCY = tuple((name, f"throttle_residency_{name}") for name in APU_THROTTLERS)
# reason -> the mask of its bits in indep_throttle_status (read every cycle)
_THROTTLE_MASKS = tuple((reason, sum(1 << bit for bit in bits))
                        for reason, bits in THROTTLE_GROUPS.items())

RawValue = int | tuple[int | None, ...] | None


class GpuMetricsError(ValueError):
    """Too short for even the header, or a revision this decoder does not know."""


@dataclass(frozen=True)
class GpuMetrics:
    """The fields the exporter uses, in base units; None = not filled by this ASIC."""

    format_revision: int
    content_revision: int
    structure_size: int
    temperatures_celsius: Mapping[str, float] = field(default_factory=dict)
    gfx_activity_ratio: float | None = None
    memory_activity_ratio: float | None = None  # UMC (memory controller)
    video_activity_ratio: float | None = None  # UVD/VCN (mean of the VCN instances on v1.4+)
    socket_power_watts: float | None = None
    energy_joules: float | None = None
    clocks_hertz: Mapping[str, float] = field(default_factory=dict)  # current, by clock
    throttle_status: int | None = None  # ASIC-dependent bits, kept for debugging
    indep_throttle_status: int | None = None  # ASIC-independent SMU_THROTTLER_* bits
    fan_rpm: float | None = None
    pcie_link_width: int | None = None
    pcie_link_speed_gts: float | None = None
    # MI300 (v1.4+): per-link XGMI accumulators in bytes (counters), link state (v1.7+),
    # the driver's timestamp of the table (ns), accumulated throttler residencies (v1.6+).
    xgmi_read_bytes: Mapping[str, float] = field(default_factory=dict)  # link -> counter
    xgmi_write_bytes: Mapping[str, float] = field(default_factory=dict)
    xgmi_link_up: Mapping[str, bool] = field(default_factory=dict)
    system_clock_ns: int | None = None
    # throttler -> accumulator: MI300's (v1.6+) and the APU's (v3.0), RESIDENCY_THROTTLERS
    throttle_residency: Mapping[str, int] = field(default_factory=dict)
    dropped: int = 0  # fields filled with a value impossible for their unit
    raw: Mapping[str, RawValue] = field(default_factory=dict)

    @property
    def throttle_reasons(self) -> dict[str, bool]:
        """reason -> active, from the independent status (v1.3) or MI300's bits (v1.4/1.5);
        {} when not reported (v1.6+ and the APU's v3.0 report residencies: see
        exporter.sources.amd.card for their deltas)."""
        status = self.indep_throttle_status
        if status is not None:
            return {reason: status & mask != 0 for reason, mask in _THROTTLE_MASKS}
        if (self.format_revision, self.content_revision) in ((1, 4), (1, 5)) and \
                self.throttle_status is not None:
            active = {MI300_THROTTLERS[name] for bit, name in enumerate(MI300_THROTTLERS)
                      if self.throttle_status >> bit & 1}
            return {reason: reason in active for reason in _MI300_REASONS}
        return {}


_BLANK = GpuMetrics(format_revision=0, content_revision=0, structure_size=0)


def _kind_size(code: str | Nested) -> tuple[int, int]:
    """(size of one element, its alignment) for a struct code or a nested struct."""
    if isinstance(code, Nested):
        _, size, align = layout_offsets(code.layout)
        return size, align
    size = struct.calcsize(code[-1])
    return size, size


def _count(code: str | Nested) -> int:
    return code.count if isinstance(code, Nested) else int(code[:-1] or 1)


Offsets = tuple[list[tuple[str, int, str | Nested]], int, int]
# Layouts are module constants: what is derived from one is computed once, keyed by
# its id (the layout itself is kept beside, so an id is never reused meanwhile).
_OFFSETS: dict[int, tuple[Layout, Offsets]] = {}
_TABLES: dict[int, tuple[Layout, _Table]] = {}
# (format, content, structure_size) of a header seen -> its table: the look-up each read
# makes; bounded, as a file could declare any size
_BY_HEADER: dict[tuple[int, int, int], _Table] = {}
_BY_HEADER_MAX = 64


def layout_offsets(layout: Layout) -> Offsets:
    """([(field, offset, code)], sizeof, alignment) as a C compiler lays the struct out."""
    cached = _OFFSETS.get(id(layout))
    if cached is not None and cached[0] is layout:
        return cached[1]
    result = _layout_offsets(layout)
    _OFFSETS[id(layout)] = (layout, result)
    return result


def _layout_offsets(layout: Layout) -> Offsets:
    offset, align, fields = 0, 1, []
    for name, code in layout:
        size, field_align = _kind_size(code)
        offset += -offset % field_align
        fields.append((name, offset, code))
        offset += size * _count(code)
        align = max(align, field_align)
    return fields, offset + -offset % align, align


def layout_for(fmt_rev: int, content_rev: int, size: int) -> Layout | None:
    """The layout of this revision whose size is ``structure_size`` (else its first one)."""
    candidates = LAYOUTS.get((fmt_rev, content_rev))
    if not candidates:
        return None
    for layout in candidates:
        if layout_offsets(layout)[1] == size:
            return layout
    return candidates[0]


# A field's place in what _Table.unpack returns: (index of its first value, count,
# all-ones value, end offset in the table).
Place = tuple[int, int, int, int]


class _Table:
    """How one layout decodes, worked out once: one struct for every plain field (gaps
    skipped as pad bytes) and each field's place in what it unpacks. Per-partition
    blocks (Nested) are left out: amdsmi reports partitions as devices instead."""

    def __init__(self, layout: Layout) -> None:
        fmt, at, index = "<", 0, 0
        self.places: dict[str, Place] = {}
        self.starts: list[tuple[int, int]] = []  # (offset, end) of each field, in order
        for name, offset, code in layout_offsets(layout)[0]:
            if isinstance(code, Nested):
                continue
            kind, count = code[-1], _count(code)
            size = struct.calcsize(kind)
            end = offset + size * count
            fmt += (f"{offset - at}x" if offset > at else "") + f"{count}{kind}"
            self.places[name] = (index, count, (1 << (8 * size)) - 1, end)
            self.starts.append((offset, end))
            at, index = end, index + count
        self.struct = struct.Struct(fmt)
        # (format, content) -> _conversions with each field's place (those it has)
        self._conversions: dict[tuple[int, int], list[Placed]] = {}

    def unpack(self, data: bytes, limit: int) -> tuple[tuple[int, ...], int]:
        """(every plain field's values, where the whole fields within ``limit`` end).

        A short table (a truncated read, a smaller ``structure_size``) is cut at the first
        field that does not fit and the rest taken as all ones: none of it has a value."""
        size = self.struct.size
        if size <= limit:  # the common case: every field at once, one unpack
            return self.struct.unpack_from(data), size
        cut = next(offset for offset, end in self.starts if end > limit)
        head = data[:min(cut, limit)]  # (past limit, before cut: pad bytes)
        return self.struct.unpack(head + b"\xff" * (size - len(head))), cut

    def conversions(self, fmt_rev: int, content_rev: int) -> list[Placed]:
        found = self._conversions.get((fmt_rev, content_rev))
        if found is None:
            found = self._conversions[(fmt_rev, content_rev)] = [
                (where, key, *place[:3], how, divisor, multiplier, low, high)
                for where, key, name, how, divisor, multiplier, low, high
                in _conversions(fmt_rev, content_rev)
                if (place := self.places.get(name)) is not None
                and (place[1] == 1 or how == _FIRST)]  # an array: its first element only
        return found


def _table(fmt_rev: int, content_rev: int, size: int) -> _Table | None:
    """The table a header names (None: a revision this decoder does not know)."""
    found = _BY_HEADER.get((fmt_rev, content_rev, size))
    if found is not None:
        return found
    layout = layout_for(fmt_rev, content_rev, size)
    if layout is None:
        return None
    cached = _TABLES.get(id(layout))
    if cached is None or cached[0] is not layout:
        cached = _TABLES[id(layout)] = (layout, _Table(layout))
    if len(_BY_HEADER) < _BY_HEADER_MAX:
        _BY_HEADER[(fmt_rev, content_rev, size)] = cached[1]
    return cached[1]


class Fields(Mapping[str, RawValue]):
    """Every plain field of one decoded table by name: an int, a tuple for an array (None
    for an element of all ones), None for a field of all ones; a field past a short
    read is absent. Read where asked, from the one unpack of the table."""

    __slots__ = ("_flat", "_places", "_cut")

    def __init__(self, flat: tuple[int, ...], places: dict[str, Place], cut: int) -> None:
        self._flat, self._places, self._cut = flat, places, cut

    def get(self, name: str, default: RawValue = None) -> RawValue:  # type: ignore[override]
        place = self._places.get(name)
        if place is None or place[3] > self._cut:
            return default
        index, count, unset, _ = place
        if count == 1:
            value = self._flat[index]
            return None if value == unset else value
        values = self._flat[index:index + count]
        return tuple(None if v == unset else v for v in values) if unset in values else values

    def __getitem__(self, name: str) -> RawValue:
        place = self._places.get(name)
        if place is None or place[3] > self._cut:
            raise KeyError(name)
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return (name for name, place in self._places.items() if place[3] <= self._cut)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _decode(data: bytes) -> tuple[int, int, int, _Table, tuple[int, ...], int]:
    """(format, content, size, table, its values, cut): _Table.unpack of the header's layout."""
    if len(data) < 4:
        raise GpuMetricsError(f"gpu_metrics is {len(data)} bytes: no header")
    size, fmt_rev, content_rev = struct.unpack_from("<HBB", data)
    table = _table(fmt_rev, content_rev, size)
    if table is None:
        raise GpuMetricsError(f"unknown gpu_metrics revision v{fmt_rev}.{content_rev}")
    # The kernel may pad the file (sysfs reads of a page); trust structure_size, but
    # never read past what we have.
    flat, cut = table.unpack(data, min(len(data), size or len(data)))
    return fmt_rev, content_rev, size, table, flat, cut


def decode_raw(data: bytes) -> tuple[int, int, int, dict[str, RawValue]]:
    """(format, content, size, {field: value}) with all-ones fields as None."""
    fmt_rev, content_rev, size, table, flat, cut = _decode(data)
    return fmt_rev, content_rev, size, dict(Fields(flat, table.places, cut))


class _Reader:
    """Bounded reads of decoded fields, counting the filled-but-impossible ones."""

    def __init__(self, raw: Mapping[str, RawValue]) -> None:
        self.raw = raw
        self.dropped = 0

    # Each is called a few dozen times a cycle per card: one dict look-up and a type
    # test each, no helper calls on the way.
    def num(self, name: str) -> int | None:
        value = self.raw.get(name)
        return value if value.__class__ is int else None

    def values(self, name: str) -> tuple[int | None, ...]:
        value = self.raw.get(name)
        return value if value.__class__ is tuple else ()

    def keep(self, value: float | None, raw: int | None) -> float | None:
        if value is None and raw is not None:
            self.dropped += 1
        return value

    def scaled(self, name: str, scale: float, unit: str) -> float | None:
        raw = self.raw.get(name)
        if raw.__class__ is not int:
            return None
        value = units.scaled(raw, scale, unit)
        if value is None:
            self.dropped += 1
        return value

    def ratio(self, name: str, scale: float) -> float | None:
        raw = self.raw.get(name)
        if raw.__class__ is not int:
            return None
        value = units.ratio_from_percent(units.scaled(raw, scale, "count"))
        if value is None:
            self.dropped += 1
        return value

    def first(self, name: str, scale: float, unit: str) -> float | None:
        """A scalar field, or the first filled element of an array one (``current_gfxclk[8]``
        on v1.4+, one per XCD)."""
        raw = self.raw.get(name)
        if raw is None:
            return None
        if raw.__class__ is tuple:
            raw = next((v for v in raw if v is not None), None)
        elif raw.__class__ is not int:
            return None
        return self.keep(units.scaled(raw, scale, unit), raw)

    def mean_ratio(self, name: str) -> float | None:
        filled = [v for v in self.values(name) if v is not None]
        if not filled:
            return None
        return self.keep(units.ratio_from_percent(sum(filled) / len(filled)), filled[0])

    def per_link(self, name: str, scale: float, unit: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for link, raw in enumerate(self.values(name)):
            if (value := self.keep(units.scaled(raw, scale, unit), raw)) is not None:
                out[str(link)] = value
        return out


# How a scalar field becomes a value (_conversions): scaled and bounded; the first filled
# element of an array field (``current_gfxclk[8]`` on v1.4+, one per XCD) so; a percentage
# as 0..1.
_SCALED, _FIRST, _RATIO = 0, 1, 2
# (where: "temps", "clocks" or a GpuMetrics field; key in that dict; field; how;
# units.scaling of its scale and unit)
Conversion = tuple[str, str, str, int, int, float, float, float]
# the same with the field's place in the table instead of its name
Placed = tuple[str, str, int, int, int, int, int, float, float, float]
_CONVERSIONS: dict[tuple[int, int], list[Conversion]] = {}


def _conversions(fmt_rev: int, content_rev: int) -> list[Conversion]:
    """Which field of a table of this revision feeds which value, with its scale and
    unit: worked out once per revision, applied to each table by one loop."""
    found = _CONVERSIONS.get((fmt_rev, content_rev))
    if found is not None:
        return found
    apu = fmt_rev >= 2
    mi300 = (fmt_rev, content_rev) >= (1, 4) and not apu
    temp_scale = 0.01 if apu else 1.0  # APU tables report centi-degrees
    names = (
        {"gfx": "temperature_gfx", "soc": "temperature_soc"}
        if apu
        else {"edge": "temperature_edge", "junction": "temperature_hotspot",
              "memory": "temperature_mem", "vrgfx": "temperature_vrgfx",
              "vrsoc": "temperature_vrsoc", "vrmem": "temperature_vrmem"}
    )  # fmt: skip
    # v2.4 reports activity in hundredths of a percent.
    activity_scale = 0.01 if (fmt_rev, content_rev) == (2, 4) else 1.0
    plan: list[tuple[str, str, str, int, float, str]] = [
        *(("temps", sensor, name, _SCALED, temp_scale, "celsius")
          for sensor, name in names.items()),
        *(("clocks", clock, name, _FIRST, 1_000_000, "hertz")
          for clock, name in (("graphics", "current_gfxclk"), ("memory", "current_uclk"),
                              ("soc", "current_socclk"), ("fabric", "current_fclk"))),
        # SMU13 dGPUs (RDNA3) leave the accumulator at 0 for the life of the driver: a
        # counter that never moves is "not filled" (parse_gpu_metrics).
        ("energy_joules", "", "energy_accumulator", _SCALED, 2.0**-16, "joules"),
        ("socket_power_watts", "", "curr_socket_power" if mi300 else "average_socket_power",
         _SCALED, 0.001 if apu else 1, "watts"),
        ("pcie_link_speed_gts", "", "pcie_link_speed", _SCALED, 0.1, "count"),
        ("gfx_activity_ratio", "", "average_gfx_activity", _RATIO, activity_scale, "count"),
        ("memory_activity_ratio", "", "average_umc_activity", _RATIO, activity_scale,
         "count"),
    ]
    if not mi300:  # MI300's is the mean of its VCN instances (parse_gpu_metrics)
        plan.append(("video_activity_ratio", "", "average_vcn_activity" if fmt_rev == 3
                     else "average_mm_activity", _RATIO, activity_scale, "count"))
    if not apu:
        plan.append(("fan_rpm", "", "current_fan_speed", _SCALED, 1, "rpm"))
    found = _CONVERSIONS[(fmt_rev, content_rev)] = [
        (where, key, name, how, *units.scaling(scale, unit))
        for where, key, name, how, scale, unit in plan]
    return found


def parse_gpu_metrics(data: bytes) -> GpuMetrics:
    """Decode a whole ``gpu_metrics`` read. Raises GpuMetricsError on an unknown layout."""
    fmt_rev, content_rev, size, table, flat, cut = _decode(data)
    raw = Fields(flat, table.places, cut)
    r = _Reader(raw)
    apu = fmt_rev >= 2
    mi300 = (fmt_rev, content_rev) >= (1, 4) and not apu
    temps: dict[str, float] = {}
    clocks: dict[str, float] = {}
    values: dict[str, float] = {}  # GpuMetrics field -> value
    dropped = 0
    # Each field by its place in the one unpack (a field past a short read is all ones).
    for where, key, index, count, unset, how, divisor, multiplier, low, high in \
            table.conversions(fmt_rev, content_rev):
        value = flat[index]
        if count > 1:  # an array (_FIRST): its first filled element
            value = next((v for v in flat[index:index + count] if v != unset), unset)
        if value == unset:
            continue
        x = value / divisor if divisor else value * multiplier
        if not low <= x <= high or x - x != 0.0:  # units.scaled's gate
            dropped += 1
            continue
        if how == _RATIO:  # units.ratio_from_percent
            if not 0 <= x <= 110:
                dropped += 1
                continue
            x = min(x, 100.0) / 100.0
        if where == "temps":
            temps[key] = x
        elif where == "clocks":
            clocks[key] = x
        else:
            values[where] = x
    r.dropped = dropped
    energy = values.get("energy_joules") or None  # 0: never filled (_conversions)
    video = r.mean_ratio("vcn_activity") if mi300 else values.get("video_activity_ratio")
    # XGMI is a field of MI300's tables (v1.4+) only; the throttler residencies are MI300's
    # (v1.6+) and the APU table v3.0's.
    link_status = r.values("xgmi_link_status") if mi300 else ()
    if fmt_rev == 3:
        residency = {name: v for name, field_name in _APU_RESIDENCY
                     if (v := r.num(field_name)) is not None}
    elif mi300:
        residency = {name: v for name, field_name in _RESIDENCY
                     if (v := r.num(field_name)) is not None}
    else:
        residency = {}
    # Every field given: built like core.model.copy_with builds a sample, without the
    # frozen __init__'s setattr per field (a fifth of this function, every fast cycle).
    return copy_with(
        _BLANK,
        format_revision=fmt_rev,
        content_revision=content_rev,
        structure_size=size,
        temperatures_celsius=temps,
        gfx_activity_ratio=values.get("gfx_activity_ratio"),
        memory_activity_ratio=values.get("memory_activity_ratio"),
        video_activity_ratio=video,
        socket_power_watts=values.get("socket_power_watts"),
        energy_joules=energy,
        clocks_hertz=clocks,
        throttle_status=r.num("throttle_status"),
        indep_throttle_status=r.num("indep_throttle_status"),
        fan_rpm=values.get("fan_rpm"),
        pcie_link_width=units.link_width(r.num("pcie_link_width")),
        pcie_link_speed_gts=values.get("pcie_link_speed_gts"),
        xgmi_read_bytes=r.per_link("xgmi_read_data_acc", 1000, "bytes") if mi300 else {},
        xgmi_write_bytes=r.per_link("xgmi_write_data_acc", 1000, "bytes") if mi300 else {},
        xgmi_link_up={str(i): bool(v) for i, v in enumerate(link_status) if v is not None},
        system_clock_ns=r.num("system_clock_counter"),
        throttle_residency=residency,
        dropped=r.dropped,
        raw=raw,
    )
