"""Resident memory that NVML itself adds, step by step, on a machine with an NVIDIA GPU.

    python bench/nvml_memory.py [--json OUT]

In one fresh interpreter per sequence, VmRSS (and RssAnon, RssFile, the thread count and
whether libcuda is mapped) after each step: importing nvidia-ml-py, ``nvmlInit``, the
identity reads, the fast getters, the process lists, the XID event set, GPM (its sample
buffers), the slow getters, and then the exporter's NVIDIA backend opened and sampled.
A second sequence does what nvitop-exporter does with NVML (``nvitop.Device.all()`` and
a snapshot of each), where nvitop imports. What each step adds is what the daemon pays
for that reading on top of its Python (bench/memory.py, bench/imports.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, os, sys, threading, time
sys.path.insert(0, sys.argv[1])
steps = []
def mark(label):
    kib = {}
    for line in open("/proc/self/status"):
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
            kib[key] = int(rest.split()[0])
    maps = open("/proc/self/maps").read()
    steps.append({"step": label, "rss_kib": kib["VmRSS"], "anon_kib": kib.get("RssAnon", 0),
                  "file_kib": kib.get("RssFile", 0), "threads": kib["Threads"],
                  "libcuda": "libcuda" in maps, "libnvidia_ml": "libnvidia-ml" in maps})
def attempt(fn):
    try:
        return fn()
    except Exception as e:
        return e
mark("python")
which = sys.argv[2]
if which == "nvml":
    import pynvml as n
    if len(sys.argv) > 3:  # --stub: bench/nvml_stub.py's library, to try the steps anywhere
        sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
        from nvml_stub import load
        load(1, 0, 0)
    mark("import pynvml")
    n.nvmlInit()
    mark("nvmlInit")
    hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    for h in hs:
        for f in ("nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetName",
                  "nvmlDeviceGetSerial", "nvmlDeviceGetVbiosVersion",
                  "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetArchitecture",
                  "nvmlDeviceGetMinorNumber"):
            attempt(lambda: getattr(n, f)(h))
    mark("identity (uuid, pci, name, serial, vbios, compute capability, ...)")
    from exporter.sources.nvidia.fields import field_values
    mark("import the exporter's field-values call (and what it imports)")
    for h in hs:
        attempt(lambda: n.nvmlDeviceGetUtilizationRates(h))
        attempt(lambda: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2))
        attempt(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))
        attempt(lambda: n.nvmlDeviceGetPowerUsage(h))
        for c in (n.NVML_CLOCK_GRAPHICS, n.NVML_CLOCK_SM, n.NVML_CLOCK_MEM, n.NVML_CLOCK_VIDEO):
            attempt(lambda: n.nvmlDeviceGetClockInfo(h, c))
        attempt(lambda: n.nvmlDeviceGetPerformanceState(h))
        attempt(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        for f in ("nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
                  "nvmlDeviceGetJpgUtilization", "nvmlDeviceGetOfaUtilization"):
            attempt(lambda: getattr(n, f)(h))
        attempt(lambda: field_values(n, h, ((n.NVML_FI_DEV_MEMORY_TEMP, 0),
                                            (n.NVML_FI_DEV_POWER_INSTANT, 0))))
    mark("fast getters and the fast field values")
    for h in hs:
        attempt(lambda: n.nvmlDeviceGetComputeRunningProcesses(h))
        attempt(lambda: n.nvmlDeviceGetGraphicsRunningProcesses(h))
    mark("process lists")
    es = n.nvmlEventSetCreate()
    for h in hs:
        attempt(lambda: n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es))
    attempt(lambda: n.nvmlEventSetWait_v2(es, 0))
    mark("XID event set, registered, waited on")
    bufs = []
    for h in hs:
        support = attempt(lambda: n.nvmlGpmQueryDeviceSupport(h))
        if getattr(support, "isSupportedDevice", 0):
            a, b = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
            bufs += [a, b]
            attempt(lambda: n.nvmlGpmSampleGet(h, a))
            time.sleep(0.1)
            attempt(lambda: n.nvmlGpmSampleGet(h, b))
    mark(f"GPM: {len(bufs)} sample buffers, two samples")
    for h in hs:
        attempt(lambda: n.nvmlDeviceGetProcessUtilization(h, 0))
        attempt(lambda: n.nvmlDeviceGetTotalEnergyConsumption(h))
        attempt(lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES))
        attempt(lambda: n.nvmlDeviceGetViolationStatus(h, n.NVML_PERF_POLICY_POWER))
        attempt(lambda: n.nvmlDeviceGetMigMode(h))
        attempt(lambda: n.nvmlDeviceGetNvLinkState(h, 0))
    mark("slow getters (process utilisation, energy, PCIe, violations, MIG, NVLink)")
    from exporter.sources.nvidia.backend import NvidiaBackend
    from exporter.core.config import Config
    mark("import the exporter's NVIDIA backend")
    b = NvidiaBackend(Config())
    b.open()
    for slow in (True, False, False, True):
        b.sample(slow)
    mark("the exporter's NVIDIA backend opened, 4 cycles")
else:
    from nvitop import Device
    mark("import nvitop")
    devices = Device.all()
    for d in devices:
        d.as_snapshot()
        d.processes()
    mark("nvitop: Device.all(), a snapshot and the processes of each")
print(json.dumps(steps))
"""


def sequence(which: str, stub: bool = False) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(REPO), which,
                          *(["stub"] if stub else [])], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    if out.returncode != 0:
        return [{"step": f"{which}: failed", "error": out.stderr.strip()[-400:]}]
    steps: list[dict[str, object]] = json.loads(out.stdout.strip().splitlines()[-1])
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--stub", action="store_true", help="the stub library (no GPU): a dry run")
    args = ap.parse_args()
    result = {}
    for which in ("nvml", "nvitop"):
        steps = sequence(which, args.stub)
        result[which] = steps
        print(f"\n{which}: RSS after each step (MiB), what it added, anonymous / file-backed, "
              "threads, libcuda mapped")
        before = None
        for s in steps:
            if "error" in s:
                print(f"  {s['step']}: {s['error']}")
                continue
            rss = int(s["rss_kib"]) / 1024  # type: ignore[call-overload]
            delta = "" if before is None else f"+{rss - before:5.1f}"
            print(f"  {s['step']:<72} {rss:6.1f} {delta:>6}  anon "
                  f"{int(s['anon_kib']) / 1024:5.1f} file {int(s['file_kib']) / 1024:5.1f}  "  # type: ignore[call-overload]
                  f"threads {s['threads']}  libcuda {'yes' if s['libcuda'] else 'no'}")
            before = rss
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
