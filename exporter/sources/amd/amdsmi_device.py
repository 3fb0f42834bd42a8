"""What one amdsmi processor handle reports, as typed DeviceValues (amdsmi's units -> base units).

Split from the backend so the mapping reads in one place. Units (amdsmi.h, and the
Python package's ``amdsmi_interface.py`` dict keys): activity %, VRAM bytes (MiB from
the older ``amdsmi_get_gpu_vram_usage``), power W, energy ``energy_accumulator x
counter_resolution`` µJ, temperatures °C, clocks MHz, PCIe speed MT/s, XGMI link
``read`` / ``write`` accumulators KB, process memory bytes, process engine usage ns (a
busy-time counter).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from exporter.core import units
from exporter.core.labels import (
    Clock,
    Direction,
    Engine,
    ErrorReason,
    Remote,
    Sensor,
    Severity,
    Threshold,
)
from exporter.core.model import DeviceValues, ProcessSample
from exporter.sources.amd.amdsmi_calls import Caller, number, text

MIB = 1 << 20
# AmdSmiTemperatureType member -> docs/metrics.md sensor
TEMPERATURES = (("EDGE", Sensor.EDGE), ("HOTSPOT", Sensor.JUNCTION), ("VRAM", Sensor.MEMORY))
THRESHOLDS = (("CRITICAL", Threshold.CRITICAL), ("EMERGENCY", Threshold.SHUTDOWN))
CLOCKS = (("GFX", Clock.GRAPHICS), ("MEM", Clock.MEMORY))
# AmdSmiGpuBlock members read for per-block RAS counts (the label is the name, lower case).
RAS_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "ATHUB", "PCIE_BIF", "HDP", "XGMI_WAFL", "DF",
              "SMN", "SEM", "MP0", "MP1", "FUSE", "MCA", "VCN", "JPEG", "IH", "MPIO")
XGMI_LINK_TYPE = 2  # AMDSMI_LINK_TYPE_XGMI (amdsmi_wrapper.py)
# process engine_usage key -> docs/metrics.md engine
ENGINES = (("gfx", Engine.GFX), ("enc", Engine.ENCODER))


def activity(call: Caller, errors: Counter[ErrorReason]) -> DeviceValues:
    a = call.get(errors, "amdsmi_get_gpu_activity") or {}
    util = units.ratio_from_percent(number(a.get("gfx_activity"), "count", 1, errors))
    mem = units.ratio_from_percent(number(a.get("umc_activity"), "count", 1, errors))
    mm = units.ratio_from_percent(number(a.get("mm_activity"), "count", 1, errors))
    engines: dict[str, float] = {
        k: v for k, v in ((Engine.GFX, util), (Engine.VIDEO, mm)) if v is not None}
    return DeviceValues(utilization_ratio=util, memory_utilization_ratio=mem,
                        engine_utilization_ratio=engines)


def memory(call: Caller, errors: Counter[ErrorReason]) -> DeviceValues:
    """VRAM in exact bytes (``amdsmi_get_gpu_memory_total`` / ``_usage``, ``uint64_t`` bytes
    in amdsmi.h); ``amdsmi_get_gpu_vram_usage`` (whole MiB, truncated: 283 MiB where the
    GPU holds 297,771,008 B) only where the byte getters are missing or not supported."""
    kind = getattr(getattr(call.lib, "AmdSmiMemoryType", None), "VRAM", None)
    total = used = None
    if kind is not None:
        total = number(call.get(errors, "amdsmi_get_gpu_memory_total", kind), "bytes", 1, errors)
        used = number(call.get(errors, "amdsmi_get_gpu_memory_usage", kind), "bytes", 1, errors)
    if total is None or used is None:
        v = call.get(errors, "amdsmi_get_gpu_vram_usage") or {}
        total = total if total is not None else number(v.get("vram_total"), "bytes", MIB, errors)
        used = used if used is not None else number(v.get("vram_used"), "bytes", MIB, errors)
    free = total - used if total is not None and used is not None and used <= total else None
    return DeviceValues(memory_total_bytes=total, memory_used_bytes=used, memory_free_bytes=free)


def power(call: Caller, errors: Counter[ErrorReason]) -> DeviceValues:
    p = call.get(errors, "amdsmi_get_power_info") or {}
    average = number(p.get("average_socket_power"), "watts", 1, errors)
    if average is None:
        average = number(p.get("socket_power"), "watts", 1, errors)
    instant = number(p.get("current_socket_power"), "watts", 1, errors)
    limit = number(p.get("power_limit"), "watts", 1, errors)
    e = call.get(errors, "amdsmi_get_energy_count") or {}
    acc, res = e.get("energy_accumulator"), e.get("counter_resolution")
    energy = None
    if isinstance(acc, int) and isinstance(res, (int, float)) and acc not in (0, units.U64_MAX):
        energy = number(acc * res, "joules", 1e-6, errors)  # µJ
    return DeviceValues(power_watts=average, power_instant_watts=instant,
                        power_limit_watts=limit, energy_joules=energy)


def temperatures(call: Caller, lib: Any, errors: Counter[ErrorReason]) -> DeviceValues:
    kinds, metric = lib.AmdSmiTemperatureType, lib.AmdSmiTemperatureMetric
    temps: dict[str, float] = {
        sensor: v for member, sensor in TEMPERATURES
        if (v := number(call.get(errors, "amdsmi_get_temp_metric", kinds[member],
                                 metric.CURRENT), "celsius", 1, errors)) is not None}
    return DeviceValues(temperatures_celsius=temps)


def thresholds(call: Caller, lib: Any, errors: Counter[ErrorReason]) -> DeviceValues:
    """The junction (hotspot) sensor's limits (slow tier)."""
    kinds, metric = lib.AmdSmiTemperatureType, lib.AmdSmiTemperatureMetric
    limits: dict[tuple[str, str], float] = {
        (Sensor.JUNCTION, name): v for member, name in THRESHOLDS
        if (v := number(call.get(errors, "amdsmi_get_temp_metric", kinds.HOTSPOT,
                                 metric[member]), "celsius", 1, errors)) is not None}
    return DeviceValues(temperature_limits_celsius=limits)


