"""GPM (GPU Performance Monitoring) profiling ratios on Hopper and later.

GPM metrics are computed by NVML from two samples taken apart in time, so each
GPU keeps its previous sample buffer; every call takes a new one and asks for
the metrics between the two. Values come back in percent and leave as 0..1
ratios under ``DeviceSample.profiling_ratio`` with source ``nvml_gpm``.

A MIG GPU instance is sampled with ``nvmlGpmMigSampleGet(parent, gpuInstanceId, buf)``
(nvml.h: GPM per GPU instance); the instance's compute instances share its numbers.
"""

from __future__ import annotations

import math
from typing import Any

from exporter.core.labels import Profiling
from exporter.core.units import ratio_from_percent
from exporter.sources.nvidia.calls import Nvml

# profiling_ratio key -> NVML_GPM_METRIC_* (nvml.h, "0.0 - 100.0" percent metrics)
GPM_METRICS = {
    Profiling.GRAPHICS_ENGINE_ACTIVE: "NVML_GPM_METRIC_GRAPHICS_UTIL",
    Profiling.SM_ACTIVE: "NVML_GPM_METRIC_SM_UTIL",
    Profiling.SM_OCCUPANCY: "NVML_GPM_METRIC_SM_OCCUPANCY",
    Profiling.TENSOR_ACTIVE: "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    Profiling.DRAM_ACTIVE: "NVML_GPM_METRIC_DRAM_BW_UTIL",
    Profiling.FP64_ACTIVE: "NVML_GPM_METRIC_FP64_UTIL",
    Profiling.FP32_ACTIVE: "NVML_GPM_METRIC_FP32_UTIL",
    Profiling.FP16_ACTIVE: "NVML_GPM_METRIC_FP16_UTIL",
}


class GpmUnsupported(Exception):
    """This GPU (or this nvidia-ml-py) has no GPM."""


class GpmSampler:
    """Two sample buffers per GPU, swapped on every call."""

    def __init__(self, nvml: Any, handle: Any, gpu_instance_id: int | None = None) -> None:
        self.nvml = nvml
        self.handle = handle  # the physical GPU, also for a MIG GPU instance
        self.gpu_instance_id = gpu_instance_id
        if not hasattr(nvml, Nvml.GPM_QUERY_DEVICE_SUPPORT):
            raise GpmUnsupported("nvidia-ml-py has no GPM bindings")
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
        except nvml.NVMLError as e:
            raise GpmUnsupported(str(e)) from e
        if not support.isSupportedDevice:
            raise GpmUnsupported("GPU does not support GPM (needs Hopper or later)")
        self.metrics = [(k, getattr(nvml, c)) for k, c in GPM_METRICS.items() if hasattr(nvml, c)]
        if gpu_instance_id is not None and not hasattr(nvml, Nvml.GPM_MIG_SAMPLE_GET):
            raise GpmUnsupported("nvidia-ml-py has no nvmlGpmMigSampleGet")
        # One request struct for the sampler's life: version and metric ids are inputs
        # NVML does not write (nvml.h nvmlGpmMetricsGet_t); only the two samples change.
        self._request = nvml.c_nvmlGpmMetricsGet_t()
        self._request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        self._request.numMetrics = len(self.metrics)
        for i, (_key, metric_id) in enumerate(self.metrics):
            self._request.metrics[i].metricId = metric_id
        self._prev = nvml.nvmlGpmSampleAlloc()
        self._cur = nvml.nvmlGpmSampleAlloc()
        # The first sample now, so the first collection already has an interval to report.
        try:
            self._take(self._prev)
        except nvml.NVMLError:
            self.close()
            raise

    def _take(self, buf: Any) -> None:
        if self.gpu_instance_id is None:
            self.nvml.nvmlGpmSampleGet(self.handle, buf)
        else:
            self.nvml.nvmlGpmMigSampleGet(self.handle, self.gpu_instance_id, buf)

    def sample(self) -> dict[str, float]:
        """Ratios over the time since the previous call. Raises NVMLError."""
        nvml = self.nvml
        self._take(self._cur)
        mg = self._request
        mg.sample1 = self._prev
        mg.sample2 = self._cur
        self._prev, self._cur = self._cur, self._prev
        nvml.nvmlGpmMetricsGet(mg)
        out: dict[str, float] = {}
        for i, (key, _metric_id) in enumerate(self.metrics):
            m = mg.metrics[i]
            if m.nvmlReturn != nvml.NVML_SUCCESS or not math.isfinite(m.value):
                continue
            # A hair below 0 is float noise in NVML's arithmetic; below -1 % is garbage.
            r = ratio_from_percent(max(m.value, 0.0) if m.value >= -1.0 else m.value)
            if r is not None:
                out[key] = r
        return out

    def close(self) -> None:
        for s in (self._prev, self._cur):
            try:
                self.nvml.nvmlGpmSampleFree(s)
            except self.nvml.NVMLError:
                pass
        self._prev = self._cur = None
