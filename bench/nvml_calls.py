"""Time every NVML call the NVIDIA backend makes, on a real GPU (or the stub library).

    python bench/nvml_calls.py [--gpu 0] [--n 200] [--probe] [--batch] [--cycle]
    python bench/nvml_calls.py --stub [--gpus 8] [--nvlinks 18] [--procs 64] --batch --cycle

Prints one row per call: median and p90 wall time and median thread CPU time in
microseconds over N calls (calls that take over a millisecond are repeated fewer
times), and whether the call answered or raised (e.g. NotSupported). The fast/slow
tier split in exporter/sources/nvidia/backend.py is decided from this table.

``--batch`` compares field values asked one call per field with the same fields in
one ``nvmlDeviceGetFieldValues`` call (the fast-tier set, MEASURED.md's three-field
set, and the NVLink throughput counters of 18 links). ``--cycle`` times whole backend
cycles (fast and slow, all GPUs) through the exporter's own code. ``--probe`` prints
one slow and one fast cycle, to catch real-NVML surprises.

``--stub`` binds nvidia-ml-py to bench/nvml_stub.py's library, whose every call
returns at once: the driver's time is zero, so the numbers are nvidia-ml-py's and the
exporter's Python alone (no GPU needed; ``cc`` must be installed).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn: Callable[[], Any], n: int) -> tuple[float, float, float, str]:
    """(median wall us, p90 wall us, median thread CPU us, outcome) of n calls."""
    outcome = "ok"
    try:
        t0 = time.perf_counter()
        fn()
        first = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - the outcome is what we report
        outcome = type(e).__name__
        first = 0.0
    runs = n if first < 1e-3 else max(5, min(n, 20))
    times, cpu = [], []
    for _ in range(runs):
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            fn()
        except Exception:  # noqa: BLE001,S110
            pass
        times.append((time.perf_counter() - t0) * 1e6)
        cpu.append((time.thread_time() - c0) * 1e6)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1], statistics.median(cpu), \
        outcome


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
        ("nvmlDeviceGetEncoderStats", lambda: n.nvmlDeviceGetEncoderStats(h)),
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
        ("nvmlDeviceGetFieldValues(POWER_INSTANT)",
         lambda: n.nvmlDeviceGetFieldValues(h, (n.NVML_FI_DEV_POWER_INSTANT,))),
        ("nvmlDeviceGetNvLinkState(0)", lambda: n.nvmlDeviceGetNvLinkState(h, 0)),
        ("nvmlDeviceGetNvLinkRemoteDeviceType(0)",
         lambda: n.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0)),
        ("nvmlDeviceGetNvLinkErrorCounter(0,crc_flit)", lambda: n.nvmlDeviceGetNvLinkErrorCounter(
            h, 0, n.NVML_NVLINK_ERROR_DL_CRC_FLIT)),
        ("nvmlDeviceGetViolationStatus(power)",
         lambda: n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_POWER)),
        ("nvmlDeviceGetMemoryErrorCounter(corr,vol,dram)",
         lambda: n.nvmlDeviceGetMemoryErrorCounter(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                                   n.NVML_VOLATILE_ECC,
                                                   n.NVML_MEMORY_LOCATION_DRAM)),
        ("nvmlDeviceGetMigMode", lambda: n.nvmlDeviceGetMigMode(h)),
        ("nvmlDeviceGetMemoryErrorCounter(corr,vol,sram)",
         lambda: n.nvmlDeviceGetMemoryErrorCounter(h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                                   n.NVML_VOLATILE_ECC,
                                                   getattr(n, "NVML_MEMORY_LOCATION_SRAM", 7))),
        ("nvmlDeviceGetPcieThroughput(rx)",
         lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_RX_BYTES)),
        ("nvmlDeviceGetViolationStatus(thermal)",
         lambda: n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_THERMAL)),
        # the slow tier's fabric read (NOT_SUPPORTED on a GPU in no NVSwitch fabric)
        ("nvmlDeviceGetGpuFabricInfoV(v3)", lambda: n.nvmlDeviceGetGpuFabricInfoV(
            h, ctypes.byref(n.c_nvmlGpuFabricInfo_v3_t()))),
        ("nvmlDeviceGetGpuFabricInfoV(v2)", lambda: n.nvmlDeviceGetGpuFabricInfoV(
            h, ctypes.byref(n.c_nvmlGpuFabricInfo_v2_t()))),
    ]
    return out


def batch_rows(n: Any, h: Any, runs: int) -> list[tuple[str, float, float, float, str]]:
    """The same field values asked one call per field, then in one call."""
    sets = {
        "fast tier (memory temp, instant power)": [
            (n.NVML_FI_DEV_MEMORY_TEMP, 0), (n.NVML_FI_DEV_POWER_INSTANT, 0)],
        "MEASURED.md set (+ PCIe replay)": [
            (n.NVML_FI_DEV_MEMORY_TEMP, 0), (n.NVML_FI_DEV_POWER_INSTANT, 0),
            (n.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0)],
        "the slow cycle's one batch (fast fields + recovery action)": [
            (n.NVML_FI_DEV_MEMORY_TEMP, 0), (n.NVML_FI_DEV_POWER_INSTANT, 0),
            (n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)],
        "PCIe tx/rx byte counters (197/198)": [
            (getattr(n, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197), 0),
            (getattr(n, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198), 0)],
        "NVLink error totals (38/45/52/59)": [
            (n.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0),
            (n.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 0),
            (n.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 0),
            (n.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, 0)],
        "NVLink tx+rx, 18 links": [
            (fid, link) for link in range(18)
            for fid in (n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                        n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)],
    }
    # Through the exporter's own call (spare entries after the array): nvidia-ml-py's
    # exactly sized array lets driver 580 write past it when a batch ends in NVLink
    # throughput fields (exporter.sources.nvidia.fields).
    from exporter.sources.nvidia.fields import field_values

    rows = []
    for label, fields in sets.items():
        def singles(fields: list[tuple[int, int]] = fields) -> None:
            for f in fields:
                field_values(n, h, (f,))

        def batched(fields: list[tuple[int, int]] = fields) -> None:
            field_values(n, h, tuple(fields))

        codes = sorted({int(v.nvmlReturn) for v in field_values(n, h, tuple(fields))})
        rows.append((f"{label}: {len(fields)} calls", *timed(singles, runs)))
        rows.append((f"{label}: 1 call  [field returns {codes}]", *timed(batched, runs)))
    return rows


def cycle_rows(runs: int) -> list[tuple[str, float, float, float, str]]:
    """Whole backend cycles through the exporter's code (all GPUs, per cycle)."""
    from exporter.core.config import Config
    from exporter.sources.nvidia.backend import NvidiaBackend

    backend = NvidiaBackend(Config())
    gpus = len(backend.open())
    backend.sample(slow=True)
    rows = [(f"backend fast cycle ({gpus} GPUs)", *timed(lambda: backend.sample(slow=False),
                                                         runs)),
            (f"backend slow cycle ({gpus} GPUs)", *timed(lambda: backend.sample(slow=True),
                                                         max(5, runs // 10)))]
    backend.close()
    return rows


def gpm_rows(nvml: Any, h: Any, n: int) -> list[tuple[str, float, float, str]]:
    from exporter.sources.nvidia.gpm import GpmSampler

    try:
        sampler = GpmSampler(nvml, h)
    except Exception as e:  # noqa: BLE001
        return [("GpmSampler (SampleGet+MetricsGet)", 0.0, 0.0, 0.0, f"{type(e).__name__}: {e}")]
    time.sleep(0.1)
    med, p90, cpu, outcome = timed(sampler.sample, min(n, 50))
    last = sampler.sample()
    sampler.close()
    return [("GpmSampler.sample (SampleGet+MetricsGet)", med, p90, cpu, f"{outcome} {last}")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--probe", action="store_true")
    ap.add_argument("--batch", action="store_true", help="field values: one call vs one per field")
    ap.add_argument("--cycle", action="store_true", help="time whole backend cycles")
    ap.add_argument("--stub", action="store_true", help="bench/nvml_stub.py instead of a GPU")
    ap.add_argument("--gpus", type=int, default=1, help="--stub: GPUs")
    ap.add_argument("--nvlinks", type=int, default=0, help="--stub: active NVLinks per GPU")
    ap.add_argument("--procs", type=int, default=0, help="--stub: processes per GPU")
    ap.add_argument("--json", type=Path, help="also write the rows here (bench/cost_model.py "
                    "--calls-json reads them)")
    args = ap.parse_args()
    if args.stub:
        from bench.nvml_stub import load

        nvml = load(args.gpus, args.nvlinks, args.procs)
    else:
        import pynvml as nvml

    t0 = time.perf_counter()
    nvml.nvmlInit()
    init_us = (time.perf_counter() - t0) * 1e6
    h = nvml.nvmlDeviceGetHandleByIndex(args.gpu)
    driver = nvml.nvmlSystemGetDriverVersion()
    print(f"GPU {args.gpu}: {nvml.nvmlDeviceGetName(h)}, driver {driver}")
    rows = [("nvmlInit (first, cold)", init_us, init_us, init_us, "ok")]
    for name, fn in calls(nvml, h):
        rows.append((name, *timed(fn, args.n)))
    rows.extend(gpm_rows(nvml, h, args.n))
    if args.batch:
        rows.extend(batch_rows(nvml, h, args.n))
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
    if args.cycle:
        rows.extend(cycle_rows(args.n))
    print(f"{'call':<62} {'median us':>10} {'p90 us':>10} {'CPU us':>9}  outcome")
    for name, med, p90, cpu, outcome in rows:
        print(f"{name:<62} {med:>10.1f} {p90:>10.1f} {cpu:>9.1f}  {outcome}")
    if args.json:
        args.json.write_text(json.dumps({"driver": driver, "rows": [
            {"call": name, "median_us": med, "p90_us": p90, "cpu_us": cpu, "outcome": outcome}
            for name, med, p90, cpu, outcome in rows]}, indent=1))
    if args.probe:
        probe()


def probe() -> None:
    from exporter.core.config import Config
    from exporter.sources.nvidia.backend import NvidiaBackend

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
