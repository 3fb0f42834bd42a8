"""GPM (GPU Performance Monitoring) profiling ratios on Hopper and later.

GPM metrics are computed by NVML from two samples taken apart in time, so each
GPU keeps its previous sample buffer; every call takes a new one and asks for
the metrics between the two. Values come back in percent and leave as 0..1
ratios under ``DeviceSample.profiling_ratio`` with source ``nvml_gpm``.
"""

from __future__ import annotations

import math
from typing import Any

# profiling_ratio key -> NVML_GPM_METRIC_* (nvml.h, "0.0 - 100.0" percent metrics)
GPM_METRICS = {
    "graphics_engine_active": "NVML_GPM_METRIC_GRAPHICS_UTIL",
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "fp64_active": "NVML_GPM_METRIC_FP64_UTIL",
    "fp32_active": "NVML_GPM_METRIC_FP32_UTIL",
    "fp16_active": "NVML_GPM_METRIC_FP16_UTIL",
}


class GpmUnsupported(Exception):
    """This GPU (or this nvidia-ml-py) has no GPM."""


class GpmSampler:
    """Two sample buffers per GPU, swapped on every call."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            raise GpmUnsupported("nvidia-ml-py has no GPM bindings")
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
        except nvml.NVMLError as e:
            raise GpmUnsupported(str(e)) from e
        if not support.isSupportedDevice:
            raise GpmUnsupported("GPU does not support GPM (needs Hopper or later)")
        self.metrics = [(k, getattr(nvml, c)) for k, c in GPM_METRICS.items() if hasattr(nvml, c)]
        self._prev = nvml.nvmlGpmSampleAlloc()
        self._cur = nvml.nvmlGpmSampleAlloc()
        # The first sample now, so the first collection already has an interval to report.
        nvml.nvmlGpmSampleGet(handle, self._prev)

    def sample(self) -> dict[str, float]:
        """Ratios over the time since the previous call. Raises NVMLError."""
        nvml = self.nvml
        nvml.nvmlGpmSampleGet(self.handle, self._cur)
        mg = nvml.c_nvmlGpmMetricsGet_t()
        mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(self.metrics)
        mg.sample1 = self._prev
        mg.sample2 = self._cur
        for i, (_key, metric_id) in enumerate(self.metrics):
            mg.metrics[i].metricId = metric_id
        self._prev, self._cur = self._cur, self._prev
        nvml.nvmlGpmMetricsGet(mg)
        out = {}
        for i, (key, _metric_id) in enumerate(self.metrics):
            m = mg.metrics[i]
            if m.nvmlReturn != nvml.NVML_SUCCESS or not math.isfinite(m.value):
                continue
            if -1.0 <= m.value <= 110.0:  # anything else is garbage, not a clamped reading
                out[key] = min(max(m.value, 0.0), 100.0) / 100.0
        return out

    def close(self) -> None:
        for s in (self._prev, self._cur):
            try:
                self.nvml.nvmlGpmSampleFree(s)
            except self.nvml.NVMLError:
                pass
