"""Does the NVIDIA driver look past the array of nvmlDeviceGetFieldValues? Run on a real GPU.

    python3 bench/nvml_field_overrun.py [--seconds 20] [--runs 3]

1. probe: per GPU, the daemon's slow batch (recovery action, then NVLink TX/RX data
   throughput per link) over an array with one spare entry after ``count``; the spare
   holds field id 138 (NVLink TX throughput), then 0, then 230. Prints whether the driver
   wrote the spare's timestamp (it does not touch the caller's other memory here: the
   spare is ours).
2. loop: the same batch in a tight loop with allocations between calls, each in a child
   process, ``runs`` times for ``seconds``: once through nvidia-ml-py's own
   ``nvmlDeviceGetFieldValues`` (an exactly sized array) and once through the exporter's
   ``fields.field_values`` (zeroed spare entries). Prints how each child ended
   (a negative code is the signal that killed it: -11 SIGSEGV, -6 SIGABRT).
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LOOP = """
import sys, time, pynvml
sys.path.insert(0, {repo!r})
from exporter.sources.nvidia.fields import field_values
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
batch = {batch!r}
end = time.time() + {seconds}
calls, junk = 0, []
while time.time() < end:
    for h in handles:
        if {wrapper}:
            pynvml.nvmlDeviceGetFieldValues(h, batch)
        else:
            field_values(pynvml, h, batch)
        calls += 1
        junk.append(bytearray(calls % 997 + 1))  # move the heap around between calls
        junk = junk[-512:]
print(calls)
"""


def batch(nvml) -> list[tuple[int, int]]:
    tx, rx = nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    return [(nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0)] + [
        (f, link) for link in range(links) for f in (tx, rx)]


def probe(nvml) -> None:
    keys = batch(nvml)
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        up = sum(1 for link in range(nvml.NVML_NVLINK_MAX_LINKS)
                 if _link_up(nvml, h, link))
        for spare_id in (keys[1][0], 0, keys[0][0]):
            arr = (nvml.c_nvmlFieldValue_t * (len(keys) + 1))()
            for entry, (fid, scope) in zip(arr, keys, strict=False):
                entry.fieldId, entry.scopeId = fid, scope
            arr[len(keys)].fieldId = spare_id
            ret = fn(h, ctypes.c_int32(len(keys)), ctypes.byref(arr))
            spare = arr[len(keys)]
            touched = spare.timestamp != 0 or spare.nvmlReturn != 0 or spare.valueType != 0
            ok = sum(1 for e in arr[:len(keys)] if e.nvmlReturn == 0)
            seen = f"WRITTEN (timestamp {spare.timestamp})" if touched else "untouched"
            print(f"probe GPU {i} ({up} NVLinks up): batch of {len(keys)} ending in field "
                  f"{keys[-1][0]}, spare field id {spare_id}: return {ret}, {ok} values ok, "
                  f"spare entry {seen}")


def _link_up(nvml, h, link: int) -> bool:
    try:
        return nvml.nvmlDeviceGetNvLinkState(h, link) == 1
    except nvml.NVMLError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import pynvml
    pynvml.nvmlInit()
    print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, nvidia-ml-py "
          f"{getattr(pynvml, '__version__', '?')}, {pynvml.nvmlDeviceGetCount()} GPU(s)")
    probe(pynvml)
    keys = batch(pynvml)
    pynvml.nvmlShutdown()
    repo = str(Path(__file__).resolve().parents[1])
    for label, wrapper in (("nvidia-ml-py nvmlDeviceGetFieldValues", True),
                           ("exporter fields.field_values", False)):
        ends = []
        for _ in range(args.runs):
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-c", LOOP.format(
                repo=repo, batch=keys, seconds=args.seconds, wrapper=wrapper)],
                capture_output=True, text=True)
            took = time.monotonic() - t0
            calls = done.stdout.strip() or "-"
            ends.append(f"exit {done.returncode} after {took:.1f} s ({calls} calls)")
        crashed = sum(1 for e in ends if not e.startswith("exit 0 "))
        print(f"loop {label}: {crashed} of {args.runs} crashed: " + "; ".join(ends))
    return 0


if __name__ == "__main__":
    sys.exit(main())
