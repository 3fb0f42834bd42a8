"""One NVIDIA GPU read through NVML: static facts, fast-tier and slow-tier values.

Each ``read_*`` method returns a ``DeviceValues`` (a typed partial sample) in base
units (mW -> W, mJ -> J, MHz -> Hz, KB/s -> B/s, percent -> ratio), every power,
energy, clock and temperature through the ``units`` range gate (a value outside it is
dropped and counted as ``parse``). A value the card does not expose is left out, so it
produces no series. The tier of every call is justified by the timings in
``bench/nvml_calls.py`` (see backend.py TIERS).

Readings that exist only as field values go in one ``nvmlDeviceGetFieldValues`` call
per tier (``fields``): HBM temperature and instant power on the fast tier, the
NVLink throughput counters and retired-page counts on the slow one. NVLink state and
counters live in ``nvlink``, the slow health counters in ``health``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from exporter.collect.backends.nvidia.calls import Caller, Nvml, text, u32, u64
from exporter.collect.backends.nvidia.fields import FieldKey, FieldReader, field_id
from exporter.collect.backends.nvidia.health import Health
from exporter.collect.backends.nvidia.nvlink import NvLinks
from exporter.core.labels import (
    Clock,
    Direction,
    Engine,
    ErrorReason,
    Sensor,
    Severity,
    Threshold,
    ThrottleReason,
)
from exporter.core.model import (
    DeviceInfo,
    DeviceSample,
    DeviceValues,
    ProcessSample,
    normalize_pci_bus_id,
)
from exporter.core.units import ratio_from_percent as ratio
from exporter.core.units import scaled

ARCHITECTURES = {
    "NVML_DEVICE_ARCH_KEPLER": "kepler",
    "NVML_DEVICE_ARCH_MAXWELL": "maxwell",
    "NVML_DEVICE_ARCH_PASCAL": "pascal",
    "NVML_DEVICE_ARCH_VOLTA": "volta",
    "NVML_DEVICE_ARCH_TURING": "turing",
    "NVML_DEVICE_ARCH_AMPERE": "ampere",
    "NVML_DEVICE_ARCH_ADA": "ada",
    "NVML_DEVICE_ARCH_HOPPER": "hopper",
    "NVML_DEVICE_ARCH_BLACKWELL": "blackwell",
    "NVML_DEVICE_ARCH_RUBIN": "rubin",
}
CLOCKS = {Clock.GRAPHICS: "NVML_CLOCK_GRAPHICS", Clock.SM: "NVML_CLOCK_SM",
          Clock.MEMORY: "NVML_CLOCK_MEM", Clock.VIDEO: "NVML_CLOCK_VIDEO"}
# (sensor, threshold) -> nvmlTemperatureThresholds_t: the GPU die's limits, and the
# memory's maximum operating temperature (MEM_MAX, "memory temperature for which the GPU
# will throttle", nvml.h).
THRESHOLDS = {
    (Sensor.GPU, Threshold.SHUTDOWN): "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    (Sensor.GPU, Threshold.SLOWDOWN): "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    (Sensor.GPU, Threshold.MAX_OPERATING): "NVML_TEMPERATURE_THRESHOLD_GPU_MAX",
    (Sensor.MEMORY, Threshold.MEMORY_MAX_OPERATING): "NVML_TEMPERATURE_THRESHOLD_MEM_MAX",
}
# clocks_event_reasons bits (nvml.h nvmlClocksEventReason*; older name: ThrottleReason)
THROTTLE_BITS = {
    ThrottleReason.IDLE: 0x1, ThrottleReason.SW_POWER_CAP: 0x4,
    ThrottleReason.HW_SLOWDOWN: 0x8, ThrottleReason.SYNC_BOOST: 0x10,
    ThrottleReason.SW_THERMAL: 0x20, ThrottleReason.HW_THERMAL: 0x40,
    ThrottleReason.HW_POWER_BRAKE: 0x80, ThrottleReason.DISPLAY_CLOCKS: 0x100,
}
ECC_TYPES = {Severity.CORRECTED: "NVML_MEMORY_ERROR_TYPE_CORRECTED",
             Severity.UNCORRECTED: "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"}
ENGINES = {
    Engine.ENCODER: Nvml.DEVICE_GET_ENCODER_UTILIZATION,
    Engine.DECODER: Nvml.DEVICE_GET_DECODER_UTILIZATION,
    Engine.JPEG: Nvml.DEVICE_GET_JPG_UTILIZATION,
    Engine.OFA: Nvml.DEVICE_GET_OFA_UTILIZATION,
}
SOURCE = "nvml"
GPM_SOURCE = "nvml_gpm"  # GPM's profiling ratios, of a GPU or of a MIG GPU instance
PSTATE_UNKNOWN = 32
# NVML's "KB" in PCIe throughput is 1024 bytes (nvidia-smi prints it as KB/s).
KIB = 1024
# Fast-tier field values (nvml.h NVML_FI_DEV_*): HBM temperature (°C) has no getter of
# its own; instant power (mW) is the unaveraged draw next to nvmlDeviceGetPowerUsage.
FAST_FIELDS = {"memory_temp": "NVML_FI_DEV_MEMORY_TEMP",
               "power_instant": "NVML_FI_DEV_POWER_INSTANT"}


def nvml_sample(info: DeviceInfo, values: DeviceValues, profiling: Mapping[str, float],
                processes: tuple[ProcessSample, ...]) -> DeviceSample:
    """A GPU's or MIG device's sample: NVML's values, GPM's profiling ratios under their
    own source."""
    return DeviceSample.of(
        values.overlay(DeviceValues(profiling_ratio=dict(profiling))), info=info,
        source=SOURCE, field_sources={"profiling_ratio": GPM_SOURCE} if profiling else {},
        processes=processes)


def gated(errors: Counter[ErrorReason], value: float | int | None, scale: float, unit: str
          ) -> float | None:
    """``value`` (in NVML's unit) scaled into ``unit`` and through the range gate; a value
    NVML gave that falls outside it is dropped and counted (reason ``parse``)."""
    out = scaled(value, scale, unit)
    if out is None and value is not None:
        errors[ErrorReason.PARSE] += 1
    return out


def read_info(nvml: Any, handle: Any, driver_version: str) -> DeviceInfo:
    """Identity of one GPU. Raises NVMLError if even the UUID or PCI id cannot be read."""
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    uuid = text(nvml.nvmlDeviceGetUUID(handle))

    def opt(fn: str) -> Any:
        try:
            return getattr(nvml, fn)(handle)
        except (nvml.NVMLError, AttributeError):
            return None

    cc = opt(Nvml.DEVICE_GET_CUDA_COMPUTE_CAPABILITY)
    arch = opt(Nvml.DEVICE_GET_ARCHITECTURE)
    arch_names = {getattr(nvml, k): v for k, v in ARCHITECTURES.items() if hasattr(nvml, k)}
    minor = opt(Nvml.DEVICE_GET_MINOR_NUMBER)
    name, serial, vbios = (opt(f) for f in (
        Nvml.DEVICE_GET_NAME, Nvml.DEVICE_GET_SERIAL, Nvml.DEVICE_GET_VBIOS_VERSION))
    return DeviceInfo(
        vendor="nvidia",
        pci_bus_id=normalize_pci_bus_id(text(pci.busId)),
        uuid=uuid,
        name=text(name) if name is not None else "",
        driver="nvidia",
        driver_version=driver_version,
        vbios_version=text(vbios) if vbios is not None else "",
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else "",
        architecture=arch_names.get(arch, "") if arch is not None else "",
        serial=text(serial) if serial is not None else "",
        device_node=f"nvidia{minor}" if u32(minor) is not None else "",
    )


# The energy counter and the violation (clock event) times are read every COUNTERS_EVERY-th
# slow cycle (30 s by default, dcgm-exporter's default collection interval): on an H100
# (driver 580.159) nvmlDeviceGetTotalEnergyConsumption costs 3.3 ms of CPU (the driver
# spins) and nvmlDeviceGetViolationStatus 0.47 ms for each of 3 reasons, 60 % of the slow
# tier's CPU. Counters lose nothing by being read less often; the served value is then up
# to 30 s old. The first slow cycle reads them.
COUNTERS_EVERY = 3

# Cadence per field (DCGM's update frequency per field), four tiers:
#   fast (every --collector.interval): what a user wants at 100 ms: GPU and per-engine
#     utilisation, memory used, power (averaged and instant), clocks, temperatures, fans,
#     performance state and clock-event reasons.
#   slow (every --collector.slow-interval): current PCIe link generation and width (they
#     follow the power state; the width getter costs 26 us, the most of any fast getter),
#     NVLink state, and everything read_slow reads.
#   rare (RARE_EVERY-th slow cycle, at open, and on the next cycle after an XID event on
#     the GPU or after it was lost): enforced power limit, volatile ECC totals, remapped
#     rows. They change only when an administrator sets a limit or the memory reports an
#     error (an uncorrectable one comes with an XID, which re-reads them at once); the
#     counters lose nothing by being read less often.
#   static (at open, and after the GPU was lost): temperature thresholds, maximum clocks,
#     maximum PCIe link, fan count, identity (name, VBIOS, serial: read_info).
RARE_EVERY = COUNTERS_EVERY


class NvmlDevice:
    """Reads one GPU. ``read_static`` once at open; ``read_fast`` / ``read_slow`` per tier."""

    def __init__(self, nvml: Any, handle: Any, index: int, info: DeviceInfo) -> None:
        self.nvml = nvml
        self.handle = handle
        self.index = index
        self.info = info
        self.call = Caller(nvml, handle, index)
        self.static: DeviceValues | None = None
        self.fans = 0
        self.fields = FieldReader(self.call)
        self.fast_fields = {k: (fid, 0) for k, n in FAST_FIELDS.items()
                            if (fid := field_id(nvml, n)) is not None}
        self.nvlink = NvLinks(self.call)
        self.health = Health(self.call, info.architecture)
        # Slow cycles read since open or the last loss: which of them read the spinning
        # counters (COUNTERS_EVERY) and NVLink throughput and errors (nvlink.due).
        self._slow_cycles = 0
        self._energy: float | None = None  # the last total energy read, J
        self._rare: DeviceValues | None = None  # rare-tier values; None: read them next cycle
        self._slow_state = DeviceValues()  # the slow tier's PCIe link and NVLink state
        self._state_due = False  # read the slow state on the next cycle (after an XID)

    def reset_counters(self) -> None:
        """After the GPU was lost: the next cycle reads the static and rare tiers and
        every counter afresh."""
        self._slow_cycles, self._energy, self.health.events = 0, None, None
        self._rare = self.static = None  # a reset may have come with new limits
        self.nvlink.reset()

    def invalidate(self) -> None:
        """An event (an XID: ECC, row remap, NVLink, fallen off the bus) may have changed
        the rare-tier values and the link state: read them on the next cycle."""
        self._rare, self._state_due = None, True

    def forget_unsupported(self) -> None:
        """Ask again for everything once found unsupported (after a MIG mode change)."""
        self.call.unsupported.clear()
        self.fields.dropped.clear()
        self.nvlink.absent = False

    def c(self, name: str) -> Any:
        return getattr(self.nvml, name)

    def read_static(self, errors: Counter[ErrorReason]) -> None:
        """Limits that do not change while the driver is loaded: thresholds, max clocks/link."""
        g = self.call.get
        thresholds: dict[tuple[str, str], float] = {}
        for key, const in THRESHOLDS.items():
            if hasattr(self.nvml, const):
                v = u32(g(errors, Nvml.DEVICE_GET_TEMPERATURE_THRESHOLD, self.c(const)))
                # 0 means "no such threshold" on cards that answer instead of failing
                if v and (t := gated(errors, v, 1, "celsius")) is not None:
                    thresholds[key] = t
        max_clocks: dict[str, float] = {}
        for clock, const in CLOCKS.items():
            v = u32(g(errors, Nvml.DEVICE_GET_MAX_CLOCK_INFO, self.c(const)))
            if v and (hz := gated(errors, v, 1e6, "hertz")) is not None:
                max_clocks[clock] = hz
        self.static = DeviceValues(
            temperature_limits_celsius=thresholds,
            clocks_max_hertz=max_clocks,
            pcie_link_max_generation=u32(g(errors, Nvml.DEVICE_GET_MAX_PCIE_LINK_GENERATION)),
            pcie_link_max_width=u32(g(errors, Nvml.DEVICE_GET_MAX_PCIE_LINK_WIDTH)),
        )
        self.fans = u32(g(errors, Nvml.DEVICE_GET_NUM_FANS)) or 0

    def read_fast(self, errors: Counter[ErrorReason], slow: bool = False) -> DeviceValues:
        """Cheap getters (1-30 us each, see backend.py TIERS), every --collector.interval,
        with the rare tier when it is due (``slow``: this cycle is a slow one) and the
        last rare and slow-tier state values otherwise."""
        g = self.call.get
        if self.static is None:  # lost at open, or lost and back: limits not read yet
            self.read_static(errors)
        if self._rare is None or (slow and self._slow_cycles % RARE_EVERY == 0):
            self._rare = self.read_rare(errors)
        if slow or self._state_due:
            self.read_state(errors)
        util = g(errors, Nvml.DEVICE_GET_UTILIZATION_RATES)
        temps: dict[str, float] = {}
        temp = u32(g(errors, Nvml.DEVICE_GET_TEMPERATURE, self.c("NVML_TEMPERATURE_GPU")))
        if (celsius := gated(errors, temp, 1, "celsius")) is not None:
            temps[Sensor.GPU] = celsius
        power = u32(g(errors, Nvml.DEVICE_GET_POWER_USAGE))
        fans = {}
        for fan in range(self.fans):
            r = ratio(u32(g(errors, Nvml.DEVICE_GET_FAN_SPEED_V2, fan)))
            if r is not None:
                fans[str(fan)] = r
        clocks: dict[str, float] = {}
        for clock, const in CLOCKS.items():
            mhz = u32(g(errors, Nvml.DEVICE_GET_CLOCK_INFO, self.c(const)))
            if (hz := gated(errors, mhz, 1e6, "hertz")) is not None:
                clocks[clock] = hz
        pstate = u32(g(errors, Nvml.DEVICE_GET_PERFORMANCE_STATE))
        fv = self.fields.read(errors, self.fast_fields.values())
        mem_temp = self._field(fv, "memory_temp")
        # 0 is what cards without an HBM sensor answer instead of failing
        if mem_temp and (celsius := gated(errors, mem_temp, 1, "celsius")) is not None:
            temps[Sensor.MEMORY] = celsius
        instant = gated(errors, self._field(fv, "power_instant"), 1e-3, "watts")
        engines: dict[str, float] = {}
        for engine, fn in ENGINES.items():
            r = g(errors, fn)
            if r is not None and (busy := ratio(u32(r[0]))) is not None:
                engines[engine] = busy
        assert self.static is not None
        return self.static.overlay(self._slow_state, self._rare, DeviceValues(
            utilization_ratio=None if util is None else ratio(u32(util.gpu)),
            memory_utilization_ratio=None if util is None else ratio(u32(util.memory)),
            temperatures_celsius=temps,
            power_watts=gated(errors, power, 1e-3, "watts"),
            fan_speed_ratio=fans,
            clocks_hertz=clocks,
            performance_state=None if pstate is None or pstate >= PSTATE_UNKNOWN else pstate,
            throttle_reasons=self._throttle(errors),
            power_instant_watts=instant,
            engine_utilization_ratio=engines,
        ), read_memory(self.call, errors))

    def read_rare(self, errors: Counter[ErrorReason]) -> DeviceValues:
        """The rare tier (RARE_EVERY above): power limit, ECC totals, remapped rows."""
        g = self.call.get
        limit = u32(g(errors, Nvml.DEVICE_GET_ENFORCED_POWER_LIMIT))
        ecc: dict[str, int] = {}
        for severity, const in ECC_TYPES.items():
            v = u64(g(errors, Nvml.DEVICE_GET_TOTAL_ECC_ERRORS, self.c(const),
                      self.c("NVML_VOLATILE_ECC")))
            if v is not None:
                ecc[severity] = v
        return DeviceValues(
            power_limit_watts=gated(errors, limit, 1e-3, "watts") if limit else None,
            ecc_errors=ecc,
        ).overlay(self._remapped(errors))

    def read_state(self, errors: Counter[ErrorReason]) -> DeviceValues:
        """Slow-tier state (read by read_fast on a slow cycle, served by it between):
        PCIe link now, NVLink up/down."""
        g = self.call.get
        self._state_due = False
        self._slow_state = DeviceValues(
            pcie_link_generation=u32(g(errors, Nvml.DEVICE_GET_CURR_PCIE_LINK_GENERATION)),
            pcie_link_width=u32(g(errors, Nvml.DEVICE_GET_CURR_PCIE_LINK_WIDTH)),
            nvlink_up=self.nvlink.read_state(errors))
        return self._slow_state

    def _remapped(self, errors: Counter[ErrorReason]) -> DeviceValues:
        rows = self.call.get(errors, Nvml.DEVICE_GET_REMAPPED_ROWS)
        if rows is None:
            return DeviceValues()
        corr, unc, pending, failure = (u32(x) for x in rows)
        return DeviceValues(
            remapped_rows={k: v for k, v in ((Severity.CORRECTABLE, corr),
                                             (Severity.UNCORRECTABLE, unc)) if v is not None},
            remap_pending=None if pending is None else bool(pending),
            remap_failed=None if failure is None else bool(failure))

    def _field(self, values: dict[FieldKey, Any], name: str) -> float | int | None:
        key = self.fast_fields.get(name)
        fv = None if key is None else values.get(key)
        return None if fv is None else u32(fv.value)

    def _throttle(self, errors: Counter[ErrorReason]) -> dict[str, bool]:
        mask = u64(self.call.get(errors, Nvml.DEVICE_GET_CURRENT_CLOCKS_EVENT_REASONS))
        if mask is None and self.call.absent(Nvml.DEVICE_GET_CURRENT_CLOCKS_EVENT_REASONS):
            mask = u64(self.call.get(errors, Nvml.DEVICE_GET_CURRENT_CLOCKS_THROTTLE_REASONS))
        if mask is None:
            return {}
        return {reason: bool(mask & bit) for reason, bit in THROTTLE_BITS.items()}

    def read_slow(self, errors: Counter[ErrorReason]) -> DeviceValues:
        """Expensive getters (milliseconds each), every --collector.slow-interval; the two
        counters whose reads spin in the driver every COUNTERS_EVERY-th time."""
        g = self.call.get
        cycle, self._slow_cycles = self._slow_cycles, self._slow_cycles + 1
        due = cycle % COUNTERS_EVERY == 0
        if due:
            self._energy = gated(errors, u64(g(errors, Nvml.DEVICE_GET_TOTAL_ENERGY_CONSUMPTION)),
                                 1e-3, "joules")
        pcie: dict[str, float] = {}
        for key, const in ((Direction.TX, "NVML_PCIE_UTIL_TX_BYTES"),
                           (Direction.RX, "NVML_PCIE_UTIL_RX_BYTES")):
            kb = u32(g(errors, Nvml.DEVICE_GET_PCIE_THROUGHPUT, self.c(const)))
            if (rate := gated(errors, kb, KIB, "bytes_per_second")) is not None:
                pcie[key] = rate
        replays = u32(g(errors, Nvml.DEVICE_GET_PCIE_REPLAY_COUNTER))
        throughput_due, errors_due = self.nvlink.due(cycle)
        values = self._slow_fields(errors, throughput_due)
        return DeviceValues(
            energy_joules=self._energy,
            pcie_replay_errors=replays,
            pcie_throughput_bytes_per_second=pcie,
            nvlink_throughput_bytes_per_second=self.nvlink.throughput(
                errors, values, self.fields.dropped, throughput_due),
            nvlink_errors=self.nvlink.read_errors(errors, errors_due),
        ).overlay(self.health.read(errors, values, due))

    def _slow_fields(self, errors: Counter[ErrorReason],
                     nvlink: bool = True) -> dict[FieldKey, Any]:
        return self.fields.read(errors, self.health.fields()
                                + (self.nvlink.throughput_fields() if nvlink else []))

    def prime(self, errors: Counter[ErrorReason]) -> None:
        """At open: find the active NVLinks and take a first throughput reading, so the
        first collection already reports a rate (over the time since open)."""
        self.read_state(errors)
        if self.nvlink.remote:
            self.nvlink.throughput(errors, self._slow_fields(errors), self.fields.dropped)


def read_memory(call: Caller, errors: Counter[ErrorReason]) -> DeviceValues:
    """Device memory of a GPU or MIG device handle, v2 (with the reservation) where it answers."""
    v2 = getattr(call.nvml, "nvmlMemory_v2", None)
    mem = None if v2 is None else call.get(errors, Nvml.DEVICE_GET_MEMORY_INFO, version=v2)
    if mem is not None:
        # v2 splits off the driver-reserved memory; its `used` is what nvidia-smi shows.
        return DeviceValues(memory_total_bytes=u64(mem.total), memory_used_bytes=u64(mem.used),
                            memory_free_bytes=u64(mem.free),
                            memory_reserved_bytes=u64(mem.reserved))
    mem = call.get(errors, Nvml.DEVICE_GET_MEMORY_INFO)
    if mem is None:
        return DeviceValues()
    return DeviceValues(memory_total_bytes=u64(mem.total), memory_used_bytes=u64(mem.used),
                        memory_free_bytes=u64(mem.free))
