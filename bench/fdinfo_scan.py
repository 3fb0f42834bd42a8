#!/usr/bin/env python3
"""Cost of one per-process fdinfo scan on a busy host, next to the floor.

Generates a procfs-shaped tree in a temp dir: ``--processes`` pids (default 5,000)
with ``--fds`` fds each (default 20), of which ``--clients`` processes (default 50)
hold one fd on ``/dev/dri/renderD128`` with an amdgpu fdinfo. The other fds point
at sockets, pipes, /dev/null and files, as on a real desktop or node.

Then, in the same run and interleaved (so both see the same cache and CPU
contention), it times ``--rounds`` calls of:
- scan: ``FdinfoBackend.sample()``, the real backend (walk, parse, dedup, deltas,
  comm/statm of the clients, DeviceSample building);
- floor: a bare loop that lists the same ``fd`` directories, reads the same links
  and reads the same fdinfo files, and does nothing else.

Prints the median CPU time (process_time) and wall time per scan of each and the
ratio. Usage: ``python bench/fdinfo_scan.py [--rounds 9]``.

``--nvidia-only``: the same host with no driver that writes DRM usage stats. The
``--clients`` processes hold ``/dev/dri/card0`` of an NVIDIA card (nvidia-drm's fdinfo
has no ``drm-`` keys), ``class/drm`` has only that card. It times what the backend
did there every scan before it checked for such a card (the same /proc walk, finding
nothing) next to what it does now: ``open()``, a look at ``class/drm`` that says
"no amdgpu, i915 or xe card", which the collector repeats every ``capabilities.retry_interval``.

``--one-process N``: one process holding N DRM fds (N clients), nothing else. Times a
scan with ``--budget`` (default 0.5 s) next to the same scan with no budget in reach:
the whole walk, which is what every scan cost before the budget was checked inside a
process's fd walk. Prints the medians (time, clients read per scan) and how many
scans stopped at the budget and counted it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.core.config import Config  # noqa: E402
from exporter.sources.base import BackendUnavailable  # noqa: E402
from exporter.sources.fdinfo.backend import FdinfoBackend  # noqa: E402
from exporter.sources.fdinfo.scan import KnownCards, ScanResult  # noqa: E402

FDINFO = (
    "pos:\t0\nflags:\t02100002\nmnt_id:\t23\nino:\t1185\npasid:\t{pasid}\n"
    "drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t{cid}\n"
    "drm-engine-gfx:\t{gfx} ns\ndrm-engine-compute:\t{compute} ns\n"
    "drm-memory-vram:\t{vram} KiB\ndrm-memory-gtt: \t65536 KiB\ndrm-memory-cpu: \t0 KiB\n"
    "amd-memory-visible-vram:\t{vram} KiB\namd-evicted-vram:\t0 KiB\n"
    "amd-evicted-visible-vram:\t0 KiB\namd-requested-vram:\t{vram} KiB\n"
    "amd-requested-visible-vram:\t{vram} KiB\namd-requested-gtt:\t65536 KiB\n"
)
# nvidia-drm implements no show_fdinfo: only the VFS lines.
NVIDIA_FDINFO = "pos:\t0\nflags:\t02100002\nmnt_id:\t25\nino:\t{pasid}\n"
OTHER_TARGETS = ("socket:[{n}]", "pipe:[{n}]", "/dev/null", "anon_inode:[eventfd]",
                 "/usr/lib/x86_64-linux-gnu/libc.so.6", "/var/log/journal/{n}.journal")


def generate(root: Path, processes: int, fds: int, clients: int, nvidia: bool = False) -> None:
    step = max(1, processes // clients)
    client_pids = {1000 + i * step for i in range(clients)}
    node, text = ("/dev/dri/card0", NVIDIA_FDINFO) if nvidia else ("/dev/dri/renderD128", FDINFO)
    for i in range(processes):
        pid = 1000 + i
        d = root / str(pid)
        (d / "fd").mkdir(parents=True)
        (d / "fdinfo").mkdir()
        (d / "comm").write_text(f"proc{pid}\n")
        (d / "statm").write_text("25000 4000 1000 200 0 9000 0\n")
        for fd in range(fds):
            if pid in client_pids and fd == fds - 1:
                os.symlink(node, d / "fd" / str(fd))
                (d / "fdinfo" / str(fd)).write_text(text.format(
                    pasid=32768 + i, cid=pid, gfx=pid * 1_000_003, compute=pid * 7,
                    vram=4096 + pid))
            else:
                target = OTHER_TARGETS[fd % len(OTHER_TARGETS)].format(n=pid * 100 + fd)
                os.symlink(target, d / "fd" / str(fd))


def add_card(sys_root: Path, bus: str, driver: str, pci_id: str) -> None:
    """``class/drm/card0`` -> a PCI function bound to ``driver``, as sysfs links it."""
    dev = sys_root / "devices" / "pci0000:00" / bus
    (dev / "drm" / "card0").mkdir(parents=True)
    (dev / "vendor").write_text(f"0x{pci_id[:4].lower()}\n")
    (dev / "device").write_text(f"0x{pci_id[5:].lower()}\n")
    (dev / "uevent").write_text(f"DRIVER={driver}\nPCI_ID={pci_id}\nPCI_SLOT_NAME={bus}\n")
    drivers = sys_root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True)
    os.symlink(os.path.relpath(drivers, dev), dev / "driver")
    os.symlink("../..", dev / "drm" / "card0" / "device")
    (sys_root / "class" / "drm").mkdir(parents=True)
    os.symlink(f"../../devices/pci0000:00/{bus}/drm/card0", sys_root / "class" / "drm" / "card0")


def floor(root: str) -> int:
    """The unavoidable work: list every fd dir, read every link, read DRM fdinfo."""
    found = 0
    for pid in os.listdir(root):
        if not pid.isdigit():
            continue
        try:
            names = os.listdir(f"{root}/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"{root}/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith(("/dev/dri/", "/dev/accel/")):
                with open(f"{root}/{pid}/fdinfo/{name}", "rb") as f:
                    f.read(65537)
                found += 1
    return found


def timed(fn: object) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()  # type: ignore[operator]
    return time.process_time() - cpu, time.perf_counter() - wall


def med(xs: list[tuple[float, float]], i: int) -> float:
    return statistics.median(x[i] for x in xs) * 1000


def nvidia_only(tmp: Path, args: argparse.Namespace) -> None:
    """Before: the walk every scan. Now: open() finds no usage-stats card and stops."""
    sys_root = tmp / "sys"
    add_card(sys_root, "0000:18:00.0", "nvidia", "10DE:2330")  # H100 SXM5
    config = Config(procfs=str(tmp / "proc"), sysfs=str(sys_root), processes_budget=60.0)
    backend = FdinfoBackend(config)
    scanner = backend.scanner

    def walk() -> None:  # what sample() did on this host before the check
        scan = scanner.scan(scanner.pids(), float("inf"), KnownCards({}, {}))
        assert not scan.clients and not scan.errors

    def check() -> None:
        try:
            backend.open()
        except BackendUnavailable:
            return
        raise AssertionError("open() should find no amdgpu/i915/xe card here")

    walk_t: list[tuple[float, float]] = []
    check_t: list[tuple[float, float]] = []
    for _ in range(args.rounds):
        walk_t.append(timed(walk))
        check_t.append(timed(lambda: [check() for _ in range(1000)]))
    scan_every, check_every = config.processes_interval, backend.capabilities.retry_interval
    print(f"nvidia-only host, rounds: {args.rounds} (median)")
    print(f"{'':32}{'cpu ms':>10}{'wall ms':>10}")
    print(f"{'before: /proc walk per scan':32}{med(walk_t, 0):10.2f}{med(walk_t, 1):10.2f}")
    print(f"{'now: open() check per call':32}{med(check_t, 0) / 1000:10.4f}"
          f"{med(check_t, 1) / 1000:10.4f}")
    before = med(walk_t, 0) / scan_every
    now = med(check_t, 0) / 1000 / check_every
    print(f"CPU per second at the defaults (scan every {scan_every:g} s, check every "
          f"{check_every:g} s): before {before:.2f} ms/s, now {now:.4f} ms/s "
          f"({before / now:.0f}x less)")


def one_process(tmp: Path, args: argparse.Namespace) -> None:
    """One process with ``args.one_process`` DRM clients: budgeted scan vs the whole walk."""
    d = tmp / "proc" / "4242"
    (d / "fd").mkdir(parents=True)
    (d / "fdinfo").mkdir()
    (d / "comm").write_text("many-fds\n")
    (d / "statm").write_text("25000 4000 1000 200 0 9000 0\n")
    for fd in range(3, 3 + args.one_process):
        os.symlink("/dev/dri/renderD128", d / "fd" / str(fd))
        (d / "fdinfo" / str(fd)).write_text(FDINFO.format(
            pasid=32768, cid=fd, gfx=fd * 1_000_003, compute=fd * 7, vram=4096))
    sys_root = tmp / "sys"
    add_card(sys_root, "0000:03:00.0", "amdgpu", "1002:747E")

    def run(budget: float) -> tuple[list[tuple[float, float]], int, int]:
        config = Config(procfs=str(tmp / "proc"), sysfs=str(sys_root), processes_budget=budget)
        backend = FdinfoBackend(config)
        backend.open()
        scans: list[ScanResult] = []
        walk = backend.scanner.scan

        def recorded(*a: Any, **kw: Any) -> ScanResult:  # keeps what each scan read
            scans.append(walk(*a, **kw))
            return scans[-1]

        backend.scanner.scan = recorded  # type: ignore[method-assign]
        times = [timed(lambda: backend.sample(slow=False)) for _ in range(args.rounds)]
        return (times, int(statistics.median(len(x.clients) for x in scans)),
                sum(x.errors["budget"] for x in scans))

    whole, whole_read, _ = run(600.0)
    cut, cut_read, counted = run(args.budget)
    print(f"one process, {args.one_process} DRM fds, rounds: {args.rounds} (median per scan)")
    print(f"{'':28}{'cpu ms':>10}{'wall ms':>10}{'clients':>9}  scans cut")
    print(f"{'whole walk (no budget)':28}{med(whole, 0):10.1f}{med(whole, 1):10.1f}"
          f"{whole_read:9d}  0 of {args.rounds}")
    print(f"{f'budget {args.budget:g} s':28}{med(cut, 0):10.1f}{med(cut, 1):10.1f}"
          f"{cut_read:9d}  {counted} of {args.rounds}")
    print(f"{'ratio (budget / whole)':28}{med(cut, 0) / med(whole, 0):10.2f}"
          f"{med(cut, 1) / med(whole, 1):10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=5000)
    ap.add_argument("--fds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--one-process", type=int, default=0, metavar="N",
                    help="one process with N DRM fds: a budgeted scan vs the whole walk")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--nvidia-only", action="store_true",
                    help="no amdgpu/i915/xe card: the scan before vs the check now")
    args = ap.parse_args()

    if args.one_process:
        with tempfile.TemporaryDirectory(prefix="fdinfo-bench-") as tmp:
            one_process(Path(tmp), args)
        return
    with tempfile.TemporaryDirectory(prefix="fdinfo-bench-") as tmp:
        proc = Path(tmp) / "proc"
        t0 = time.perf_counter()
        generate(proc, args.processes, args.fds, args.clients, nvidia=args.nvidia_only)
        print(f"generated {args.processes} processes x {args.fds} fds "
              f"({args.clients} DRM clients) in {time.perf_counter() - t0:.1f} s")
        if args.nvidia_only:
            nvidia_only(Path(tmp), args)
            return

        sys_root = Path(tmp) / "sys"
        add_card(sys_root, "0000:03:00.0", "amdgpu", "1002:747E")  # the fdinfo's drm-pdev
        config = Config(procfs=str(proc), sysfs=str(sys_root), processes_budget=60.0)
        backend = FdinfoBackend(config)
        backend.open()
        assert floor(str(proc)) == args.clients
        cycle = backend.sample(slow=False)  # warm-up; also checks the result
        assert len(cycle.devices) == 1 and len(cycle.devices[0].processes) == args.clients

        scan_t: list[tuple[float, float]] = []
        floor_t: list[tuple[float, float]] = []
        for _ in range(args.rounds):
            floor_t.append(timed(lambda: floor(str(proc))))
            scan_t.append(timed(lambda: backend.sample(slow=False)))

    print(f"rounds: {args.rounds} (median per scan)")
    print(f"{'':8}{'cpu ms':>10}{'wall ms':>10}")
    print(f"{'floor':8}{med(floor_t, 0):10.1f}{med(floor_t, 1):10.1f}")
    print(f"{'scan':8}{med(scan_t, 0):10.1f}{med(scan_t, 1):10.1f}")
    print(f"{'ratio':8}{med(scan_t, 0) / med(floor_t, 0):10.2f}"
          f"{med(scan_t, 1) / med(floor_t, 1):10.2f}")


if __name__ == "__main__":
    main()
