"""The NVIDIA backend: NVML through nvidia-ml-py, one ``nvmlInit`` per open handle.

Owns the NVML handle, the per-GPU readers (``nvml_device``, ``nvml_processes``),
GPM profiling (``nvml_gpm``) and the XID event set (``nvml_events``). ``open()``
initialises NVML once and reads what is static; ``sample()`` reads the fast tier
every cycle and the slow tier when the collector says it is due, reusing the last
slow values in between; ``close()`` shuts NVML down (the collector reopens with
back-off after BackendFailed).

Tiers: see TIERS below, measured with bench/nvml_calls.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import structlog

from exporter.backends.base import LIBRARY, BackendFailed, BackendUnavailable, Cycle
from exporter.backends.nvml_calls import GpuLost, text
from exporter.backends.nvml_device import NvmlDevice, read_info
from exporter.backends.nvml_events import XidEvents
from exporter.backends.nvml_gpm import GpmSampler, GpmUnsupported
from exporter.backends.nvml_processes import ProcessReader
from exporter.config import Config
from exporter.fs import ProcFS
from exporter.model import DeviceInfo, DeviceSample

log = structlog.get_logger(__name__)

SOURCE = "nvml"
GPM_SOURCE = "nvml_gpm"

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
#   static (at open): TemperatureThreshold 1.1 (x4), MaxClockInfo 1206 (x4),
#     MaxPcieLinkGeneration/Width 0.9, NumFans 0.9. nvmlInit itself: 9991 cold, 9543 warm.


class _Gpu:
    """One GPU's readers and its last slow-tier values."""

    def __init__(self, dev: NvmlDevice, procs: ProcessReader, gpm: GpmSampler | None) -> None:
        self.dev = dev
        self.procs = procs
        self.gpm = gpm
        self.slow: dict[str, Any] = {}
        self.profiling: dict[str, float] = {}


ALL_LOST_REINIT = 5  # cycles with every GPU lost before NVML is shut down and re-initialised


class NvidiaBackend:
    name = "nvidia"
    priority = LIBRARY
    interval: float | None = None

    def __init__(self, config: Config, nvml: ModuleType | Any | None = None) -> None:
        self._config = config
        self._module = nvml
        self._nvml: Any = None
        self._gpus: list[_Gpu] = []
        self._events: XidEvents | None = None
        # uuid -> xid -> count; kept across close/open so the counters never go back.
        self._xids: dict[str, Counter[int]] = {}
        self._proc = ProcFS(config.procfs)
        self._all_lost_cycles = 0

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
        errors: Counter[str] = Counter()
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                info = read_info(nvml, handle, driver)
            except nvml.NVMLError as e:
                log.warning("nvml_gpu_unreadable_at_open", index=index, reason=str(e))
                continue
            dev = NvmlDevice(nvml, handle, index, info)
            try:
                dev.read_static(errors)
            except GpuLost as e:
                # NVML still knows it: keep it, so it reports gpu_up 0 rather than vanishing.
                log.warning("nvml_gpu_lost", gpu=index, uuid=info.uuid, reason=str(e))
            gpm = None
            if gpm_wanted:
                try:
                    gpm = GpmSampler(nvml, handle)
                except (GpmUnsupported, nvml.NVMLError) as e:
                    log.info("nvml_gpm_unavailable", gpu=index, reason=str(e))
            handles[info.uuid] = handle
            self._gpus.append(_Gpu(dev, ProcessReader(nvml, dev.call, self._proc), gpm))
        try:
            self._events = XidEvents(nvml, handles)
        except nvml.NVMLError as e:
            log.info("nvml_xid_events_unavailable", reason=str(e))

    def sample(self, slow: bool) -> Cycle:
        if self._nvml is None:
            raise BackendFailed("NVML is not open")
        errors: Counter[str] = Counter()
        self._drain_xids(errors)
        devices = [self._sample_gpu(g, slow, errors) for g in self._gpus]
        # Every GPU gone (a reset, a driver reload under us): the handles may never answer
        # again, so let the collector shut NVML down and initialise it anew, with back-off.
        self._all_lost_cycles = self._all_lost_cycles + 1 if not any(d.up for d in devices) else 0
        if self._all_lost_cycles >= ALL_LOST_REINIT:
            self._all_lost_cycles = 0
            raise BackendFailed(
                f"every GPU lost for {ALL_LOST_REINIT} cycles: re-initialising NVML")
        return Cycle(devices=devices, errors=dict(errors))

    def _drain_xids(self, errors: Counter[str]) -> None:
        if self._events is None:
            return
        events, failed = self._events.drain()
        for uuid, xid in events:
            self._xids.setdefault(uuid, Counter())[xid] += 1
        if failed:
            errors["xid_event"] += failed

    def _sample_gpu(self, g: _Gpu, slow: bool, errors: Counter[str]) -> DeviceSample:
        info = g.dev.info
        try:
            values = g.dev.read_fast(errors)
            if slow or not g.slow:  # the first cycle fills the slow values too
                g.slow = g.dev.read_slow(errors)
                g.procs.read_utilization(errors)
                if g.gpm is not None:
                    g.profiling = self._gpm(g, errors)
            processes = g.procs.read(errors)
        except GpuLost:
            # Counted here; the change of state is logged once by the collector.
            errors["gpu_lost"] += 1
            g.slow, g.profiling = {}, {}  # re-read in full once the GPU answers again
            return DeviceSample(info=info, source=SOURCE, up=False)
        values.update(g.slow)
        return DeviceSample(
            info=info,
            source=SOURCE,
            field_sources={"profiling_ratio": GPM_SOURCE} if g.profiling else {},
            profiling_ratio=dict(g.profiling),
            xid_errors=dict(self._xids.get(info.uuid, {})),
            processes=processes,
            **values,
        )

    def _gpm(self, g: _Gpu, errors: Counter[str]) -> dict[str, float]:
        assert g.gpm is not None
        try:
            return g.gpm.sample()
        except self._nvml.NVMLError as e:
            g.dev.call.failed(errors, ("nvmlGpmSampleGet", ()), e)
            if ("nvmlGpmSampleGet", ()) in g.dev.call.unsupported:
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
        self._gpus = []
        if self._events is not None:
            self._events.close()
            self._events = None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:
            log.info("nvml_shutdown_failed", reason=str(e))
