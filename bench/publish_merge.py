"""Cost of one Hub publish, now that it merges: merge, process cap, pod attribution and
health verdicts once per snapshot, on the publishing thread (exporter.pipeline.state.merged_view).

    python bench/publish_merge.py [--gpus 8] [--processes 64] [--n 300]

Two backends report the same ``--gpus`` H100s (every field ``bench/dcgm_render.py``
fills): a library one with ``--processes`` processes per GPU, and an augmenting one
(fdinfo-like: engine ratios and the same processes' host memory). Prints the median of
``Hub.publish()`` and of ``merged_view`` alone, in microseconds; a publish happens once
per backend per cycle.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from dcgm_render import sample  # type: ignore[import-not-found]  # noqa: E402

from exporter.core.config import Config  # noqa: E402
from exporter.core.model import DeviceInfo, DeviceSample, ProcessSample  # noqa: E402
from exporter.pipeline.hub import Hub  # noqa: E402
from exporter.pipeline.state import merged_view  # noqa: E402
from exporter.sources.base import DERIVED, LIBRARY, PLAIN, Cycle  # noqa: E402


class Fixed:
    """A backend that returns the same devices every cycle."""

    def __init__(self, name: str, priority: int, devices: Sequence[DeviceSample]) -> None:
        self.name, self.source, self.priority, self.interval = name, name, priority, None
        self.capabilities = PLAIN
        self.devices = list(devices)

    def open(self) -> Sequence[DeviceInfo]:
        return [d.info for d in self.devices if d.primary]

    def sample(self, slow: bool) -> Cycle:
        return Cycle(self.devices)

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--processes", type=int, default=64)
    ap.add_argument("--n", type=int, default=300)
    a = ap.parse_args()
    library, derived = [], []
    for i in range(a.gpus):
        d = sample(i, 0)
        procs = tuple(ProcessSample(pid=1000 * i + p, process=f"proc{p}",
                                    memory_used_bytes=float(p << 20), source="nvml")
                      for p in range(a.processes))
        library.append(d.with_processes(procs))
        derived.append(DeviceSample(
            info=d.info, source="fdinfo", primary=False,
            engine_utilization_ratio={"compute": 0.5, "copy": 0.1},
            processes=tuple(ProcessSample(pid=p.pid, process=p.process,
                                          host_memory_bytes=float(1 << 30)) for p in procs)))
    backends = [Fixed("nvidia", LIBRARY, library), Fixed("fdinfo", DERIVED, derived)]
    hub = Hub(Config(), backends)
    snapshot = hub.collect_once()
    assert len(snapshot.devices) == a.gpus and snapshot.processes_truncated_total == 0
    publish, merge = [], []
    for _ in range(a.n):
        t0 = time.perf_counter()
        hub.publish()
        publish.append((time.perf_counter() - t0) * 1e6)
        t0 = time.perf_counter()
        merged_view(snapshot.backends, snapshot.seen, snapshot.gpu_index, 64, time.time(),
                    3600.0)
        merge.append((time.perf_counter() - t0) * 1e6)
    hub.stop()
    print(f"gpus={a.gpus} processes/gpu={a.processes} n={a.n}")
    print(f"publish median {statistics.median(publish):.0f} us")
    print(f"merged_view median {statistics.median(merge):.0f} us")


if __name__ == "__main__":
    main()
