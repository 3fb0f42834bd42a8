"""NVML's per-process utilisation timestamps on a real GPU are on the host's wall clock,
and the reader drops none of a busy process's samples as ``clock``.

``ProcessReader`` places its last read on NVML's clock through its own monotonic clock
and drops a sample stamped in the future or before that read (counted ``clock``): that
is right only if the driver stamps samples with the wall clock, which is what this
checks, with a matmul workload, printing the numbers. Skipped without a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter

from exporter.core.config import Config
from exporter.core.labels import ErrorReason
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.hardware.test_nvidia_h100 import WORKLOAD

SLOW = 2.0


def test_samples_are_stamped_on_the_wall_clock_and_none_is_dropped() -> None:
    import pynvml

    work = subprocess.Popen([sys.executable, "-c", WORKLOAD], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    backend = NvidiaBackend(Config(procfs="/proc"))
    backend.open()
    try:
        assert work.stdout is not None and work.stdout.readline().strip() == "ready"
        errors: Counter[ErrorReason] = Counter()
        seen: list[float | None] = []
        for _ in range(6):
            time.sleep(SLOW)
            cycle = backend.sample(slow=True)
            errors.update(cycle.errors)
            mine = [p for d in cycle.devices for p in d.processes if p.pid == work.pid]
            seen.append(mine[0].utilization_ratio.get("sm") if mine else None)
        handle = next(g.dev.handle for g in backend._gpus
                      if any(p.pid == work.pid for p in g.procs.read(Counter())))
        now = time.time()
        stamps = [s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(
            handle, int((now - 5) * 1e6)) if s.pid == work.pid]
    finally:
        backend.close()
        work.kill()
        work.wait(10)
        if work.stdout is not None:
            work.stdout.close()
    print(f"\nSM ratio of the workload per slow cycle: {seen}")
    print(f"errors: {dict(errors)}; newest stamp {max(stamps) / 1e6:.3f} vs wall {now:.3f}")
    assert stamps and abs(max(stamps) / 1e6 - now) < 5.0  # the wall clock's frame
    assert all(r is not None and r > 0 for r in seen[1:])
    assert errors[ErrorReason.CLOCK] <= 1  # at most a stale entry of an exited pid
