"""MIG: the GPU and compute instances of one NVIDIA GPU, each reported as a device of its own.

Read only, never configured: the exporter calls no NVML function that creates,
destroys or changes an instance or the MIG mode.

The slow tier (and the first cycle) asks ``nvmlDeviceGetMigMode``: a mode change takes
a GPU reset, and the call costs 0.22 ms of CPU on an H100 (driver 580.159), a third of
a whole fast cycle. With MIG on, every fast cycle walks
``nvmlDeviceGetMigDeviceHandleByIndex`` up to ``nvmlDeviceGetMaxMigDeviceCount`` (instances
come and go without a reset); an empty index answers NOT_FOUND. An instance is known by
its MIG UUID, so one destroyed and re-created (a new UUID) is a new device, and the set
follows reconfiguration within one cycle. A GPU that has no MIG (NOT_SUPPORTED) costs one
remembered failure, once.

Each MIG device (one compute instance) is a DeviceInfo with ``device_key`` = its MIG
UUID, ``parent_key`` = the parent's PCI bus id (which it shares), and ``slice_labels``
``gpu_instance_id``, ``compute_instance_id`` and ``mig_profile``. The profile is the
part of ``nvmlDeviceGetName`` after " MIG " ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" ->
"1g.10gb", "MIG 1c.3g.40gb" for a compute instance smaller than its GPU instance), the
name nvidia-smi -L prints. Per instance: memory (``nvmlDeviceGetMemoryInfo`` on the MIG
handle), processes (the process lists on the MIG handle hold only its own processes),
and GPM activity per GPU instance (``nvmlGpmMigSampleGet``, slow tier), shared by the
compute instances of one GPU instance. Utilisation, clocks, power and temperature stay
on the parent: NVML does not split them per instance.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from exporter.core.fs import ProcFS
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceInfo, DeviceSample
from exporter.sources.nvidia.calls import Caller, Nvml, text, u32
from exporter.sources.nvidia.device import SOURCE, NvmlDevice, nvml_sample, read_memory
from exporter.sources.nvidia.gpm import GpmSampler, GpmUnsupported
from exporter.sources.nvidia.processes import ProcessReader

log = structlog.get_logger(__name__)


@dataclass
class MigInstance:
    info: DeviceInfo
    gpu_instance_id: int
    call: Caller
    procs: ProcessReader


@dataclass
class MigReader:
    """The MIG state of one parent GPU."""

    nvml: Any
    parent: NvmlDevice
    proc: ProcFS
    gpm_wanted: bool
    enabled: bool | None = None  # None: this GPU has no MIG
    mode_read: bool = False  # the mode has been asked once (then on the slow tier only)
    instances: dict[str, MigInstance] = field(default_factory=dict)  # MIG UUID -> instance
    gpm: dict[int, GpmSampler | None] = field(default_factory=dict)  # GI id -> sampler
    profiling: dict[int, dict[str, float]] = field(default_factory=dict)  # GI id -> ratios

    def refresh(self, errors: Counter[ErrorReason], slow: bool = True) -> None:
        """Read the MIG mode (``slow``, and the first time) and the instance set; follows
        changes made since the last cycle."""
        call = self.parent.call
        if slow or not self.mode_read:
            mode = call.get(errors, Nvml.DEVICE_GET_MIG_MODE)
            self.mode_read = True
            enabled = None if mode is None else u32(mode[0]) == self._enable
        else:
            enabled = self.enabled
        if enabled != self.enabled:
            if self.enabled is not None or enabled:
                log.info("nvml_mig_mode", nvml_index=self.parent.index, enabled=enabled)
                # Readings NVML refuses in one mode (utilisation, NVLink in MIG mode) may
                # answer in the other: ask again.
                self.parent.forget_unsupported()
            self.enabled = enabled
            labels = {} if enabled is None else {"mig_mode": "enabled" if enabled else "disabled"}
            self.parent.info = replace(self.parent.info, info_labels=labels)
        seen = self._enumerate(errors) if enabled else {}
        for uuid in set(self.instances) - set(seen):
            log.info("nvml_mig_instance_gone", nvml_index=self.parent.index, uuid=uuid)
        for uuid in set(seen) - set(self.instances):
            log.info("nvml_mig_instance", nvml_index=self.parent.index, uuid=uuid,
                     **seen[uuid].info.slice_labels)
        self.instances = seen
        live = {i.gpu_instance_id for i in seen.values()}
        for gi in set(self.gpm) - live:
            sampler = self.gpm.pop(gi)
            if sampler is not None:
                sampler.close()
            self.profiling.pop(gi, None)

    @property
    def _enable(self) -> int:
        return int(getattr(self.nvml, "NVML_DEVICE_MIG_ENABLE", 1))

    def _enumerate(self, errors: Counter[ErrorReason]) -> dict[str, MigInstance]:
        nvml, call = self.nvml, self.parent.call
        seen: dict[str, MigInstance] = {}
        slots = u32(call.get(errors, Nvml.DEVICE_GET_MAX_MIG_DEVICE_COUNT)) or 0
        not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)
        for index in range(slots):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(call.handle, index)
                uuid = text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != not_found:  # NOT_FOUND: an empty index
                    call.failed(errors, e, Nvml.DEVICE_GET_MIG_DEVICE_HANDLE_BY_INDEX)
                continue
            known = self.instances.get(uuid)
            if known is not None:
                known.call.handle = handle
                seen[uuid] = known
                continue
            try:
                seen[uuid] = self._instance(handle, uuid, index)
            except nvml.NVMLError as e:  # destroyed between the two calls: next cycle
                call.failed(errors, e, Nvml.DEVICE_GET_GPU_INSTANCE_ID)
        return seen

    def _instance(self, handle: Any, uuid: str, index: int) -> MigInstance:
        nvml, parent = self.nvml, self.parent.info
        gi = int(nvml.nvmlDeviceGetGpuInstanceId(handle))
        ci = int(nvml.nvmlDeviceGetComputeInstanceId(handle))
        try:
            name = text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError:
            name = ""
        _, sep, profile = name.partition(" MIG ")
        info = replace(parent, uuid=uuid, name=name or parent.name, device_key=uuid,
                       parent_key=parent.key, info_labels={},
                       slice_labels={"gpu_instance_id": str(gi), "compute_instance_id": str(ci),
                                     "mig_profile": profile.strip() if sep else ""})
        call = Caller(nvml, handle, self.parent.index)
        return MigInstance(info, gi, call, ProcessReader(nvml, call, self.proc))

    def sample(self, errors: Counter[ErrorReason], slow: bool) -> list[DeviceSample]:
        """One DeviceSample per MIG device. Raises GpuLost with the parent."""
        for gi in sorted({i.gpu_instance_id for i in self.instances.values()}):
            if slow or gi not in self.gpm:  # a new GPU instance reports from its first cycle
                self.profiling[gi] = self._gpm(errors, gi)
        out = []
        for inst in sorted(self.instances.values(), key=lambda i: i.info.uuid):
            if slow:
                inst.procs.read_utilization(errors)
            profiling = self.profiling.get(inst.gpu_instance_id, {})
            memory = read_memory(inst.call, errors)
            out.append(nvml_sample(inst.info, memory, profiling,
                                   inst.procs.read(errors, slow, memory.memory_total_bytes)))
        return out

    def down(self) -> list[DeviceSample]:
        """The known instances, down with their parent."""
        return [DeviceSample(info=i.info, source=SOURCE, up=False)
                for i in sorted(self.instances.values(), key=lambda i: i.info.uuid)]

    def _gpm(self, errors: Counter[ErrorReason], gi: int) -> dict[str, float]:
        nvml = self.nvml
        if gi not in self.gpm:
            sampler = None
            if self.gpm_wanted:
                try:
                    sampler = GpmSampler(nvml, self.parent.handle, gpu_instance_id=gi)
                except (GpmUnsupported, nvml.NVMLError) as e:
                    log.info("nvml_gpm_unavailable", nvml_index=self.parent.index, gpu_instance=gi,
                             reason=str(e))
            self.gpm[gi] = sampler
        sampler = self.gpm[gi]
        if sampler is None:
            return {}
        try:
            return sampler.sample()
        except nvml.NVMLError as e:
            self.parent.call.failed(errors, e, Nvml.GPM_MIG_SAMPLE_GET, gi)
            if self.parent.call.absent(Nvml.GPM_MIG_SAMPLE_GET, gi):
                sampler.close()
                self.gpm[gi] = None
            return {}

    def close(self) -> None:
        for sampler in self.gpm.values():
            if sampler is not None:
                sampler.close()
        self.gpm.clear()
        self.profiling.clear()
