"""AMD GPUs through the AMD SMI Python package (``amdsmi``, ROCm's ``libamd_smi.so``).

Reports what the amdgpu sysfs files lack or get wrong on Instinct: per-block RAS,
XGMI links, compute/memory partition modes, partitions as devices of their own, and
per-process VRAM and engine time without ptrace. Source ``amdsmi``, priority LIBRARY:
the collector's merge makes its values primary for the GPUs it shares (by PCI bus id)
with the sysfs backend, and sysfs fills the rest.

The package is optional (``pip install '.[amd]'`` from the checkout); ``build_backends`` adds
this backend only when it is importable or ``--collector.amdsmi`` forces it on, so a
machine without it has no ``backend="amdsmi"`` series at all. ``amdsmi_init`` runs once
per open (AMD GPUs only); the collector's re-open after ``BackendFailed`` shuts it down
and initialises again with back-off.

Partitions: in a CPX/DPX/... compute mode amdsmi lists one handle per partition; the
partitions of one GPU share the PCI device and differ in the BDF function
(``0000:05:00.0``, ``0000:05:00.1``). The GPU itself (key: its function-0 bus id, as
sysfs sees it) carries the device-wide values read from its first partition; each
partition is a slice (``parent_key``, ``slice_labels={"partition_id": ...}``, key
``<bus id>:partition<N>``) with its own activity, VRAM and processes. An unpartitioned
GPU (SPX) is one device with everything.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from exporter.core.config import Config
from exporter.core.labels import ErrorReason
from exporter.core.model import (
    DeviceInfo,
    DeviceSample,
    DeviceValues,
    ProcessSample,
    normalize_pci_bus_id,
)
from exporter.sources.amd import amdsmi_device as dev
from exporter.sources.amd.amdsmi_calls import Caller, GpuLost, text
from exporter.sources.amd.rates import AccumulatorRates
from exporter.sources.base import LIBRARY, PLAIN, BackendUnavailable, Cycle

log = structlog.get_logger(__name__)

SOURCE = "amdsmi"


@dataclass
class _Device:
    info: DeviceInfo
    call: Caller
    role: str  # "gpu" (unpartitioned), "parent" (device-wide values), "slice"
    xgmi: AccumulatorRates[tuple[str, str]] = field(default_factory=AccumulatorRates)
    slow_values: DeviceValues = field(default_factory=DeviceValues)


def _physical(bdf: str) -> str:
    """The GPU's own bus id: the partition's BDF with function 0."""
    return bdf[:-1] + "0" if bdf[-2:-1] == "." else bdf


def _identity_call(call: Caller, errors: Counter[ErrorReason], fn: str) -> Any:
    """An identity getter at discovery: a device that is already gone reads as unknown
    here, and reports up=0 from its first sample."""
    try:
        return call.get(errors, fn)
    except GpuLost:
        return None


class AmdSmiBackend:
    name = "amdsmi"
    source = SOURCE
    priority = LIBRARY
    capabilities = PLAIN
    interval: float | None = None

    def __init__(self, config: Config) -> None:
        self.config = config
        self.lib: Any = None
        self._devices: list[_Device] = []

    # -- lifecycle ----------------------------------------------------------------------
    def open(self) -> Sequence[DeviceInfo]:
        try:
            import amdsmi  # the optional extra; it loads libamd_smi.so when imported
        except ImportError as e:
            raise BackendUnavailable(
                f"amdsmi package not importable ({e}); install the amd extra: pip install "
                "'.[amd]' in the gpu-exporter checkout") from None
        except OSError as e:  # the package is there, ROCm's library is not
            raise BackendUnavailable(f"libamd_smi.so not loadable: {e}") from None
        try:
            amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
            handles = list(amdsmi.amdsmi_get_processor_handles())
        except amdsmi.AmdSmiException as e:
            # The package's messages span lines ("Error code:\n\t34 | ..."): one line here.
            reason = " ".join(str(e).split())
            raise BackendUnavailable(f"amdsmi_init failed: {reason}") from None
        self.lib = amdsmi
        if not handles:
            self.close()
            raise BackendUnavailable("amdsmi found no AMD GPU")
        self._devices = self._discover(handles)
        self._prime()
        return [d.info for d in self._devices]

    def close(self) -> None:
        lib, self.lib, self._devices = self.lib, None, []
        if lib is not None:
            try:
                lib.amdsmi_shut_down()
            except Exception as e:  # noqa: BLE001 - a library that fails to close is gone
                log.debug("amdsmi_shut_down failed", reason=str(e))

    # -- discovery ----------------------------------------------------------------------
    def _identity(self, handle: Any) -> tuple[str, Caller]:
        bdf = normalize_pci_bus_id(str(self.lib.amdsmi_get_gpu_device_bdf(handle)))
        return bdf, Caller(self.lib, handle, bdf)

    def _discover(self, handles: list[Any]) -> list[_Device]:
        by_gpu: dict[str, list[tuple[str, Caller]]] = {}
        for handle in handles:
            try:
                bdf, call = self._identity(handle)
            except self.lib.AmdSmiException as e:
                log.info("amdsmi handle without a bus id skipped", reason=str(e))
                continue
            by_gpu.setdefault(_physical(bdf), []).append((bdf, call))
        devices: list[_Device] = []
        for bus_id, parts in sorted(by_gpu.items()):
            parts.sort()
            errors: Counter[ErrorReason] = Counter()
            first = parts[0][1]
            base = self._info(first, bus_id, errors)
            if len(parts) == 1:
                devices.append(_Device(base, first, "gpu"))
                continue
            devices.append(_Device(base, first, "parent"))
            for bdf, call in parts:
                kfd = _identity_call(call, errors, "amdsmi_get_gpu_kfd_info") or {}
                pid = kfd.get("current_partition_id")
                partition = str(pid) if isinstance(pid, int) else str(int(bdf[-1], 16))
                uuid = text(_identity_call(call, errors, "amdsmi_get_gpu_device_uuid"))
                info = DeviceInfo(
                    vendor="amd", pci_bus_id=bus_id, uuid=uuid or f"{base.uuid}-p{partition}",
                    name=base.name, driver=base.driver, driver_version=base.driver_version,
                    architecture=base.architecture,
                    vbios_version=base.vbios_version, serial=base.serial,
                    device_key=f"{bus_id}:partition{partition}", parent_key=bus_id,
                    slice_labels={"partition_id": partition})
                devices.append(_Device(info, call, "slice"))
        return devices

    def _info(self, call: Caller, bus_id: str, errors: Counter[ErrorReason]) -> DeviceInfo:
        def get(fn: str) -> Any:
            return _identity_call(call, errors, fn)

        asic = get("amdsmi_get_gpu_asic_info") or {}
        driver = get("amdsmi_get_gpu_driver_info") or {}
        vbios = get("amdsmi_get_gpu_vbios_info") or {}
        compute = text(get("amdsmi_get_gpu_compute_partition"))
        memory = text(get("amdsmi_get_gpu_memory_partition"))
        mode = "/".join(p for p in (compute, memory) if p)
        return DeviceInfo(
            vendor="amd", pci_bus_id=bus_id,
            uuid=text(get("amdsmi_get_gpu_device_uuid")) or f"pci-{bus_id}",
            name=text(asic.get("market_name")), driver=text(driver.get("driver_name")),
            architecture=text(asic.get("target_graphics_version")),
            driver_version=text(driver.get("driver_version")),
            vbios_version=text(vbios.get("version")), serial=text(asic.get("asic_serial")),
            info_labels={"partition": mode} if mode else {})

    def _prime(self) -> None:
        """A first reading of the XGMI accumulators, so the first collection already
        reports a rate (over the time since open). A device lost here reports up=0 from
        its first sample; what failed is counted there, when it fails again."""
        errors: Counter[ErrorReason] = Counter()
        for d in self._devices:
            if d.role != "slice":
                try:
                    d.xgmi.update(time.monotonic(), dev.xgmi_links(d.call, errors)[1])
                except GpuLost:
                    continue

    # -- sampling -----------------------------------------------------------------------
    def sample(self, slow: bool) -> Cycle:
        errors: Counter[ErrorReason] = Counter()
        out: list[DeviceSample] = []
        for d in self._devices:
            try:
                values, processes = self._read(d, errors, slow)
                out.append(DeviceSample.of(values, info=d.info, source=SOURCE,
                                           processes=processes))
            except GpuLost as e:
                errors[ErrorReason.GPU_LOST] += 1
                log.debug("amdsmi device lost", device=d.info.key, reason=str(e))
                out.append(DeviceSample(info=d.info, source=SOURCE, up=False))
        return Cycle(devices=out, errors={k: n for k, n in errors.items() if n})

    def _read(self, d: _Device, errors: Counter[ErrorReason], slow: bool
              ) -> tuple[DeviceValues, tuple[ProcessSample, ...]]:
        parts: list[DeviceValues] = []
        processes: tuple[ProcessSample, ...] = ()
        if d.role in ("gpu", "slice"):  # per partition
            parts += [dev.activity(d.call, errors), dev.memory(d.call, errors)]
            processes = dev.processes(d.call, errors)
        if d.role in ("gpu", "parent"):  # device-wide
            parts += [dev.power(d.call, errors), dev.temperatures(d.call, self.lib, errors),
                      dev.clocks(d.call, self.lib, errors)]
            up, counters = dev.xgmi_links(d.call, errors)
            parts.append(DeviceValues(
                nvlink_up=up,
                xgmi_throughput_bytes_per_second=d.xgmi.update(time.monotonic(), counters)))
            if slow:  # thresholds, PCIe and RAS: kept between slow cycles
                d.slow_values = dev.thresholds(d.call, self.lib, errors).overlay(
                    dev.pcie(d.call, errors), dev.ras(d.call, self.lib, errors))
            parts.append(d.slow_values)
        return DeviceValues().overlay(*parts), processes

