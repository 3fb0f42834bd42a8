"""Intel GPUs through Level Zero Sysman (``source="level_zero"``): opt-in, runtime-detected.

Owns: one Sysman session over the loader (ctypes, exporter.sources.intel.ze_calls) and
turning its answers into DeviceSamples joined to the i915/xe sysfs view of the same
card by PCI bus id (the collector merges them; this backend is LIBRARY priority, so its
values win and sysfs fills the rest).

Off unless ``--collector.level-zero`` (docs/vendors-intel.md says why): ``zesInit``
brings up the Intel user-space driver stack inside the exporter, needs the render node
(/dev/dri/renderD*) and can take long or fail opaquely where the kernel files answer
in microseconds.

One persistent handle: ``zesInit`` once per open, devices and their engine groups,
memory modules, power domains, temperature sensors, frequency domains and RAS error
sets enumerated once and kept. Each cycle:

- ``zesEngineGetActivity``: busy deltas per engine group -> ``engine_utilization_ratio``
  (compute, render, decoder, encoder, copy, video_enhance, video) and the busy counter
  ``engine_busy_seconds``; ZES_ENGINE_GROUP_ALL -> device ``utilization_ratio``, else
  the busiest of render and compute. Single-engine groups win over the *_ALL group of
  the same kind; several engines of a kind are averaged.
- ``zesMemoryGetState`` of device-local modules -> memory total/used/free;
  ``zesMemoryGetBandwidth`` counter deltas over the counters' own µs timestamps ->
  ``memory_bandwidth_bytes_per_second`` (first reading at open, so the first cycle has it).
- ``zesPowerGetEnergyCounter`` (device-level domains) -> energy and power from its
  delta, the counter chosen by exporter.sources.energy like the sysfs one.
- ``zesTemperatureGetState``: GPU -> "gpu", MEMORY -> "vram" (the xe name for the same
  device-local memory sensor). GLOBAL and the *_MIN sensors have no METRICS sensor.
- ``zesFrequencyGetState``: actual MHz of the GPU / MEMORY / MEDIA domains -> clock
  graphics / memory / video, properties' max -> max clock, throttle reasons.
- slow tier: ``zesRasGetState`` -> ``ras_errors`` (category, severity);
  ``zesDeviceProcessesGetState`` -> per-process device and shared memory (no ptrace).
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Sequence
from ctypes import byref, c_double, c_uint32
from dataclasses import dataclass, field

import structlog

from exporter.core import units
from exporter.core.config import Config
from exporter.core.fs import ProcFS
from exporter.core.labels import Clock, Direction, Engine, ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample, ProcessSample, pci_uuid
from exporter.sources.base import LIBRARY, PLAIN, BackendUnavailable, Cycle
from exporter.sources.energy import EnergyCounter
from exporter.sources.intel import ze_calls as ze

log = structlog.get_logger(__name__).bind(backend="level_zero")

SOURCE = "level_zero"
MHZ = 1_000_000
# Engine group -> METRICS engine label, and whether it is one engine (*_SINGLE).
ENGINES: dict[int, tuple[str, bool]] = {
    ze.ENGINE_GROUP_COMPUTE_SINGLE: ("compute", True),
    ze.ENGINE_GROUP_RENDER_SINGLE: ("render", True),
    ze.ENGINE_GROUP_MEDIA_DECODE_SINGLE: ("decoder", True),
    ze.ENGINE_GROUP_MEDIA_ENCODE_SINGLE: ("encoder", True),
    ze.ENGINE_GROUP_COPY_SINGLE: ("copy", True),
    ze.ENGINE_GROUP_MEDIA_ENHANCEMENT_SINGLE: ("video_enhance", True),
    ze.ENGINE_GROUP_MEDIA_CODEC_SINGLE: ("video", True),
    ze.ENGINE_GROUP_COMPUTE_ALL: ("compute", False),
    ze.ENGINE_GROUP_RENDER_ALL: ("render", False),
    ze.ENGINE_GROUP_COPY_ALL: ("copy", False),
    ze.ENGINE_GROUP_MEDIA_ALL: ("video", False),
}
TEMPERATURES = {ze.TEMP_SENSORS_GPU: "gpu", ze.TEMP_SENSORS_MEMORY: "vram"}
CLOCKS = {ze.FREQ_DOMAIN_GPU: Clock.GRAPHICS, ze.FREQ_DOMAIN_MEMORY: Clock.MEMORY,
          ze.FREQ_DOMAIN_MEDIA: Clock.VIDEO}
# zes_freq_throttle_reason_flag_t -> METRICS reason, as the sysfs PERF_LIMIT_REASONS
# bits map (intel_parse.THROTTLE_REASONS): PL1/PL2 sw_power_cap, PL4/current hw_slowdown,
# thermal sw_thermal; a PSU assertion is NVML's hardware power brake. SW_RANGE/HW_RANGE
# (a frequency range set by software or another block) have no METRICS reason.
THROTTLE = {ze.THROTTLE_AVE_PWR_CAP: "sw_power_cap", ze.THROTTLE_BURST_PWR_CAP: "sw_power_cap",
            ze.THROTTLE_CURRENT_LIMIT: "hw_slowdown", ze.THROTTLE_THERMAL_LIMIT: "sw_thermal",
            ze.THROTTLE_PSU_ALERT: "hw_power_brake"}


@dataclass
class _Engine:
    handle: ctypes.c_void_p
    label: str
    single: bool
    last: tuple[int, int] | None = None  # (activeTime µs, timestamp µs)


@dataclass
class _Device:
    handle: ctypes.c_void_p
    info: DeviceInfo
    engines: list[_Engine] = field(default_factory=list)
    all_engines: list[_Engine] = field(default_factory=list)  # ZES_ENGINE_GROUP_ALL
    memory: list[ctypes.c_void_p] = field(default_factory=list)  # device-local modules
    bandwidth: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # read, write, ts
    power: list[ctypes.c_void_p] = field(default_factory=list)  # device-level domains
    energy: EnergyCounter | None = None
    temps: list[tuple[ctypes.c_void_p, str]] = field(default_factory=list)
    freqs: list[tuple[ctypes.c_void_p, str, float | None]] = field(default_factory=list)
    ras: list[tuple[ctypes.c_void_p, str]] = field(default_factory=list)
    slow: _Slow | None = None  # last slow-tier values


@dataclass(frozen=True)
class _Slow:
    ras: dict[tuple[str, str], int]
    processes: tuple[ProcessSample, ...]


class LevelZeroBackend:
    name = "level_zero"
    source = SOURCE
    priority = LIBRARY
    capabilities = PLAIN
    interval: float | None = None

    def __init__(self, config: Config, library: str | None = None) -> None:
        self._library = library  # tests: their compiled stub; users: ze_calls.LIBRARY
        self._proc = ProcFS(config.procfs)
        self._caller: ze.Caller | None = None
        self._devices: list[_Device] = []

    # -- lifecycle ------------------------------------------------------------------
    def open(self) -> Sequence[DeviceInfo]:
        name = self._library or ze.LIBRARY
        try:
            lib = ze.load(self._library)
        except OSError as e:
            raise BackendUnavailable(f"Level Zero loader {name} not found: {e}") from e
        caller = ze.Caller(lib)
        if not caller.has("zesInit"):
            raise BackendUnavailable(
                f"{name} has no zesInit (a Level Zero loader older than spec 1.5)")
        code = int(lib.zesInit(0))
        if code != ze.SUCCESS:
            raise BackendUnavailable(f"zesInit failed: {ze.result_name(code)}")
        errors: Counter[ErrorReason] = Counter()
        devices = []
        count = c_uint32(0)
        if caller.call(errors, "zesDriverGet", None, byref(count), None) and count.value:
            drivers = (ctypes.c_void_p * count.value)()
            caller.call(errors, "zesDriverGet", None, byref(count), drivers)
            for driver in drivers[: count.value]:
                for handle in caller.handles(errors, "zesDeviceGet", ctypes.c_void_p(driver)):
                    device = self._device(caller, handle, errors)
                    if device is not None:
                        devices.append(device)
        if not devices:
            raise BackendUnavailable("Level Zero Sysman reports no device with a PCI address")
        self._caller, self._devices = caller, devices
        return [d.info for d in devices]

    def close(self) -> None:
        # Sysman has no shutdown call; dropping the handles is all there is.
        self._caller, self._devices = None, []

    def _device(self, caller: ze.Caller, handle: ctypes.c_void_p,
                errors: Counter[ErrorReason]) -> _Device | None:
        pci = ze.ZesPciProperties(stype=ze.STYPE_PCI_PROPERTIES)
        try:
            if not caller.call(errors, "zesDevicePciGetProperties", handle, byref(pci)):
                return None  # no join key: sysfs could never be merged with it
            a = pci.address
            bus_id = f"{a.domain:04x}:{a.bus:02x}:{a.device:02x}.{a.function:x}"
            props = ze.ZesDeviceProperties(stype=ze.STYPE_DEVICE_PROPERTIES)
            props.core.stype = ze.ZE_STYPE_DEVICE_PROPERTIES
            have = caller.call(errors, "zesDeviceGetProperties", handle, byref(props))
            serial = ze.text(props.serialNumber) if have else ""
            info = DeviceInfo(
                vendor="intel", pci_bus_id=bus_id, uuid=pci_uuid(bus_id),
                name=(ze.text(props.modelName) or ze.text(props.core.name)) if have else "",
                driver_version=ze.text(props.driverVersion) if have else "",
                serial="" if serial.lower() in ("", "unknown") else serial,
            )
            device = _Device(handle, info, energy=EnergyCounter(bus_id))
            _enumerate(caller, device, errors)
            # A first reading of the byte counters, so the first collection already
            # reports a bandwidth (over the counters' time since open).
            _bandwidth(caller, device, errors)
        except ze.DeviceLost:
            return None
        return device

    # -- sampling ---------------------------------------------------------------------
    def sample(self, slow: bool) -> Cycle:
        caller = self._caller
        if caller is None:
            return Cycle(devices=())
        errors: Counter[ErrorReason] = Counter()
        samples = []
        for device in self._devices:
            try:
                samples.append(self._read(caller, device, slow, errors))
            except ze.DeviceLost:
                errors[ErrorReason.GPU_LOST] += 1
                samples.append(DeviceSample(info=device.info, source=SOURCE, up=False))
        return Cycle(devices=samples, errors=dict(errors))

    def _read(self, caller: ze.Caller, d: _Device, slow: bool,
              errors: Counter[ErrorReason]) -> DeviceSample:
        engines, busy, device_ratio = _engines(caller, d, errors)
        total = used = free = None
        for module in d.memory:
            state = ze.ZesMemState(stype=ze.STYPE_MEM_STATE)
            if caller.call(errors, "zesMemoryGetState", module, byref(state)):
                size = _bounded(state.size, "bytes", errors)
                avail = _bounded(state.free, "bytes", errors)
                if size is not None and avail is not None and avail <= size:
                    total, free = (total or 0.0) + size, (free or 0.0) + avail
                    used = (used or 0.0) + size - avail
        joules = watts = None
        if d.energy is not None and d.power:
            readings: dict[str, float | None] = {}
            stamps: dict[str, float] = {}  # each counter's own µs timestamp, in seconds
            for i, domain in enumerate(d.power):
                counter = ze.ZesPowerEnergyCounter()
                ok = caller.call(errors, "zesPowerGetEnergyCounter", domain, byref(counter))
                readings[str(i)] = units.scaled(counter.energy, 1e-6, "joules") if ok else None
                stamps[str(i)] = counter.timestamp / 1e6
            joules, watts = d.energy.update(list(readings), readings, stamps)
        temps: dict[str, float] = {}
        for sensor, label in d.temps:
            celsius = c_double()
            if caller.call(errors, "zesTemperatureGetState", sensor, byref(celsius)):
                value = _bounded(celsius.value, "celsius", errors)
                if value is not None:
                    temps.setdefault(label, value)
        clocks, max_clocks, throttle = _frequencies(caller, d, errors)
        if slow or d.slow is None:
            d.slow = _Slow(_ras(caller, d, errors), self._processes(caller, d, errors))
        return DeviceSample(
            info=d.info, source=SOURCE,
            utilization_ratio=device_ratio,
            memory_total_bytes=total, memory_used_bytes=used, memory_free_bytes=free,
            temperatures_celsius=temps,
            power_watts=watts, energy_joules=joules,
            clocks_hertz=clocks, clocks_max_hertz=max_clocks, throttle_reasons=throttle,
            engine_utilization_ratio=engines, engine_busy_seconds=busy,
            memory_bandwidth_bytes_per_second=_bandwidth(caller, d, errors),
            ras_errors=d.slow.ras,
            processes=d.slow.processes,
        )

    def _processes(self, caller: ze.Caller, d: _Device,
                   errors: Counter[ErrorReason]) -> tuple[ProcessSample, ...]:
        count = c_uint32(0)
        fn = "zesDeviceProcessesGetState"
        if not caller.call(errors, fn, d.handle, byref(count), None) or not count.value:
            return ()
        states = (ze.ZesProcessState * count.value)()
        for state in states:
            state.stype = ze.STYPE_PROCESS_STATE
        if not caller.call(errors, fn, d.handle, byref(count), states):
            return ()
        out = []
        for state in states[: min(count.value, len(states))]:
            comm = self._proc.read_bytes(str(state.processId), "comm")
            out.append(ProcessSample(
                pid=int(state.processId), process=units.process_name(comm),
                memory_used_bytes=_bounded(state.memSize, "bytes", errors),
                shared_memory_used_bytes=_bounded(state.sharedSize, "bytes", errors)))
        return tuple(out)


def _enumerate(caller: ze.Caller, d: _Device, errors: Counter[ErrorReason]) -> None:
    """Component handles of one device, with the static properties that sort them."""
    for handle in caller.handles(errors, "zesDeviceEnumEngineGroups", d.handle):
        props = ze.ZesEngineProperties(stype=ze.STYPE_ENGINE_PROPERTIES)
        if not caller.call(errors, "zesEngineGetProperties", handle, byref(props)):
            continue
        if props.type == ze.ENGINE_GROUP_ALL:
            d.all_engines.append(_Engine(handle, "all", False))
        elif props.type in ENGINES:
            d.engines.append(_Engine(handle, *ENGINES[props.type]))
    for handle in caller.handles(errors, "zesDeviceEnumMemoryModules", d.handle):
        mem = ze.ZesMemProperties(stype=ze.STYPE_MEM_PROPERTIES)
        if caller.call(errors, "zesMemoryGetProperties", handle, byref(mem)) \
                and mem.location == ze.MEM_LOC_DEVICE:
            d.memory.append(handle)
    for handle in caller.handles(errors, "zesDeviceEnumPowerDomains", d.handle):
        power = ze.ZesPowerProperties(stype=ze.STYPE_POWER_PROPERTIES)
        if caller.call(errors, "zesPowerGetProperties", handle, byref(power)) \
                and not power.onSubdevice:
            d.power.append(handle)
    for handle in caller.handles(errors, "zesDeviceEnumTemperatureSensors", d.handle):
        temp = ze.ZesTempProperties(stype=ze.STYPE_TEMP_PROPERTIES)
        if caller.call(errors, "zesTemperatureGetProperties", handle, byref(temp)) \
                and temp.type in TEMPERATURES:
            d.temps.append((handle, TEMPERATURES[temp.type]))
    for handle in caller.handles(errors, "zesDeviceEnumFrequencyDomains", d.handle):
        freq = ze.ZesFreqProperties(stype=ze.STYPE_FREQ_PROPERTIES)
        if caller.call(errors, "zesFrequencyGetProperties", handle, byref(freq)) \
                and freq.type in CLOCKS:
            top = units.scaled(freq.max, MHZ, "hertz") if freq.max > 0 else None
            d.freqs.append((handle, CLOCKS[freq.type], top))
    for handle in caller.handles(errors, "zesDeviceEnumRasErrorSets", d.handle):
        ras = ze.ZesRasProperties(stype=ze.STYPE_RAS_PROPERTIES)
        if caller.call(errors, "zesRasGetProperties", handle, byref(ras)):
            severity = "corrected" if ras.type == ze.RAS_ERROR_TYPE_CORRECTABLE \
                else "uncorrected"
            d.ras.append((handle, severity))


def _bounded(value: float | int, unit: str, errors: Counter[ErrorReason]) -> float | None:
    out = units.bounded(value, unit)
    if out is None:
        errors[ErrorReason.PARSE] += 1
    return out


def _engines(caller: ze.Caller, d: _Device, errors: Counter[ErrorReason]
             ) -> tuple[dict[str, float], dict[str, float], float | None]:
    """(engine -> busy ratio since the last cycle, engine -> busy seconds, device ratio)."""
    ratios: dict[str, list[float]] = {}
    busy: dict[str, float] = {}
    singles = {e.label for e in d.engines if e.single}
    device_ratio = None
    for engine in d.engines + d.all_engines:
        if not engine.single and engine.label in singles:
            continue  # the single engines of this kind are read one by one
        stats = ze.ZesEngineStats()
        if not caller.call(errors, "zesEngineGetActivity", engine.handle, byref(stats)):
            continue
        now = (int(stats.activeTime), int(stats.timestamp))
        previous, engine.last = engine.last, now
        ratio = None
        if previous is not None and now[1] > previous[1] and now[0] >= previous[0]:
            ratio = units.clamp_ratio((now[0] - previous[0]) / (now[1] - previous[1]))
        if engine.label == "all":
            device_ratio = ratio
            continue
        seconds = units.scaled(now[0], 1e-6, "seconds")
        if seconds is not None:
            busy[engine.label] = busy.get(engine.label, 0.0) + seconds
        if ratio is not None:
            ratios.setdefault(engine.label, []).append(ratio)
    engines = {label: sum(rs) / len(rs) for label, rs in ratios.items()}
    if device_ratio is None and not d.all_engines:
        device_ratio = max((engines[k] for k in (Engine.RENDER, Engine.COMPUTE) if k in engines),
                           default=None)
    return engines, busy, device_ratio


def _bandwidth(caller: ze.Caller, d: _Device, errors: Counter[ErrorReason]) -> dict[str, float]:
    """Read/write B/s from the memory modules' byte counters between two readings, over
    the time between the readings' own timestamps (zes_mem_bandwidth_t.timestamp, µs), not
    the wall clock between the calls."""
    rates: dict[str, float] = {}
    for i, module in enumerate(d.memory):
        bw = ze.ZesMemBandwidth()
        if not caller.call(errors, "zesMemoryGetBandwidth", module, byref(bw)):
            continue
        now = (int(bw.readCounter), int(bw.writeCounter), int(bw.timestamp))
        previous, d.bandwidth[i] = d.bandwidth.get(i), now
        if previous is None or now[2] <= previous[2]:
            continue
        seconds = (now[2] - previous[2]) / 1e6
        for direction, k in ((Direction.READ, 0), (Direction.WRITE, 1)):
            if now[k] >= previous[k]:
                rate = units.bounded((now[k] - previous[k]) / seconds, "bytes_per_second")
                if rate is not None:
                    rates[direction] = rates.get(direction, 0.0) + rate
    return rates


def _frequencies(caller: ze.Caller, d: _Device, errors: Counter[ErrorReason]
                 ) -> tuple[dict[str, float], dict[str, float], dict[str, bool]]:
    clocks: dict[str, float] = {}
    max_clocks: dict[str, float] = {}
    throttle: dict[str, bool] = {}
    for handle, label, top in d.freqs:
        if top is not None:
            max_clocks.setdefault(label, top)
        state = ze.ZesFreqState(stype=ze.STYPE_FREQ_STATE)
        if not caller.call(errors, "zesFrequencyGetState", handle, byref(state)):
            continue
        if state.actual >= 0:  # negative: "not known"
            actual = units.scaled(state.actual, MHZ, "hertz")
            if actual is None:
                errors[ErrorReason.PARSE] += 1
            elif label not in clocks:
                clocks[label] = actual
        if label == Clock.GRAPHICS and not throttle:
            for bit, reason in THROTTLE.items():
                throttle[reason] = throttle.get(reason, False) or bool(
                    state.throttleReasons & bit)
    return clocks, max_clocks, throttle


def _ras(caller: ze.Caller, d: _Device, errors: Counter[ErrorReason]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for handle, severity in d.ras:
        state = ze.ZesRasState(stype=ze.STYPE_RAS_STATE)
        if not caller.call(errors, "zesRasGetState", handle, 0, byref(state)):
            continue
        for block, count in zip(ze.RAS_CATEGORIES, state.category, strict=True):
            if _bounded(count, "count", errors) is not None:
                key = (block, severity)
                out[key] = out.get(key, 0) + int(count)
    return out
