"""What metric selection saves: bytes and render time of the per-GPU and per-process
families with and without ``--collector.metrics.include/exclude`` and ``--dcgm.counters``.

    python bench/selection.py [--gpus 8] [--processes 64] [--n 200]

Builds ``--gpus`` H100 samples (every field ``bench/dcgm_render.py`` fills) with
``--processes`` processes each, and renders them as text exposition (families built and
written by prometheus-client, as ``/metrics`` does) under each selection; prints the
median render time, the body size and both as a ratio of the unselected render.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from prometheus_client import exposition  # noqa: E402
from prometheus_client.registry import CollectorRegistry  # noqa: E402

from exporter.core.model import ProcessSample  # noqa: E402
from exporter.output.dcgm import FIELDS  # noqa: E402
from exporter.output.render import RenderOptions, device_families  # noqa: E402
from exporter.output.render.selection import Selection  # noqa: E402

# The fields dcgm-exporter's etc/default-counters.csv enables that we fill.
DEFAULT_COUNTERS = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE"})
KEY_FAMILIES = ("gpu_(utilization_ratio|memory_used_bytes|memory_total_bytes|power_watts|"
                "temperature_celsius|up|info)")
CASES: tuple[tuple[str, str, Selection], ...] = (
    ("everything", "gpu", Selection()),
    ("exclude gpu_process_.*", "gpu", Selection(exclude="gpu_process_.*")),
    ("include 7 key families", "gpu", Selection(include=KEY_FAMILIES)),
    ("dcgm, every field", "dcgm", Selection()),
    ("dcgm, default-counters", "dcgm", Selection(dcgm_fields=DEFAULT_COUNTERS)),
)


def snapshot(gpus: int, processes: int) -> Any:
    from dcgm_render import sample  # type: ignore[import-not-found]

    devices = []
    for i in range(gpus):
        procs = tuple(ProcessSample(pid=1000 * i + p, process=f"proc{p}",
                                    memory_used_bytes=float(p << 20),
                                    utilization_ratio={"sm": 0.5},
                                    host_memory_bytes=float(p << 22), source="nvml")
                      for p in range(processes))
        devices.append((str(i), sample(i, 0).with_processes(procs)))

    class Snap:
        health = ()

    snap = Snap()
    snap.devices = tuple(devices)  # type: ignore[attr-defined]
    return snap


class Families:
    def __init__(self, snap: Any, opts: RenderOptions) -> None:
        self.snap, self.opts = snap, opts

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield from device_families(self.snap, self.opts)


def measure(snap: Any, mode: str, selection: Selection, n: int) -> tuple[float, int]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(snap, RenderOptions(metric_names=mode, hostname="bench",
                                                   selection=selection)))
    times, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        size = len(exposition.generate_latest(registry))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes", type=int, default=64)
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    assert DEFAULT_COUNTERS <= {f.name for f in FIELDS}
    snap = snapshot(args.gpus, args.processes)
    print(f"{args.gpus} GPUs x {args.processes} processes, text exposition, median of "
          f"{args.n}")
    base: dict[str, tuple[float, int]] = {}
    for name, mode, selection in CASES:
        ms, size = measure(snap, mode, selection, args.n)
        ref_ms, ref_size = base.setdefault(mode, (ms, size))
        print(f"{name:26s} --metric-names={mode:4s} {ms:7.2f} ms ({ms / ref_ms:4.2f}x)  "
              f"{size:8d} bytes ({size / ref_size:4.2f}x)")


if __name__ == "__main__":
    main()
