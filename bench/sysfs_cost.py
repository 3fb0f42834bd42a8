"""What the AMD and Intel sysfs backends cost per card per fast cycle, against the floor.

    python bench/sysfs_cost.py [--cycles 2000] [--daemon-window 60] [--no-daemon]

Builds a three-GPU machine in a temporary directory from the committed fixture trees
(tests/fixtures/mixed with its NVIDIA card taken out: AMD RX 7800 XT + Intel Arc B580;
plus the RX 6900 XT of tests/fixtures/amd-rdna2-rx6900xt as a second AMD card), then:

1. Per backend, CPU per card per fast cycle: thread CPU time (``time.thread_time_ns``)
   of ``sample(slow=False)``, median over ``--cycles`` cycles after a warm-up.
2. The floor: a bare loop that ``os.pread``s exactly the files the backend read in
   one steady fast cycle (found with an audit hook on ``open`` and a wrapper of
   ``os.pread``), on descriptors kept open, and nothing else; the same median, and
   the ratio backend / bare loop.
3. The idle daemon on that machine at ``--collector.interval 1s``, no scrapes, its
   /proc being an empty tree (no process scan): % of one core over the window,
   measured by bench/daemon_cost.py's ``measure``.

Targets: backend at most 0.12 ms per card per fast cycle (earlier: 0.25 ms, and within
2x of the bare loop); the idle daemon at most 0.2 % of one core, the PMU thread included.
Compare two trees in the same minutes on a busy machine:
``PYTHONPATH=<tree> python <tree>/bench/sysfs_cost.py`` for each, alternating.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from daemon_cost import measure  # noqa: E402
from scrape_latency import start_daemon  # noqa: E402

from exporter.core.config import Config  # noqa: E402
from exporter.core.fs import SysFS  # noqa: E402
from exporter.sources.amd.backend import AmdBackend  # noqa: E402
from exporter.sources.discovery import DrmDiscovery  # noqa: E402
from exporter.sources.intel.backend import IntelBackend  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
PAGE = 4096
TARGET_MS_PER_CARD = 0.12
TARGET_RATIO = 2.0
TARGET_IDLE_PERCENT = 0.2


def build_machine(dest: Path) -> Path:
    """AMD + AMD + Intel under ``dest``; returns the sysfs root."""
    root = dest / "sys"
    shutil.copytree(FIXTURES / "mixed" / "sys", root, symlinks=True)
    drm = root / "class" / "drm"
    for name in os.listdir(drm):  # the NVIDIA function's nodes: not read by amd/intel
        if "0000:05:00.0" in os.readlink(drm / name):
            (drm / name).unlink()
    other = FIXTURES / "amd-rdna2-rx6900xt" / "sys"
    src = (other / "class" / "drm" / "card0" / "device").resolve()
    dst = root / "devices" / "pci0000:00" / "0000:00:03.2" / "0000:0c:00.0"
    shutil.copytree(src, dst, symlinks=True)
    os.symlink(os.path.relpath(dst / "drm" / "card0", drm), drm / "card3")
    return root


def files_read(cycle: Callable[[], Any]) -> list[str]:
    """The regular files one ``cycle()`` reads: those it opens (an audit hook sees
    ``open()`` and ``os.open``) and those it ``os.pread``s on descriptors kept open."""
    seen: dict[str, None] = {}
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if os.path.isfile(path):
                seen.setdefault(path, None)

    real_pread = os.pread

    def pread(fd: int, size: int, offset: int) -> bytes:
        seen.setdefault(os.readlink(f"/proc/self/fd/{fd}"), None)
        return real_pread(fd, size, offset)

    sys.addaudithook(hook)  # cannot be removed: switched off below
    os.pread = pread
    try:
        cycle()
    finally:
        active[0] = False
        os.pread = real_pread
    return list(seen)


def cpu_per_cycle_ms(cycle: Callable[[], Any], cycles: int, warmup: int = 50) -> float:
    for _ in range(warmup):
        cycle()
    times = []
    for _ in range(cycles):
        t0 = time.thread_time_ns()
        cycle()
        times.append(time.thread_time_ns() - t0)
    return statistics.median(times) / 1e6


def bare_loop(paths: list[str]) -> tuple[Callable[[], None], Callable[[], None]]:
    """(one cycle of pread on kept descriptors, close them)."""
    fds = [os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) for p in paths]
    pread = os.pread

    def cycle() -> None:
        for fd in fds:
            try:
                pread(fd, PAGE, 0)
            except OSError:
                pass

    def close() -> None:
        for fd in fds:
            os.close(fd)

    return cycle, close


def backend_cost(kind: str, root: Path, cycles: int) -> None:
    config = Config(sysfs=str(root))
    discovery = DrmDiscovery(SysFS(root), hotplug=False)
    backend: AmdBackend | IntelBackend = (
        AmdBackend(config, discovery) if kind == "amd" else IntelBackend(config, discovery))
    cards = len(backend.open())
    backend.sample(False)  # the first cycle reads labels, layout and the slow tier
    files = files_read(lambda: backend.sample(False))  # what a fast cycle reads
    ms = cpu_per_cycle_ms(lambda: backend.sample(False), cycles)
    bare, close = bare_loop(files)
    floor = cpu_per_cycle_ms(bare, cycles)
    close()
    backend.close()
    per_card, floor_card = ms / cards, floor / cards
    ratio = per_card / floor_card
    print(f"{kind:<6} {cards} card(s), {len(files) / cards:5.1f} files/card: "
          f"{per_card:.4f} ms/card/cycle; bare pread loop {floor_card:.4f} ms/card; "
          f"ratio {ratio:.1f}x (targets: <= {TARGET_MS_PER_CARD} ms: "
          f"{_met(per_card <= TARGET_MS_PER_CARD)}, <= {TARGET_RATIO:.0f}x: "
          f"{_met(ratio <= TARGET_RATIO)})")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000, help="measured cycles per backend")
    ap.add_argument("--daemon-window", type=float, default=60.0, help="seconds (default 60)")
    ap.add_argument("--daemon-warmup", type=float, default=10.0, help="seconds (default 10)")
    ap.add_argument("--no-daemon", action="store_true", help="skip the idle-daemon run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sysfs-cost-") as tmp:
        root = build_machine(Path(tmp))
        print(f"machine: AMD RX 7800 XT + AMD RX 6900 XT + Intel Arc B580 (xe) under {root}")
        print(f"CPU per fast cycle: median of {args.cycles} cycles, thread CPU time")
        for kind in ("amd", "intel"):
            backend_cost(kind, root, args.cycles)
        if args.no_daemon:
            return
        proc = Path(tmp) / "proc"
        proc.mkdir()
        extra = ["--path.sysfs", str(root), "--path.procfs", str(proc),
                 "--collector.interval", "1s"]
        print(f"\nidle daemon, 1 s interval, no scrapes, {args.daemon_window:.0f} s window "
              f"(target <= {TARGET_IDLE_PERCENT} % of one core):")
        with start_daemon(True, extra) as target:
            time.sleep(args.daemon_warmup)
            measure(target.proc.pid, target.port, args.daemon_window, 0)
            if target.proc.poll() is not None:
                raise SystemExit(f"exporter exited during the window:\n{target.log_tail()}")


if __name__ == "__main__":
    main()
