"""What reading the PMU costs per cycle: one grouped read(2) against one read per counter.

    python bench/pmu_read.py [--rounds 2000]

On this machine's real kernel, with software task-clock counters of this process (the
GPU's events need an Intel GPU and CAP_PERFMON; a group read is the same syscall path
through the perf core): the median of one ``CounterGroup.read()`` of N counters, against
N separate reads of N ungrouped counters, for N = 2, 8, 20 (20: a B580's 10 engines x 2).
Then ``PmuBackend.sample()`` on the intel-xe-b580 fixture with the fake kernel: the
backend's own Python cost per cycle, without the syscall.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.sources.kernel import perf  # noqa: E402

FORMAT = perf.PERF_FORMAT_GROUP | perf.PERF_FORMAT_TOTAL_TIME_ENABLED
USER_ONLY = perf.FLAG_EXCLUDE_KERNEL | perf.FLAG_EXCLUDE_HV  # allowed at paranoid 2


def task_clocks(n: int, grouped: bool) -> list[perf.CounterGroup]:
    groups: list[perf.CounterGroup] = []
    fds: list[int] = []
    for _ in range(n):
        attr = perf.counting_attr(perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_TASK_CLOCK,
                                  FORMAT, USER_ONLY)
        leader = fds[0] if grouped and fds else -1
        fd = perf.LIBC.open(attr, 0, -1, leader, perf.PERF_FLAG_FD_CLOEXEC)
        if grouped:
            fds.append(fd)
        else:
            groups.append(perf.CounterGroup(perf.LIBC, [fd], [0]))
    return [perf.CounterGroup(perf.LIBC, fds, list(range(n)))] if grouped else groups


def median_us(fn, rounds: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2000)
    rounds = parser.parse_args().rounds
    try:
        task_clocks(1, True)[0].close()
    except OSError as exc:
        print(f"perf_event_open refused here ({exc}); only the fake-kernel line follows")
    else:
        for n in (2, 8, 20):
            (group,) = task_clocks(n, True)
            single = task_clocks(n, False)
            one = median_us(group.read, rounds)
            each = median_us(lambda: [g.read() for g in single], rounds)  # noqa: B023
            print(f"{n:2d} counters: one group read {one:7.1f} us, {n} reads {each:7.1f} us, "
                  f"ratio {each / one:4.1f}x")
            for g in (group, *single):
                g.close()

    from exporter.core.config import Config
    from exporter.core.fs import SysFS
    from exporter.sources.discovery import DrmDiscovery
    from exporter.sources.intel.pmu import PmuBackend
    from tests.fakes.fake_perf import FakePerf

    machine = ROOT / "tests" / "fixtures" / "intel-xe-b580"
    sysfs = str(machine / "sys")
    backend = PmuBackend(Config(sysfs=sysfs), DrmDiscovery(SysFS(sysfs), hotplug=False),
                         FakePerf.from_json(machine / "perf.json"))
    backend.open()
    print(f"PmuBackend.sample() on intel-xe-b580 (fake kernel, 20 counters): "
          f"{median_us(lambda: backend.sample(False), rounds):.1f} us median")


if __name__ == "__main__":
    main()
