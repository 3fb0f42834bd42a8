"""Time every NVML call the NVIDIA backend makes, on a real GPU.

    python bench/nvml_calls.py [--gpu 0] [--n 200] [--probe]

Prints one row per call: median and p90 in microseconds over N calls (calls that
take over a millisecond are repeated fewer times), and whether the call answered
or raised (e.g. NotSupported). The fast/slow tier split in
exporter/backends/nvidia.py is decided from this table. ``--probe`` also opens the
real backend and prints one slow and one fast cycle, to catch real-NVML surprises.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn: Callable[[], Any], n: int) -> tuple[float, float, str]:
    """(median us, p90 us, outcome) of n calls; fewer calls for slow ones."""
    outcome = "ok"
    try:
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the outcome is what we report
        outcome = type(e).__name__
        first = 0.0
    runs = n if first < 1e-3 else max(5, min(n, 20))
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001,S110
            pass
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1], outcome


def calls(nvml: Any, h: Any) -> list[tuple[str, Callable[[], Any]]]:
    n = nvml
    out: list[tuple[str, Callable[[], Any]]] = [
        ("nvmlDeviceGetCount", n.nvmlDeviceGetCount),
        ("nvmlDeviceGetUtilizationRates", lambda: n.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetMemoryInfo(v2)",
         lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)),
        ("nvmlDeviceGetMemoryInfo(v1)", lambda: n.nvmlDeviceGetMemoryInfo(h)),
        ("nvmlDeviceGetTemperature(gpu)",
         lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetPowerUsage", lambda: n.nvmlDeviceGetPowerUsage(h)),
        ("nvmlDeviceGetEnforcedPowerLimit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h)),
        ("nvmlDeviceGetNumFans", lambda: n.nvmlDeviceGetNumFans(h)),
        ("nvmlDeviceGetFanSpeed_v2(0)", lambda: n.nvmlDeviceGetFanSpeed_v2(h, 0)),
        ("nvmlDeviceGetClockInfo(sm)", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
        ("nvmlDeviceGetClockInfo(mem)", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
        ("nvmlDeviceGetMaxClockInfo(sm)",
         lambda: n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)),
        ("nvmlDeviceGetPerformanceState", lambda: n.nvmlDeviceGetPerformanceState(h)),
        ("nvmlDeviceGetCurrentClocksEventReasons",
         lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("nvmlDeviceGetCurrPcieLinkGeneration", lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        ("nvmlDeviceGetCurrPcieLinkWidth", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h)),
        ("nvmlDeviceGetMaxPcieLinkGeneration", lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        ("nvmlDeviceGetPcieReplayCounter", lambda: n.nvmlDeviceGetPcieReplayCounter(h)),
        ("nvmlDeviceGetPcieThroughput(tx)",
         lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)),
        ("nvmlDeviceGetEncoderUtilization", lambda: n.nvmlDeviceGetEncoderUtilization(h)),
        ("nvmlDeviceGetDecoderUtilization", lambda: n.nvmlDeviceGetDecoderUtilization(h)),
        ("nvmlDeviceGetJpgUtilization", lambda: n.nvmlDeviceGetJpgUtilization(h)),
        ("nvmlDeviceGetOfaUtilization", lambda: n.nvmlDeviceGetOfaUtilization(h)),
        ("nvmlDeviceGetTotalEccErrors(corr,vol)", lambda: n.nvmlDeviceGetTotalEccErrors(
            h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)),
        ("nvmlDeviceGetRemappedRows", lambda: n.nvmlDeviceGetRemappedRows(h)),
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: n.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("nvmlDeviceGetFieldValues(MEMORY_TEMP)",
         lambda: n.nvmlDeviceGetFieldValues(h, (n.NVML_FI_DEV_MEMORY_TEMP,))),
        ("nvmlDeviceGetFieldValues(TOTAL_ENERGY)",
         lambda: n.nvmlDeviceGetFieldValues(h, (n.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,))),
        ("nvmlDeviceGetTemperatureThreshold(slowdown)", lambda: n.nvmlDeviceGetTemperatureThreshold(
            h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
        ("nvmlDeviceGetBAR1MemoryInfo", lambda: n.nvmlDeviceGetBAR1MemoryInfo(h)),
        ("nvmlDeviceGetComputeRunningProcesses",
         lambda: n.nvmlDeviceGetComputeRunningProcesses(h)),
        ("nvmlDeviceGetGraphicsRunningProcesses",
         lambda: n.nvmlDeviceGetGraphicsRunningProcesses(h)),
        ("nvmlDeviceGetProcessUtilization(0)", lambda: n.nvmlDeviceGetProcessUtilization(h, 0)),
        ("nvmlDeviceGetUUID", lambda: n.nvmlDeviceGetUUID(h)),
        ("nvmlGpmQueryDeviceSupport", lambda: n.nvmlGpmQueryDeviceSupport(h)),
    ]
    return out


def gpm_rows(nvml: Any, h: Any, n: int) -> list[tuple[str, float, float, str]]:
    from exporter.backends.nvml_gpm import GpmSampler

    try:
        sampler = GpmSampler(nvml, h)
    except Exception as e:  # noqa: BLE001
        return [("GpmSampler (SampleGet+MetricsGet)", 0.0, 0.0, f"{type(e).__name__}: {e}")]
    time.sleep(0.1)
    med, p90, outcome = timed(sampler.sample, min(n, 50))
    last = sampler.sample()
    sampler.close()
    return [("GpmSampler.sample (SampleGet+MetricsGet)", med, p90, f"{outcome} {last}")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--probe", action="store_true")
    args = ap.parse_args()
    import pynvml as nvml

    t0 = time.perf_counter()
    nvml.nvmlInit()
    init_us = (time.perf_counter() - t0) * 1e6
    h = nvml.nvmlDeviceGetHandleByIndex(args.gpu)
    driver = nvml.nvmlSystemGetDriverVersion()
    print(f"GPU {args.gpu}: {nvml.nvmlDeviceGetName(h)}, driver {driver}")
    rows = [("nvmlInit (first, cold)", init_us, init_us, "ok")]
    for name, fn in calls(nvml, h):
        rows.append((name, *timed(fn, args.n)))
    rows.extend(gpm_rows(nvml, h, args.n))
    events = nvml.nvmlEventSetCreate()
    try:
        nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
        reg = "ok"
    except nvml.NVMLError as e:
        reg = str(e)

    def wait0() -> None:
        try:
            nvml.nvmlEventSetWait_v2(events, 0)
        except nvml.NVMLError_Timeout:
            pass

    rows.append((f"nvmlEventSetWait_v2(0) [register: {reg}]", *timed(wait0, args.n)))
    nvml.nvmlEventSetFree(events)
    nvml.nvmlShutdown()

    def reinit() -> None:
        nvml.nvmlInit()
        nvml.nvmlShutdown()

    rows.append(("nvmlInit+nvmlShutdown (warm)", *timed(reinit, 10)))
    print(f"{'call':<58} {'median us':>10} {'p90 us':>10}  outcome")
    for name, med, p90, outcome in rows:
        print(f"{name:<58} {med:>10.1f} {p90:>10.1f}  {outcome}")
    if args.probe:
        probe()


def probe() -> None:
    from exporter.backends.nvidia import NvidiaBackend
    from exporter.config import Config

    backend = NvidiaBackend(Config())
    infos = backend.open()
    print("\nDeviceInfo:", *infos, sep="\n  ")
    for slow in (True, False):
        time.sleep(0.5)
        t0 = time.perf_counter()
        cycle = backend.sample(slow=slow)
        ms = (time.perf_counter() - t0) * 1e3
        print(f"\n{'slow' if slow else 'fast'} cycle: {ms:.2f} ms, errors={cycle.errors}")
        for d in cycle.devices:
            for k, v in vars(d).items() if hasattr(d, "__dict__") else []:
                print(f"  {k} = {v}")
    backend.close()


if __name__ == "__main__":
    main()
