"""One NVIDIA GPU read through NVML: static facts, fast-tier and slow-tier values.

Each ``read_*`` method returns a ``DeviceValues`` (a typed partial sample) in base
units (mW -> W, mJ -> J, MHz -> Hz, KB/s -> B/s, percent -> ratio), every power,
energy, clock and temperature through the ``units`` range gate (a value outside it is
dropped and counted as ``parse``). A value the card does not expose is left out, so it
produces no series. The tier of every call is justified by the timings in
``bench/nvml_calls.py`` (see backend.py TIERS).

Plain scalars (one getter, one number: power, P-state, PCIe link, limits, encoder
sessions) are rows of ``scalars.SCALARS``, read by one loop in each tier's method below.
Readings that exist only as field values go in one ``nvmlDeviceGetFieldValues`` call
per tier (``fields``): HBM temperature and instant power on the fast tier, the
NVLink throughput counters and retired-page counts on the slow one. NVLink state and
counters live in ``nvlink``, the slow health counters in ``health``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

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
    ValueField,
    normalize_pci_bus_id,
)
from exporter.core.units import ratio_from_percent as ratio
from exporter.sources.nvidia import scalars
from exporter.sources.nvidia.calls import Caller, Nvml, text, u32, u64
from exporter.sources.nvidia.fields import FieldKey, FieldReader, field_id
from exporter.sources.nvidia.health import Health
from exporter.sources.nvidia.nvlink import NvLinks
from exporter.sources.nvidia.scalars import Tier, gated
from exporter.sources.readers import ALWAYS, Readers, Wanted

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
#     and everything read_slow reads every slow cycle.
#   rare (RARE_EVERY-th slow cycle, at open, and on the next cycle after an XID event on
#     the GPU or after it was lost): enforced power limit, volatile ECC totals and ECC by
#     location, remapped rows, PCIe replays, NVLink state. They change only when an
#     administrator sets a limit, the memory or a link reports an error (an uncorrectable
#     one, a link that trains down, comes with an XID, which re-reads them at once) or
#     are counters, which lose nothing by being read less often. NVLink state was 18
#     calls per NVLinked GPU every slow cycle; ECC by location 4 (H100) and the replay
#     counter 130-176 us (as a field value too: MEASURED.md).
#   static (at open, and after the GPU was lost): temperature thresholds, maximum clocks,
#     maximum PCIe link, fan count, identity (name, VBIOS, serial: read_info).
# Readings only a reader of the metrics sees (exporter.sources.readers: PCIe throughput,
# clock-event times, NVLink throughput and errors, GPM) are taken on their tier only when
# a scrape, /snapshot or push came since they were last taken.
RARE_EVERY = COUNTERS_EVERY


def _present(values: Mapping[ValueField, Any]) -> dict[str, Any]:
    """The values a fragment of these would have (DeviceValues.present): None and empty
    mappings dropped, falsy scalars such as 0.0 kept. Keyed by ``ValueField``: a misspelt
    field name is a type error."""
    out: dict[str, Any] = {
        k: v for k, v in values.items() if v is not None and not (type(v) is dict and not v)}
    return out


class NvmlDevice:
    """Reads one GPU. ``read_static`` once at open; ``read_fast`` / ``read_slow`` per tier."""

    def __init__(self, nvml: Any, handle: Any, index: int, info: DeviceInfo,
                 readers: Readers = ALWAYS) -> None:
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
        self.nvlink = NvLinks(self.call, readers)
        self.health = Health(self.call, info.architecture)
        self.want_pcie = Wanted(readers)  # PCIe throughput: a reader's value only
        self.want_violations = Wanted(readers)  # clock-event times: a reader's counters only
        # Slow cycles read since open or the last loss: which of them read the rare tier,
        # the spinning counters (COUNTERS_EVERY) and NVLink throughput and errors
        # (nvlink.due).
        self._slow_cycles = 0
        self._energy: float | None = None  # the last total energy read, J
        self._pcie: dict[str, float] = {}  # the last PCIe throughput read
        self._rare: DeviceValues | None = None  # rare-tier values; None: read them next cycle
        self._slow_state = DeviceValues()  # the slow tier's PCIe link and the NVLink state
        self._state_due = False  # read the NVLink state on the next cycle (after an XID)
        # The slow cycle in progress (read_fast's batch holds its field values).
        self._cycle: tuple[int, bool, dict[FieldKey, Any]] | None = None
        # static + slow state + rare, as present values: what every fast cycle starts from
        # (rebuilt when one of them changes, not every cycle).
        self._base: dict[str, Any] | None = None

    def reset_counters(self) -> None:
        """After the GPU was lost: the next cycle reads the static and rare tiers and
        every counter afresh."""
        self._slow_cycles, self._energy, self.health.events = 0, None, None
        self._rare = self.static = self._base = None  # a reset may have come with new limits
        self._pcie, self._cycle = {}, None
        self.want_pcie.reset()
        self.want_violations.reset()
        self.nvlink.reset()

    def invalidate(self) -> None:
        """An event (an XID: ECC, row remap, NVLink, fallen off the bus) may have changed
        the rare-tier values and the link state: read them on the next cycle."""
        self._rare, self._state_due, self._base = None, True, None

    def forget_unsupported(self) -> None:
        """Ask again for everything once found unsupported (after a MIG mode change), the
        rare tier and the link state on this cycle."""
        self.call.unsupported.clear()
        self.fields.dropped.clear()
        self.nvlink.absent = False
        self.invalidate()

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
            **scalars.read(self.call, errors, Tier.STATIC),
        )
        self.fans = u32(g(errors, Nvml.DEVICE_GET_NUM_FANS)) or 0
        self._base = None

    def read_fast(self, errors: Counter[ErrorReason], slow: bool = False) -> DeviceValues:
        """Cheap getters (1-30 us each, see backend.py TIERS), every --collector.interval,
        with the rare tier when it is due (``slow``: this cycle is a slow one) and the
        last rare and slow-tier state values otherwise."""
        return DeviceValues(**self.fast_values(errors, slow))

    def fast_values(self, errors: Counter[ErrorReason], slow: bool = False) -> dict[str, Any]:
        """``read_fast``'s values as a mapping of the present ones (what a sample is built
        from, without a fragment per reading). On a slow cycle the one field-values call
        of the cycle also asks for the slow tier's fields (read_slow uses them)."""
        g = self.call.get
        if self.static is None:  # lost at open, or lost and back: limits not read yet
            self.read_static(errors)
        cycle = self._slow_cycles
        rare = self._rare is None or (slow and cycle % RARE_EVERY == 0)
        if rare:
            self._rare = self.read_rare(errors)
        if slow or self._state_due:
            self.read_state(errors, nvlink=rare or self._state_due)
        if self._base is None:
            assert self.static is not None and self._rare is not None
            self._base = self.static.overlay(self._slow_state, self._rare).present()
        wanted = list(self.fast_fields.values())
        throughput_due = False
        if slow:
            throughput_due = self.nvlink.throughput_due(cycle)
            wanted += self._slow_field_keys(throughput_due)
        fv = self.fields.read(errors, wanted)
        if slow:
            self._cycle = (cycle, throughput_due, fv)
        util = g(errors, Nvml.DEVICE_GET_UTILIZATION_RATES)
        temps: dict[str, float] = {}
        temp = u32(g(errors, Nvml.DEVICE_GET_TEMPERATURE, self.c("NVML_TEMPERATURE_GPU")))
        if (celsius := gated(errors, temp, 1, "celsius")) is not None:
            temps[Sensor.GPU] = celsius
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
        out = dict(self._base)
        out.update(_present({
            "utilization_ratio": None if util is None else ratio(u32(util.gpu)),
            "memory_utilization_ratio": None if util is None else ratio(u32(util.memory)),
            "temperatures_celsius": temps,
            "fan_speed_ratio": fans,
            "clocks_hertz": clocks,
            "throttle_reasons": self._throttle(errors),
            "power_instant_watts": instant,
            "engine_utilization_ratio": engines,
        }))
        out.update(scalars.read(self.call, errors, Tier.FAST))
        out.update(memory_values(self.call, errors))
        return out

    def read_rare(self, errors: Counter[ErrorReason]) -> DeviceValues:
        """The rare tier (RARE_EVERY above): power limit, ECC totals and by location,
        remapped rows, PCIe replays."""
        g = self.call.get
        ecc: dict[str, int] = {}
        for severity, const in ECC_TYPES.items():
            v = u64(g(errors, Nvml.DEVICE_GET_TOTAL_ECC_ERRORS, self.c(const),
                      self.c("NVML_VOLATILE_ECC")))
            if v is not None:
                ecc[severity] = v
        self._base = None
        return DeviceValues(
            ecc_errors=ecc,
            ras_errors=self.health.read_ras(errors),
            **scalars.read(self.call, errors, Tier.RARE),
        ).overlay(self._remapped(errors))

    def read_state(self, errors: Counter[ErrorReason], nvlink: bool = True) -> DeviceValues:
        """Slow-tier state (read by read_fast on a slow cycle, served by it between): the
        slow rows (PCIe link now, encoder sessions); NVLink up/down when ``nvlink`` (the
        rare tier, or after an XID)."""
        if nvlink:
            self._state_due = False
        self._slow_state = DeviceValues(
            nvlink_up=self.nvlink.read_state(errors) if nvlink else self._slow_state.nvlink_up,
            **scalars.read(self.call, errors, Tier.SLOW))
        self._base = None
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
        counters whose reads spin in the driver every COUNTERS_EVERY-th time; the readings
        only a reader sees when one came since they were last taken (exporter.sources.readers)."""
        g = self.call.get
        if self._cycle is None:  # read_fast did not run this slow cycle: its own batch
            cycle = self._slow_cycles
            throughput_due = self.nvlink.throughput_due(cycle)
            values = self.fields.read(errors, self._slow_field_keys(throughput_due))
        else:
            cycle, throughput_due, values = self._cycle
        self._cycle, self._slow_cycles = None, cycle + 1
        due = cycle % COUNTERS_EVERY == 0
        if due:
            self._energy = gated(errors, u64(g(errors, Nvml.DEVICE_GET_TOTAL_ENERGY_CONSUMPTION)),
                                 1e-3, "joules")
        if self.want_pcie.due():
            pcie: dict[str, float] = {}
            for key, const in ((Direction.TX, "NVML_PCIE_UTIL_TX_BYTES"),
                               (Direction.RX, "NVML_PCIE_UTIL_RX_BYTES")):
                kb = u32(g(errors, Nvml.DEVICE_GET_PCIE_THROUGHPUT, self.c(const)))
                if (rate := gated(errors, kb, KIB, "bytes_per_second")) is not None:
                    pcie[key] = rate
            self._pcie = pcie
        errors_due = self.nvlink.errors_due(cycle)
        return DeviceValues(
            energy_joules=self._energy,
            pcie_throughput_bytes_per_second=self._pcie,
            nvlink_throughput_bytes_per_second=self.nvlink.throughput(
                errors, values, self.fields.dropped, throughput_due),
            nvlink_errors=self.nvlink.read_errors(errors, errors_due),
        ).overlay(self.health.read(errors, values,
                                   (due or self.health.events is None)
                                   and self.want_violations.due()))

    def _slow_field_keys(self, nvlink: bool) -> list[FieldKey]:
        return self.health.fields() + (self.nvlink.throughput_fields() if nvlink else [])

    def prime(self, errors: Counter[ErrorReason]) -> None:
        """At open: find the active NVLinks and take a first throughput reading, so the
        first collection already reports a rate (over the time since open)."""
        self.read_state(errors)
        if self.nvlink.remote:
            self.nvlink.throughput(errors, self.fields.read(errors, self._slow_field_keys(True)),
                                   self.fields.dropped)


def memory_values(call: Caller, errors: Counter[ErrorReason]) -> dict[str, Any]:
    """Device memory of a GPU or MIG device handle, v2 (with the reservation) where it
    answers: the present values by field name."""
    v2 = getattr(call.nvml, "nvmlMemory_v2", None)
    mem = None if v2 is None else call.get(errors, Nvml.DEVICE_GET_MEMORY_INFO, version=v2)
    if mem is not None:
        # v2 splits off the driver-reserved memory; its `used` is what nvidia-smi shows.
        return _present({"memory_total_bytes": u64(mem.total), "memory_used_bytes": u64(mem.used),
                         "memory_free_bytes": u64(mem.free),
                         "memory_reserved_bytes": u64(mem.reserved)})
    mem = call.get(errors, Nvml.DEVICE_GET_MEMORY_INFO)
    if mem is None:
        return {}
    return _present({"memory_total_bytes": u64(mem.total), "memory_used_bytes": u64(mem.used),
                     "memory_free_bytes": u64(mem.free)})


def read_memory(call: Caller, errors: Counter[ErrorReason]) -> DeviceValues:
    """``memory_values`` as a fragment."""
    return DeviceValues(**memory_values(call, errors))