def clocks(call: Caller, lib: Any, errors: Counter[ErrorReason]) -> DeviceValues:
    current: dict[str, float] = {}
    top: dict[str, float] = {}
    for member, clock in CLOCKS:
        c = call.get(errors, "amdsmi_get_clock_info", lib.AmdSmiClkType[member]) or {}
        if (hz := number(c.get("clk"), "hertz", 1_000_000, errors)) is not None:
            current[clock] = hz
        if (hz := number(c.get("max_clk"), "hertz", 1_000_000, errors)) is not None:
            top[clock] = hz
    return DeviceValues(clocks_hertz=current, clocks_max_hertz=top)


def pcie(call: Caller, errors: Counter[ErrorReason]) -> DeviceValues:
    info = call.get(errors, "amdsmi_get_pcie_info") or {}
    static, metric = info.get("pcie_static") or {}, info.get("pcie_metric") or {}

    def gen(mts: Any) -> int | None:
        speed = number(mts, "count", 1, errors)
        return None if speed is None else units.pcie_generation(speed / 1000)

    def width(lanes: Any) -> int | None:
        return units.parse_link_width(str(lanes)) if lanes not in (None, "N/A") else None

    replay = number(metric.get("pcie_replay_count"), "count", 1, errors)
    return DeviceValues(pcie_link_generation=gen(metric.get("pcie_speed")),
                        pcie_link_width=width(metric.get("pcie_width")),
                        pcie_link_max_generation=gen(static.get("max_pcie_speed")),
                        pcie_link_max_width=width(static.get("max_pcie_width")),
                        pcie_replay_errors=None if replay is None else int(replay))


def ras(call: Caller, lib: Any, errors: Counter[ErrorReason]) -> DeviceValues:
    """Per-block ECC counts (slow tier) and their sum as the device's ECC counters."""
    per_block: dict[tuple[str, str], int] = {}
    for member in RAS_BLOCKS:
        block = getattr(lib.AmdSmiGpuBlock, member, None)
        if block is None:
            continue
        c = call.get(errors, "amdsmi_get_gpu_ecc_count", block) or {}
        for key, severity in (("correctable_count", Severity.CORRECTED),
                              ("uncorrectable_count", Severity.UNCORRECTED)):
            if (n := number(c.get(key), "count", 1, errors)) is not None:
                per_block[(member.lower(), severity)] = int(n)
    totals: dict[str, int] = {}
    for (_, kind), n in per_block.items():
        totals[kind] = totals.get(kind, 0) + n
    return DeviceValues(ras_errors=per_block, ecc_errors=totals)


def xgmi_links(call: Caller, errors: Counter[ErrorReason]) -> tuple[dict[tuple[str, str], bool],
                                                           dict[tuple[str, str], float]]:
    """(link, "gpu") -> up for the XGMI links, and (link, "rx"/"tx") -> accumulated bytes."""
    m = call.get(errors, "amdsmi_get_link_metrics") or {}
    up: dict[tuple[str, str], bool] = {}
    counters: dict[tuple[str, str], float] = {}
    links = m.get("links") or []
    count = m.get("num_links")
    for i, link in enumerate(links[:count if isinstance(count, int) else len(links)]):
        if not isinstance(link, Mapping) or link.get("link_type") != XGMI_LINK_TYPE:
            continue
        rate = number(link.get("bit_rate"), "count", 1, errors)
        up[(str(i), Remote.GPU)] = bool(rate)
        for key, direction in (("read", Direction.RX), ("write", Direction.TX)):
            if (b := number(link.get(key), "bytes", 1000, errors)) is not None:
                counters[(str(i), direction)] = b
    return up, counters


def processes(call: Caller, errors: Counter[ErrorReason]) -> tuple[ProcessSample, ...]:
    out: list[ProcessSample] = []
    for p in call.get(errors, "amdsmi_get_gpu_process_list") or []:
        pid = p.get("pid") if isinstance(p, Mapping) else None
        if not isinstance(pid, int) or pid <= 0:
            errors[ErrorReason.PARSE] += 1
            continue
        mem = p.get("memory_usage") or {}
        usage = p.get("engine_usage") or {}
        busy: dict[str, float] = {
            engine: v for key, engine in ENGINES
            if (v := number(usage.get(key), "seconds", 1e-9, errors)) is not None}
        out.append(ProcessSample(
            pid=pid, process=units.process_name(text(p.get("name"))),
            memory_used_bytes=number(mem.get("vram_mem"), "bytes", 1, errors),
            shared_memory_used_bytes=number(mem.get("gtt_mem"), "bytes", 1, errors),
            engine_busy_seconds=busy))
    return tuple(sorted(out, key=lambda p: p.pid))
