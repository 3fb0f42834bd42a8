"""The NVIDIA backend: NVML through nvidia-ml-py, one ``nvmlInit`` per open handle.

Owns the NVML handle, the per-GPU readers (``nvml_device`` with ``nvml_fields``,
``nvml_nvlink`` and ``nvml_health``; ``nvml_processes``), MIG instances (``nvml_mig``),
GPM profiling (``nvml_gpm``) and the XID event set (``nvml_events``). ``open()``
initialises NVML once and reads what is static; ``sample()`` reads the fast tier
every cycle and the slow tier when the collector says it is due, reusing the last
slow values in between; ``close()`` shuts NVML down (the collector reopens with
back-off after BackendFailed).

XID: every GPU registered on the event set exports ``xid_errors`` from its first
cycle with the code 0 at 0 (NVIDIA's XID catalogue has no code 0, so it is never
counted): the marker that XID counting is on for that GPU, and the series that makes
the per-GPU sum exist before the first event, so ``increase()`` over the sum sees the
first XID. Each real code counts from 1; ``xid_last_timestamp_seconds`` is the wall
clock of the newest event (the exporter's, taken when the cycle drained the set), and
``xid_info`` says what each counted code means (exporter.core.xid). A GPU counts at most
``xid.MAX_CODES`` distinct codes; the events of any code past them count under
``xid.OTHER`` (``xid="other"``), so the driver cannot grow the series without bound.

Tiers: see TIERS below, measured with bench/nvml_calls.py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import structlog

from exporter.core.config import Config
from exporter.core.fs import ProcFS
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample, DeviceValues
from exporter.core.xid import MAX_CODES as MAX_XID_CODES
from exporter.core.xid import OTHER as XID_OTHER
from exporter.core.xid import meaning as xid_meaning
from exporter.sources.base import LIBRARY, BackendFailed, BackendUnavailable, Capabilities, Cycle
from exporter.sources.nvidia.calls import GpuLost, Nvml, text
from exporter.sources.nvidia.device import GPM_SOURCE, SOURCE, NvmlDevice, read_info
from exporter.sources.nvidia.events import XidEvents
from exporter.sources.nvidia.gpm import GpmSampler, GpmUnsupported
from exporter.sources.nvidia.mig import MigReader
from exporter.sources.nvidia.processes import ProcessReader
from exporter.sources.readers import ALWAYS, Readers, Wanted

log = structlog.get_logger(__name__)

# TIERS. bench/nvml_calls.py on the lent NVIDIA H200 (Hopper, driver 580.159.04), median
# of up to 200 calls, microseconds, under a matmul load:
#   fast (every cycle): UtilizationRates 1.0, MemoryInfo v2 7.1, Temperature 1.2,
#     PowerUsage 1.1, EnforcedPowerLimit 1.0, ClockInfo 1.2 (x4), PerformanceState 1.0,
#     ClocksEventReasons 1.0, CurrPcieLinkGeneration 0.9, CurrPcieLinkWidth 25.9,
#     Encoder/Decoder/Jpg/OfaUtilization 1.2 each, TotalEccErrors 1.6 (x2), RemappedRows 1.6,
#     FieldValues(MEMORY_TEMP) 2.4, ComputeRunningProcesses 25.9,
#     GraphicsRunningProcesses 9.7, EventSetWait_v2(0) 2.2 -> a whole fast cycle took
#     0.8-1.2 ms for one GPU including Python and /proc reads.
#   slow (--collector.slow-interval): PcieThroughput 20785 (x2: tx, rx),
#     TotalEnergyConsumption 3209 (p90 7007; the TOTAL_ENERGY field value is no cheaper:
#     3897), ProcessUtilization 1798,
#     GPM SampleGet+MetricsGet 1342, PcieReplayCounter 130 (100x a plain getter; a
#     counter loses nothing by being read less often) -> about 58 ms per GPU.
#   Of the fast getters, EnforcedPowerLimit, TotalEccErrors and RemappedRows are read on
#     the rare tier and CurrPcieLinkGeneration/Width and NvLinkState on the slow one
#     (device.py RARE_EVERY: cadence per field).
#   static (at open): TemperatureThreshold 1.1 (x4), MaxClockInfo 1206 (x4),
#     MaxPcieLinkGeneration/Width 0.9, NumFans 0.9. nvmlInit itself: 9991 cold, 9543 warm.


class _Gpu:
    """One GPU's readers and its last slow-tier values."""

    def __init__(self, dev: NvmlDevice, procs: ProcessReader, gpm: GpmSampler | None,
                 mig: MigReader, readers: Readers = ALWAYS) -> None:
        self.dev = dev
        self.procs = procs
        self.gpm = gpm
        self.mig = mig
        self.want_gpm = Wanted(readers)  # GPM ratios: a reader's values only
        self.slow: DeviceValues | None = None  # not read yet
        self.profiling: dict[str, float] = {}
        # The slow values, XID counts and profiling ratios as present values, with the
        # sources they name: rebuilt when one of them changes, not every fast cycle.
        self.tail: tuple[dict[str, Any], Mapping[str, str]] | None = None


