"""NVML over time: per-process utilisation samples, power and energy of GPUs whose
processes are busy in given spans, on a clock the test steps.

``TimelineNVML(gpus, clock)`` is the fake NVML (fake_nvml.py) with three functions
answering from a timeline instead of fixed values: ``busy(gpu, pid, start, end)`` says
that a process keeps the GPU busy from ``start`` to ``end`` (seconds of ``clock``). A
model of what the driver and NVML do:

- The driver samples engine utilisation every sample period and keeps a GPU's last
  samples in a ring: each sample holds a CPU timestamp and, per engine, the utilisation
  in that period and the one process it is charged to (open-gpu-kernel-modules,
  src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080perf.h:
  ``NV2080_CTRL_PERF_GPUMON_PERFMON_UTIL_SAMPLE`` {``base.timeStamp``; ``gr``, ``fb``,
  ``nvenc``, ``nvdec``: {``util``, ``procId``, ``subProcessID``}} in a buffer of
  ``NV2080_CTRL_PERF_GPUMON_SAMPLE_COUNT_PERFMON_UTIL`` = 100 samples). The period is
  between 1 s and 1/6 s depending on the product (nvidia-smi(1), "Utilization"): 1/6 s
  here. Processes busy at the same time are time-sliced: consecutive samples are charged
  to each in turn. A busy sample's SM utilisation is ``sm`` (87: one matmul loop alone
  on an H200 reads 87 %, docs/energy.md).
- ``nvmlDeviceGetProcessUtilization(device, lastSeenTimeStamp)``: one entry per process
  charged with samples newer than ``lastSeenTimeStamp`` (µs of the wall clock), or
  NVML_ERROR_NOT_FOUND when there is none (nvml.h). The entry's ``timeStamp`` is the
  newest of its samples; its ``smUtil`` is its utilisation summed over those samples
  divided by all the samples newer than ``lastSeenTimeStamp`` (the GPU's, idle ones too),
  which is how two processes sharing a GPU read as shares of it (two copies of one loop
  read 47 % and 52 % on an H200, docs/energy.md). A ``lastSeenTimeStamp`` older than the
  ring averages over the whole ring, as nvml.h says of 0 ("all the samples maintained by
  the driver's internal sample buffer").
- ``nvmlDeviceGetTotalEnergyConsumption``: mJ, the exact integral of the power since
  ``clock`` 0; ``nvmlDeviceGetPowerUsage``: mW averaged over the last second (Hopper's
  power reading is a 1 s average); ``nvmlDeviceGetUtilizationRates``: ``gpu`` is the
  percent of the last second in which a kernel ran (nvml.h: "percent of time over the
  past sample period during which one or more kernels was executing"), 100 while any
  process is busy: the SM samples' 87 % is the SMs' activity within that time.

The wall clock of the timestamps is ``EPOCH + clock()`` plus ``wall_step`` (a step of
the host's clock: NTP, a VM resume; each sample keeps the stamp it was taken with); the
backend's clock for them (``ProcessReader.wall``) must be the same (``wall()``; the
tests set it), its monotonic clock (``ProcessReader.mono``) ``clock()``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.fake_nvml import FakeGPU, FakeHandle, FakeNVML
from tests.fakes.nvml_real import N

EPOCH = 1_760_000_000.0  # the wall clock (s) at clock 0
PERIOD = 1 / 6  # s between driver samples
RING = 100  # samples the driver keeps


@dataclass
class _Timeline:
    spans: list[tuple[int, float, float]] = field(default_factory=list)  # pid, start, end
    # (t, pid charged or None, sm %, its wall clock stamp in µs)
    ring: deque[tuple[float, int | None, int, int]] = field(
        default_factory=lambda: deque(maxlen=RING))
    sampled: int = 0  # driver samples taken so far (sample k is at k * PERIOD)


class TimelineNVML(FakeNVML):
    def __init__(self, gpus: list[FakeGPU], clock: Callable[[], float],
                 idle_watts: float = 146.0, busy_watts: float = 650.0, sm: int = 87) -> None:
        super().__init__(gpus)
        self.clock = clock
        self.idle_watts, self.busy_watts, self.sm = idle_watts, busy_watts, sm
        self.wall_step = 0.0  # seconds the host's wall clock was stepped by, so far
        self._timelines = [_Timeline() for _ in gpus]

    def wall(self) -> float:
        """The host's wall clock now."""
        return EPOCH + self.clock() + self.wall_step

    def busy(self, gpu: int, pid: int, start: float, end: float) -> None:
        self._timelines[gpu].spans.append((pid, start, end))

    def busy_at(self, gpu: int, t: float) -> list[int]:
        return sorted({pid for pid, a, b in self._timelines[gpu].spans if a <= t < b})

    def busy_seconds(self, gpu: int, t: float) -> float:
        """Seconds from clock 0 to ``t`` in which any process kept the GPU busy."""
        merged: list[list[float]] = []
        for a, b in sorted((a, b) for _, a, b in self._timelines[gpu].spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return sum(max(0.0, min(b, t) - max(a, 0.0)) for a, b in merged)

    def energy(self, gpu: int, t: float) -> float:
        """Joules from clock 0 to ``t``: idle power, and busy power while any is busy."""
        return (self.idle_watts * t
                + (self.busy_watts - self.idle_watts) * self.busy_seconds(gpu, t))

    def _sample(self, gpu: int) -> _Timeline:
        """The driver's samples up to now."""
        line, now = self._timelines[gpu], self.clock()
        while line.sampled * PERIOD <= now:
            t = line.sampled * PERIOD
            busy = self.busy_at(gpu, t)
            pid = busy[line.sampled % len(busy)] if busy else None
            line.ring.append((t, pid, self.sm if busy else 0, _us(t + self.wall_step)))
            line.sampled += 1
        return line

    def nvmlDeviceGetProcessUtilization(self, h: FakeHandle, since_us: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", h)
        newer = [s for s in self._sample(h.gpu.index).ring if s[3] > since_us]
        charged: dict[int, tuple[int, int]] = {}  # pid -> (newest stamp, summed sm)
        for _t, pid, sm, stamp in newer:
            if pid is not None:
                _, total = charged.get(pid, (stamp, 0))
                charged[pid] = (stamp, total + sm)
        if not charged:
            raise N.NVMLError(N.NVML_ERROR_NOT_FOUND)
        return [N.c_nvmlProcessUtilizationSample_t(
            pid=pid, timeStamp=stamp, smUtil=round(total / len(newer)), memUtil=0,
            encUtil=0, decUtil=0) for pid, (stamp, total) in charged.items()]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        return int(self.energy(h.gpu.index, self.clock()) * 1000)

    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        now = self.clock()
        busy = self.busy_seconds(h.gpu.index, now) - self.busy_seconds(h.gpu.index, now - 1.0)
        return N.c_nvmlUtilization_t(gpu=round(100 * busy), memory=0)

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        now = self.clock()
        second = min(1.0, now)
        if second <= 0:
            return int(self.idle_watts * 1000)
        e = self.energy(h.gpu.index, now) - self.energy(h.gpu.index, now - second)
        return int(e / second * 1000)


def _us(t: float) -> int:
    return int(round((EPOCH + t) * 1_000_000))