ALL_LOST_REINIT = 5  # cycles with every GPU lost before NVML is shut down and re-initialised
XID_MARKER = 0  # the always-0 code of every GPU registered for XID events (module docstring)
MAX_XID = 0xFFFF  # XID codes are small numbers; event data beyond this is not a code


class NvidiaBackend:
    name = "nvidia"
    source = SOURCE
    priority = LIBRARY
    interval: float | None = None

    def __init__(self, config: Config, nvml: ModuleType | Any | None = None,
                 readers: Readers = ALWAYS) -> None:
        self._config = config
        self._module = nvml
        self._readers = readers  # who read the served values since (exporter.sources.readers)
        self._nvml: Any = None
        self._gpus: list[_Gpu] = []
        self._events: XidEvents | None = None
        # uuid -> xid -> count, uuid -> wall clock and code of the newest event; kept
        # across close/open so the counters never go back.
        self._xids: dict[str, Counter[int]] = {}
        self._xid_last_at: dict[str, float] = {}
        self._xid_last: dict[str, int] = {}  # uuid -> code of the newest XID event
        self._xid_seen: dict[str, dict[int, float]] = {}  # uuid -> code -> its newest event
        self._proc = ProcFS(config.procfs)
        self._all_lost_cycles = 0
        self._gpm_reason: str | None = "NVML is not open"

    def open(self) -> Sequence[DeviceInfo]:
        nvml = self._module
        if nvml is None:
            try:
                import pynvml
            except ImportError as e:
                raise BackendUnavailable(f"nvidia-ml-py (pynvml) is not installed: {e}") from e
            nvml = pynvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise BackendUnavailable(f"NVML could not start: {e}") from e
        self._nvml = nvml
        try:
            self._open_devices(nvml)
        except nvml.NVMLError as e:
            self.close()
            raise BackendUnavailable(f"NVML could not list GPUs: {e}") from e
        if not self._gpus:
            self.close()
            raise BackendUnavailable("NVML found no usable NVIDIA GPU")
        return [g.dev.info for g in self._gpus]

    def _open_devices(self, nvml: Any) -> None:
        driver = text(nvml.nvmlSystemGetDriverVersion())
        gpm_wanted = self._config.collector_enabled("gpm") is not False
        handles: dict[str, Any] = {}
        errors: Counter[ErrorReason] = Counter()
        self._gpm_reason = "no GPU" if gpm_wanted else "--no-collector.gpm"
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                info = read_info(nvml, handle, driver)
            except nvml.NVMLError as e:
                log.warning("nvml_gpu_unreadable_at_open", index=index, reason=str(e))
                continue
            dev = NvmlDevice(nvml, handle, index, info, self._readers)
            try:
                dev.read_static(errors)
                dev.prime(errors)
            except GpuLost as e:
                # NVML still knows it: keep it, so it reports gpu_up 0 rather than vanishing.
                log.warning("nvml_gpu_lost", nvml_index=index, uuid=info.uuid, reason=str(e))
            gpm = None
            if gpm_wanted:
                try:
                    gpm = GpmSampler(nvml, handle)
                except (GpmUnsupported, nvml.NVMLError) as e:
                    log.info("nvml_gpm_unavailable", nvml_index=index, reason=str(e))
                    if self._gpm_reason is not None:
                        self._gpm_reason = f"GPU {index}: {e}"
                else:
                    self._gpm_reason = None
            handles[info.uuid] = handle
            mig = MigReader(nvml, dev, self._proc, gpm_wanted)
            self._gpus.append(_Gpu(dev, ProcessReader(nvml, dev.call, self._proc), gpm, mig,
                                   self._readers))
        try:
            self._events = XidEvents(nvml, handles)
        except nvml.NVMLError as e:
            log.info("nvml_xid_events_unavailable", reason=str(e))
        for uuid in self._events.registered if self._events else ():
            self._xids.setdefault(uuid, Counter())[XID_MARKER] += 0

    @property
    def capabilities(self) -> Capabilities:
        """After open(): why no GPU serves ``gpm`` profiling, or None (asked when
        --collector.gpm is forced on)."""
        return Capabilities(features={"gpm": self._gpm_reason})

    def sample(self, slow: bool) -> Cycle:
        if self._nvml is None:
            raise BackendFailed("NVML is not open")
        errors: Counter[ErrorReason] = Counter()
        self._drain_xids(errors)
        devices: list[DeviceSample] = []
        for g in self._gpus:
            devices.extend(self._sample_gpu(g, slow, errors))
        # Every GPU gone (a reset, a driver reload under us): the handles may never answer
        # again, so let the collector shut NVML down and initialise it anew, with back-off.
        self._all_lost_cycles = self._all_lost_cycles + 1 if not any(d.up for d in devices) else 0
        if self._all_lost_cycles >= ALL_LOST_REINIT:
            self._all_lost_cycles = 0
            raise BackendFailed(
                f"every GPU lost for {ALL_LOST_REINIT} cycles: re-initialising NVML")
        return Cycle(devices=devices, errors=dict(errors))

    def _drain_xids(self, errors: Counter[ErrorReason]) -> None:
        if self._events is None:
            return
        events, failed = self._events.drain()
        now = time.time()
        for uuid, xid in events:
            if not 0 < xid <= MAX_XID:
                errors[ErrorReason.PARSE] += 1
                continue
            counts = self._xids.setdefault(uuid, Counter())
            code = xid
            if xid not in counts and len(counts.keys() - {XID_MARKER, XID_OTHER}) >= MAX_XID_CODES:
                code = XID_OTHER  # past the bound: one series for every other code
            counts[code] += 1
            self._xid_last_at[uuid] = now
            self._xid_last[uuid] = xid  # a gauge's value (DCGM's last code), not a label
            self._xid_seen.setdefault(uuid, {})[code] = now
            for g in self._gpus:  # an XID may come with an ECC error or a row remap
                if g.dev.info.uuid == uuid:
                    g.dev.invalidate()
                    g.tail = None  # its XID counts changed
        if failed:
            errors[ErrorReason.XID_EVENT] += failed

    def _sample_gpu(self, g: _Gpu, slow: bool, errors: Counter[ErrorReason]) -> list[DeviceSample]:
        """The GPU's sample, then one per MIG instance."""
        try:
            first = g.slow is None  # the first cycle fills the slow values too
            g.mig.refresh(errors, slow or first)
            values = g.dev.fast_values(errors, slow or first)
            if slow or first:
                g.slow, g.tail = g.dev.read_slow(errors), None
                if not g.mig.enabled:
                    g.procs.read_utilization(errors)
                if g.gpm is not None and g.want_gpm.due():
                    g.profiling = self._gpm(g, errors)
            # With MIG on, processes belong to their instance (read on its handle), not twice.
            processes = () if g.mig.enabled else g.procs.read(
                errors, slow, values.get("memory_total_bytes"))
            instances = g.mig.sample(errors, slow) if g.mig.enabled else []
        except GpuLost:
            # Counted here; the change of state is logged once by the collector.
            errors[ErrorReason.GPU_LOST] += 1
            g.slow, g.profiling, g.tail = None, {}, None  # re-read in full once it answers
            g.want_gpm.reset()
            g.dev.reset_counters()
            return [DeviceSample(info=g.dev.info, source=SOURCE, up=False), *g.mig.down()]
        tail, sources = g.tail or self._tail(g)
        values.update(tail)
        parent = DeviceSample(info=g.dev.info, source=SOURCE, field_sources=sources,
                              processes=processes, **values)
        return [parent, *instances]

    def _tail(self, g: _Gpu) -> tuple[dict[str, Any], Mapping[str, str]]:
        """What a GPU's sample takes on top of its fast values until the next slow cycle or
        XID: the slow values, the XID counts, the GPM ratios under their own source (as
        ``nvml_sample`` builds it for a MIG device)."""
        uuid = g.dev.info.uuid
        xids = self._xids.get(uuid)
        xid = DeviceValues(
            xid_errors={} if xids is None else dict(xids),
            xid_info={} if xids is None else {(code, xid_meaning(code)): True
                                              for code in xids if code != XID_MARKER},
            xid_last_timestamp_seconds=self._xid_last_at.get(uuid),
            xid_last=self._xid_last.get(uuid, 0 if xids is not None else None),
            xid_seen_seconds=dict(self._xid_seen.get(uuid, {})))
        assert g.slow is not None
        tail = g.slow.overlay(xid, DeviceValues(profiling_ratio=dict(g.profiling))).present()
        sources: Mapping[str, str] = {"profiling_ratio": GPM_SOURCE} if g.profiling else {}
        g.tail = (tail, sources)
        return g.tail

    def _gpm(self, g: _Gpu, errors: Counter[ErrorReason]) -> dict[str, float]:
        assert g.gpm is not None
        try:
            return g.gpm.sample()
        except self._nvml.NVMLError as e:
            g.dev.call.failed(errors, e, Nvml.GPM_SAMPLE_GET)
            if g.dev.call.absent(Nvml.GPM_SAMPLE_GET):
                g.gpm.close()
                g.gpm = None
            return {}

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        for g in self._gpus:
            if g.gpm is not None:
                g.gpm.close()
            g.mig.close()
        self._gpus = []
        if self._events is not None:
            self._events.close()
            self._events = None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:
            log.info("nvml_shutdown_failed", reason=str(e))
