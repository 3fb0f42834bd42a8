"""The /proc scanner and the ``fdinfo`` backend, over real directory trees.

Committed machines (tests/fixtures/<machine>/proc, built by build_proc.py) check
what one collection yields; tmp_path trees check what needs mutation between
scans. Expected values are worked out by hand from the fdinfo text written here
or in build_proc.py (KiB x 1024, ns / 1e9, delta / seconds / capacity).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.labels import ErrorReason
from exporter.core.model import DeviceSample, ProcessSample
from exporter.core.units import parse_rss, process_name
from exporter.sources.base import BackendFailed, BackendUnavailable
from exporter.sources.discovery import HOTPLUG_POLL
from exporter.sources.fdinfo.backend import FdinfoBackend
from exporter.sources.fdinfo.scan import ScanResult, error_reason
from tests.drm_tree import add_pci_card, remove_card

FIXTURES = Path(__file__).parent / "fixtures"
PAGE = os.sysconf("SC_PAGE_SIZE")


class Clock:
    """A monotonic clock the test moves; ``tick`` is added on every read."""

    def __init__(self, now: float = 1000.0, tick: float = 0.0) -> None:
        self.now, self.tick = now, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def backend(root: Path, clock: Clock | None = None, budget: float = 10.0) -> FdinfoBackend:
    config = Config(procfs=str(root / "proc"), sysfs=str(root / "sys"), processes_budget=budget)
    b = FdinfoBackend(config, clock=clock or Clock())
    b.open()
    return b


def gpu(root: Path, bus: str = "0000:03:00.0", driver: str = "amdgpu") -> str:
    """Bind a PCI GPU in ``root/sys`` (its clients count only then); returns its card."""
    drm = root / "sys" / "class" / "drm"
    n = len([c for c in drm.iterdir() if c.name.startswith("card")]) if drm.is_dir() else 0
    add_pci_card(root / "sys", bus, f"card{n}", driver=driver, render=f"renderD{128 + n}")
    return f"card{n}"


def only_device(devices: object) -> DeviceSample:
    assert isinstance(devices, list) and len(devices) == 1
    d = devices[0]
    assert isinstance(d, DeviceSample)
    return d


def by_pid(d: DeviceSample) -> dict[int, ProcessSample]:
    return {p.pid: p for p in d.processes}


# --- committed machines -------------------------------------------------------------


def test_rx7800xt_machine() -> None:
    cycle = backend(FIXTURES / "amd-rdna3-rx7800xt").sample(slow=False)
    d = only_device(cycle.devices)
    assert (d.info.vendor, d.info.pci_bus_id, d.info.uuid, d.info.driver) == (
        "amd", "0000:03:00.0", "pci-0000:03:00.0", "amdgpu")
    assert (d.source, d.primary) == ("fdinfo", False)
    procs = by_pid(d)
    # 1 has no DRM fd; 4021's fdinfo cannot be read; 3310 and its child share client 57.
    assert sorted(procs) == [1874, 3310, 3342, 5120]
    assert dict(cycle.errors) == {"unreadable": 1}

    shell = procs[1874]  # two clients: card1 (12) and renderD128 (13)
    assert shell.process == "gnome-shell"
    assert shell.memory_used_bytes == (16384 + 412672) * 1024
    assert shell.shared_memory_used_bytes == (2048 + 65536 + 1024) * 1024
    assert dict(shell.engine_busy_seconds) == {"gfx": 73.912004512, "dma": 0.02045133}
    assert shell.host_memory_bytes == 97280 * PAGE  # statm resident pages
    assert dict(shell.utilization_ratio) == {}  # one scan: no delta yet

    assert procs[3310].memory_used_bytes == 6291456 * 1024
    child = procs[3342]  # only its own client 58
    assert child.memory_used_bytes == 262144 * 1024
    assert dict(child.engine_busy_seconds) == {"compute": 4.567890123}

    odd = procs[5120]
    assert odd.process == "vk\ufffdcube"  # invalid UTF-8 replaced, ESC dropped
    assert dict(odd.engine_busy_seconds) == {"gfx": 1.5, "decoder": 2.5, "encoder": 0.12}

    # Device-wide sums count client 57 once.
    assert d.engine_busy_seconds["gfx"] == pytest.approx(
        (73912004512 + 512345678901 + 1500000000) / 1e9)
    assert d.engine_busy_seconds["compute"] == pytest.approx((88123456789 + 4567890123) / 1e9)
    assert dict(d.engine_utilization_ratio) == {}


def test_phoenix_apu_duplicate_keys_and_passed_fd() -> None:
    d = only_device(backend(FIXTURES / "amd-apu-phoenix").sample(slow=False).devices)
    assert d.info.pci_bus_id == "0000:64:00.0"
    procs = by_pid(d)
    assert sorted(procs) == [2231, 2400]  # mpv (2405) holds Xwayland's client 428
    assert procs[2400].memory_used_bytes == 186708 * 1024  # carve-out VRAM
    assert procs[2400].shared_memory_used_bytes == 17828 * 1024
    assert dict(procs[2231].engine_busy_seconds) == {"gfx": 48.871200411, "decoder": 3.3021002}


def test_b580_xe_dup_fd_counted_once() -> None:
    cycle = backend(FIXTURES / "intel-xe-b580").sample(slow=False)
    d = only_device(cycle.devices)
    assert (d.info.vendor, d.info.pci_bus_id, d.info.driver) == ("intel", "0000:09:00.0", "xe")
    procs = by_pid(d)
    assert sorted(procs) == [2710, 2950]
    game = procs[2950]
    assert game.process == "GameThread"
    assert game.memory_used_bytes == 7340032 * 1024  # fds 44 and 45: one client
    assert game.shared_memory_used_bytes == (262144 + 4096) * 1024
    assert dict(game.engine_busy_seconds) == {}  # xe gives cycles, not time
    assert dict(cycle.errors) == {"unreadable": 1}


def test_cometlake_igpu_has_no_device_local_memory() -> None:
    d = only_device(backend(FIXTURES / "intel-i915-cometlake").sample(slow=False).devices)
    procs = by_pid(d)
    assert sorted(procs) == [1650, 2890]  # 2911 shares firefox's client 35
    shell = procs[1650]
    assert shell.memory_used_bytes is None
    assert shell.shared_memory_used_bytes == (40960 + 181248) * 1024
    assert dict(shell.engine_busy_seconds) == {
        "render": 24.811302931, "copy": 0.010223041, "video": 0.0, "video_enhance": 0.0}


# --- tmp_path trees -------------------------------------------------------------------


def proc(root: Path, pid: int, comm: bytes = b"app", rss_pages: int | None = 100,
         vmrss_kib: int | None = None) -> Path:
    d = root / "proc" / str(pid)
    (d / "fd").mkdir(parents=True, exist_ok=True)
    (d / "fdinfo").mkdir(exist_ok=True)
    (d / "comm").write_bytes(comm + b"\n")
    if rss_pages is not None:
        (d / "statm").write_text(f"900 {rss_pages} 10 5 0 300 0\n")
    if vmrss_kib is not None:
        (d / "status").write_text(f"Name:\tapp\nVmRSS:\t{vmrss_kib:>8} kB\n")
    return d


def drm_fd(d: Path, fd: int, text: str | bytes | None, node: str = "/dev/dri/renderD128") -> None:
    link = d / "fd" / str(fd)
    if link.is_symlink():
        link.unlink()
    os.symlink(node, link)
    info = d / "fdinfo" / str(fd)
    if isinstance(text, bytes):
        info.write_bytes(text)
    elif text is not None:
        info.write_text(text)


def amd(cid: int, gfx_ns: int, vram_kib: int = 1024, pdev: str = "0000:03:00.0") -> str:
    return (f"drm-driver:\tamdgpu\ndrm-pdev:\t{pdev}\ndrm-client-id:\t{cid}\n"
            f"drm-engine-gfx:\t{gfx_ns} ns\ndrm-memory-vram:\t{vram_kib} KiB\n"
            "drm-memory-gtt: \t16 KiB\n")


def test_two_scans_give_ratios_with_capacity(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path, "0000:00:02.0", "i915")
    d = proc(tmp_path, 10)
    text = ("drm-driver:\ti915\ndrm-pdev:\t0000:00:02.0\ndrm-client-id:\t4\n"
            "drm-engine-render:\t{r} ns\ndrm-engine-video:\t{v} ns\n"
            "drm-engine-capacity-video:\t2\n")
    drm_fd(d, 3, text.format(r=10_000_000_000, v=0))
    b = backend(tmp_path, clock)
    first = only_device(b.sample(slow=False).devices)
    assert dict(first.processes[0].utilization_ratio) == {}

    clock.now += 2.0
    drm_fd(d, 3, text.format(r=10_500_000_000, v=2_000_000_000))
    second = only_device(b.sample(slow=False).devices)
    p = second.processes[0]
    # render: 0.5 s busy in 2 s; video: 2 s busy in 2 s over 2 engines
    assert dict(p.utilization_ratio) == {"render": 0.25, "video": 0.5}
    assert dict(second.engine_utilization_ratio) == {"render": 0.25, "video": 0.5}
    assert dict(p.engine_busy_seconds) == {"render": 10.5, "video": 2.0}
    assert dict(second.engine_busy_seconds) == {"render": 10.5, "video": 2.0}


def test_xe_cycles_ratio(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path, "0000:03:00.0", "xe")
    d = proc(tmp_path, 10)
    text = ("drm-driver:\txe\ndrm-client-id:\t3\ndrm-pdev:\t0000:03:00.0\n"
            "drm-cycles-rcs:\t{rcs}\ndrm-total-cycles-rcs:\t{t}\n"
            "drm-cycles-ccs:\t{ccs}\ndrm-total-cycles-ccs:\t{t}\ndrm-engine-capacity-ccs:\t4\n")
    drm_fd(d, 5, text.format(rcs=1000, ccs=0, t=10000))
    b = backend(tmp_path, clock)
    b.sample(slow=False)
    clock.now += 1.0
    drm_fd(d, 5, text.format(rcs=3000, ccs=8000, t=14000))
    dev = only_device(b.sample(slow=False).devices)
    # rcs: 2000 of 4000 GPU cycles; ccs: 8000 over 4000 cycles x 4 engines
    assert dict(dev.processes[0].utilization_ratio) == {"render": 0.5, "compute": 0.5}
    assert dict(dev.engine_busy_seconds) == {}


def test_restarted_client_gives_no_spike(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10)
    drm_fd(d, 3, amd(cid=5, gfx_ns=9_000_000_000))
    b = backend(tmp_path, clock)
    b.sample(slow=False)

    clock.now += 1.0  # the app restarted its device: new client id, counter from ~0
    drm_fd(d, 3, amd(cid=6, gfx_ns=100_000_000))
    dev = only_device(b.sample(slow=False).devices)
    assert dict(dev.processes[0].utilization_ratio) == {}
    assert dev.engine_busy_seconds["gfx"] == pytest.approx(9.1)  # device counter monotonic
    # No client had a gfx delta yet, before or now: unknown, not 0.
    assert dict(dev.engine_utilization_ratio) == {}

    clock.now += 1.0
    drm_fd(d, 3, amd(cid=6, gfx_ns=300_000_000))
    dev = only_device(b.sample(slow=False).devices)
    assert dict(dev.processes[0].utilization_ratio) == {"gfx": pytest.approx(0.2)}
    assert dev.engine_busy_seconds["gfx"] == pytest.approx(9.3)


def test_counter_going_backwards_holds_the_larger_value(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10)
    drm_fd(d, 3, amd(cid=5, gfx_ns=10_000_000_000))
    b = backend(tmp_path, clock)
    b.sample(slow=False)
    clock.now += 1.0
    drm_fd(d, 3, amd(cid=5, gfx_ns=9_000_000_000))
    p = only_device(b.sample(slow=False).devices).processes[0]
    assert dict(p.utilization_ratio) == {}
    assert dict(p.engine_busy_seconds) == {"gfx": 10.0}
    clock.now += 1.0
    drm_fd(d, 3, amd(cid=5, gfx_ns=10_500_000_000))
    p = only_device(b.sample(slow=False).devices).processes[0]
    assert dict(p.utilization_ratio) == {"gfx": 0.25}  # 0.5 s over the 2 s since 10.0


def test_ratio_is_clamped_and_idle_engine_reads_zero(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10)
    drm_fd(d, 3, amd(cid=5, gfx_ns=0))
    b = backend(tmp_path, clock)
    b.sample(slow=False)
    clock.now += 1.0
    drm_fd(d, 3, amd(cid=5, gfx_ns=3_000_000_000))  # 3 s in 1 s: clock skew, not 300 %
    dev = only_device(b.sample(slow=False).devices)
    assert dict(dev.processes[0].utilization_ratio) == {"gfx": 1.0}
    shutil.rmtree(d)  # the process exits: its engine is idle, the counter stays
    clock.now += 1.0
    dev = only_device(b.sample(slow=False).devices)
    assert dev.processes == ()
    assert dict(dev.engine_utilization_ratio) == {"gfx": 0.0}
    assert dev.engine_busy_seconds["gfx"] == 3.0


def test_shared_client_belongs_to_lowest_pid(tmp_path: Path) -> None:
    gpu(tmp_path)
    parent, child = proc(tmp_path, 300, b"parent"), proc(tmp_path, 42, b"child")
    for d in (parent, child):
        drm_fd(d, 7, amd(cid=77, gfx_ns=5_000_000_000, vram_kib=2048))
    dev = only_device(backend(tmp_path).sample(slow=False).devices)
    assert [p.pid for p in dev.processes] == [42]
    assert dev.processes[0].memory_used_bytes == 2048 * 1024
    assert dev.engine_busy_seconds["gfx"] == 5.0


def test_vanishing_unreadable_garbled_and_huge_are_counted(tmp_path: Path) -> None:
    gpu(tmp_path)
    good = proc(tmp_path, 10)
    drm_fd(good, 3, amd(cid=1, gfx_ns=1))
    drm_fd(proc(tmp_path, 11), 4, None)  # fd closed mid-scan: fdinfo already gone
    (tmp_path / "proc" / "12").mkdir()  # exited after /proc was listed: no fd dir
    unreadable = proc(tmp_path, 13)
    drm_fd(unreadable, 4, None)
    (unreadable / "fdinfo" / "4").mkdir()
    drm_fd(proc(tmp_path, 14), 4, b"drm-\xff\xfe:\x00\ndrm-client-id:\tx\n\x00\x01")  # garbled
    drm_fd(proc(tmp_path, 15), 4, amd(cid=2, gfx_ns=1) + "drm-engine-x:\t1 ns\n" * 8000)
    drm_fd(proc(tmp_path, 16), 4, "pos:\t0\nflags:\t02\n", node="/dev/dri/card0")  # no stats
    os.symlink("/dev/dri/renderD128", tmp_path / "proc" / "17")  # not a pid dir at all
    gone = proc(tmp_path, 18)
    drm_fd(gone, 4, amd(cid=3, gfx_ns=1))
    (gone / "comm").unlink()  # exited between the fd walk and reading comm

    cycle = backend(tmp_path).sample(slow=False)
    assert [p.pid for p in only_device(cycle.devices).processes] == [10]
    assert dict(cycle.errors) == {"vanished": 4, "unreadable": 1, "parse": 1, "too_large": 1}


def test_node_without_pdev_resolves_through_sysfs(tmp_path: Path) -> None:
    gpu(tmp_path, "0000:00:02.0", "i915")  # card0 and renderD128
    d = proc(tmp_path, 10)
    drm_fd(d, 3, "drm-driver:\ti915\ndrm-client-id:\t9\ndrm-engine-render:\t5 ns\n")
    drm_fd(d, 4, "drm-driver:\ti915\ndrm-client-id:\t10\n", node="/dev/dri/renderD200")
    drm_fd(d, 5, "drm-driver:\ti915\ndrm-client-id:\t11\n", node="/dev/dri/card0")
    cycle = backend(tmp_path).sample(slow=False)
    dev = only_device(cycle.devices)
    assert dev.info.pci_bus_id == "0000:00:02.0"
    assert dev.engine_busy_seconds == {"render": 5e-9}
    assert dict(cycle.errors) == {"unknown_device": 1}  # node renderD200: no card here


def test_other_drivers_are_skipped_without_errors(tmp_path: Path) -> None:
    gpu(tmp_path)
    drm_fd(proc(tmp_path, 10), 3, "drm-driver:\tv3d\ndrm-client-id:\t44\n"
           "drm-engine-render:\t7 ns\n", node="/dev/dri/card0")
    drm_fd(proc(tmp_path, 11), 3, "drm-driver:\tamdxdna_accel_driver\ndrm-client-id:\t1\n"
           "drm-pdev:\t0000:c5:00.1\n", node="/dev/accel/accel0")
    cycle = backend(tmp_path).sample(slow=False)
    assert list(cycle.devices) == [] and dict(cycle.errors) == {}


def test_budget_stops_keeps_and_resumes(tmp_path: Path) -> None:
    gpu(tmp_path)
    for pid in (10, 20):
        drm_fd(proc(tmp_path, pid, comm=f"p{pid}".encode()), 3, amd(cid=pid, gfx_ns=pid))
    b = backend(tmp_path, Clock(tick=1.0), budget=0.5)  # every clock read costs 1 s
    first = b.sample(slow=False)
    assert [p.pid for p in only_device(first.devices).processes] == [10]
    assert dict(first.errors) == {"budget": 1}
    second = b.sample(slow=False)  # resumes at 20; 10 keeps its last values
    assert [p.pid for p in only_device(second.devices).processes] == [10, 20]
    assert dict(second.errors) == {"budget": 1}


def test_budget_is_checked_inside_one_process_fd_walk(tmp_path: Path) -> None:
    """One process with many DRM fds used to be walked whole, past the budget and
    uncounted (20k fds: 0.98 s against 0.5 s). Now the walk stops, counts ``budget``, and
    the next scans go on from the fd where it stopped until every client was read."""
    gpu(tmp_path)
    d = proc(tmp_path, 10)
    fds = 1000
    for fd in range(3, 3 + fds):
        drm_fd(d, fd, amd(cid=fd, gfx_ns=fd, vram_kib=1024))
    b = backend(tmp_path, Clock(tick=0.001), budget=0.1)  # every clock read costs 1 ms
    first = b.sample(slow=False)
    assert dict(first.errors) == {"budget": 1}
    (p,) = only_device(first.devices).processes
    assert p.pid == 10 and p.memory_used_bytes is not None
    read = p.memory_used_bytes / (1024 * 1024)  # 1024 KiB of VRAM per client
    assert 64 <= read < 300
    totals, busy = [read], [p.engine_busy_seconds["gfx"]]
    for _ in range(20):
        cycle = b.sample(slow=False)
        (p,) = only_device(cycle.devices).processes
        assert p.memory_used_bytes is not None
        totals.append(p.memory_used_bytes / (1024 * 1024))
        busy.append(p.engine_busy_seconds["gfx"])
        if totals[-1] == fds:
            break
    assert totals == sorted(totals) and totals[-1] == fds  # resumed, never lost a client
    # each client counted once: the busy counter never goes back and ends at the sum
    assert busy == sorted(busy) and busy[-1] == pytest.approx(sum(range(3, 3 + fds)) / 1e9)


def test_host_memory_falls_back_to_status(tmp_path: Path) -> None:
    gpu(tmp_path)
    d = proc(tmp_path, 10, rss_pages=None, vmrss_kib=2048)
    drm_fd(d, 3, amd(cid=1, gfx_ns=1))
    p = only_device(backend(tmp_path).sample(slow=False).devices).processes[0]
    assert p.host_memory_bytes == 2048 * 1024
    assert parse_rss(None, None) is None
    assert parse_rss(b"garbage", b"VmRSS: lots") is None


def test_error_reasons() -> None:
    # EACCES is what another user's /proc/<pid>/fd gives without CAP_SYS_PTRACE;
    # tests run as root, so the errno is checked directly.
    assert error_reason(PermissionError(errno.EACCES, "denied")) == "permission"
    assert error_reason(OSError(errno.ESRCH, "no such process")) == "vanished"
    assert error_reason(FileNotFoundError(errno.ENOENT, "gone")) == "vanished"
    assert error_reason(IsADirectoryError(errno.EISDIR, "dir")) == "unreadable"


def test_unreadable_procfs(tmp_path: Path) -> None:
    config = Config(procfs=str(tmp_path / "nope"), sysfs=str(tmp_path))
    with pytest.raises(BackendUnavailable):
        FdinfoBackend(config).open()
    (tmp_path / "proc").mkdir()
    gpu(tmp_path)
    b = backend(tmp_path)
    assert list(b.sample(slow=False).devices) == []  # no clients is fine
    (tmp_path / "proc").rmdir()
    with pytest.raises(BackendFailed):
        b.sample(slow=False)


def test_tier_and_name(tmp_path: Path) -> None:
    config = Config(procfs=str(tmp_path), processes_interval=7.0)
    b = FdinfoBackend(config)
    assert (b.name, b.interval) == ("fdinfo", 7.0)


# --- regressions from the hardening campaign (issue 8) and the cost issue (13) ----------


def test_process_counter_survives_a_closed_client(tmp_path: Path) -> None:
    # Item 10: the campaign's process held two clients, 99.5 s + 1.5 s of gfx; closing
    # the first made its counter drop 101.0 -> 1.5 and rate() add 1.5 s of history.
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10)
    drm_fd(d, 3, amd(cid=1, gfx_ns=99_500_000_000))
    drm_fd(d, 4, amd(cid=2, gfx_ns=1_500_000_000))
    b = backend(tmp_path, clock)
    p = only_device(b.sample(slow=False).devices).processes[0]
    assert dict(p.engine_busy_seconds) == {"gfx": 101.0}

    (d / "fd" / "3").unlink()  # the process closes client 1
    clock.now += 1.0
    p = only_device(b.sample(slow=False).devices).processes[0]
    assert dict(p.engine_busy_seconds) == {"gfx": 101.0}
    assert p.memory_used_bytes == 1024 * 1024  # only client 2 holds memory now

    drm_fd(d, 4, amd(cid=2, gfx_ns=2_000_000_000))  # client 2 works 0.5 s more
    clock.now += 1.0
    p = only_device(b.sample(slow=False).devices).processes[0]
    assert dict(p.engine_busy_seconds) == {"gfx": 101.5}

    # A pid that goes away is forgotten: the next process with that pid starts afresh.
    shutil.rmtree(d)
    clock.now += 1.0
    assert only_device(b.sample(slow=False).devices).processes == ()
    drm_fd(proc(tmp_path, 10), 3, amd(cid=3, gfx_ns=1_000_000_000))
    clock.now += 1.0
    p = only_device(b.sample(slow=False).devices).processes[0]
    assert dict(p.engine_busy_seconds) == {"gfx": 1.0}


def test_client_changing_owner_keeps_both_counters_monotonic(tmp_path: Path) -> None:
    # A client shared by parent and child belongs to the lower pid; when that one
    # exits the other pid owns it from then on and counts only what happens after.
    clock = Clock()
    gpu(tmp_path)
    parent, child = proc(tmp_path, 42, b"parent"), proc(tmp_path, 300, b"child")
    for d in (parent, child):
        drm_fd(d, 7, amd(cid=77, gfx_ns=5_000_000_000))
    b = backend(tmp_path, clock)
    assert [(p.pid, dict(p.engine_busy_seconds)) for p in
            only_device(b.sample(slow=False).devices).processes] == [(42, {"gfx": 5.0})]
    shutil.rmtree(parent)
    drm_fd(child, 7, amd(cid=77, gfx_ns=6_000_000_000))
    clock.now += 1.0
    dev = only_device(b.sample(slow=False).devices)
    assert [(p.pid, dict(p.engine_busy_seconds)) for p in dev.processes] == [(300, {"gfx": 1.0})]
    assert dev.engine_busy_seconds == {"gfx": 6.0}


def started(d: Path, start: int, comm: str = "worker") -> None:
    """Write ``stat`` with ``start`` as field 22 (clock ticks after boot)."""
    (d / "stat").write_text(f"{d.name} ({comm}) S {' '.join(['0'] * 18)} {start} 0 0\n")


def test_a_reused_pid_is_a_new_process_for_its_counters(tmp_path: Path) -> None:
    """Identity is (pid, start time): the pid reused between two scans, under the same
    name, used to carry the old process's busy seconds into the new one's series."""
    clock = Clock()
    gpu(tmp_path)
    d = proc(tmp_path, 10, comm=b"worker")
    started(d, 1000)
    drm_fd(d, 3, amd(cid=1, gfx_ns=5_000_000_000))
    b = backend(tmp_path, clock)
    seen: list[tuple[int, float]] = []  # (start time, gfx busy seconds) per scan

    def scan(start: int) -> None:
        clock.now += 1.0
        (p,) = only_device(b.sample(slow=False).devices).processes
        assert (p.pid, p.process) == (10, "worker")
        seen.append((start, p.engine_busy_seconds["gfx"]))

    scan(1000)
    drm_fd(d, 3, amd(cid=1, gfx_ns=6_000_000_000))
    scan(1000)
    # The process exits and a new "worker" gets pid 10 before the next scan.
    started(d, 2000)
    drm_fd(d, 3, amd(cid=2, gfx_ns=2_000_000_000))
    scan(2000)
    drm_fd(d, 3, amd(cid=2, gfx_ns=2_500_000_000))
    scan(2000)
    assert seen == [(1000, 5.0), (1000, 6.0), (2000, 2.0), (2000, 2.5)]
    for identity in (1000, 2000):  # never back for one identity
        values = [v for start, v in seen if start == identity]
        assert values == sorted(values)
    # the device's counter is the GPU's, whatever process did the work: it goes on
    assert only_device(b.sample(slow=False).devices).engine_busy_seconds == {"gfx": 8.5}


def test_huge_engine_counter_is_dropped_not_fatal(tmp_path: Path) -> None:
    # Item 11: one 400-digit engine counter raised OverflowError in every later scan,
    # so no GPU had per-process data until restart. The line is dropped and counted.
    clock = Clock()
    gpu(tmp_path)
    gpu(tmp_path, "0000:00:02.0", "i915")
    bad = proc(tmp_path, 10, b"bad")
    drm_fd(bad, 3, amd(cid=1, gfx_ns=int("9" * 400), vram_kib=2048))
    good = proc(tmp_path, 11, b"good")
    intel = ("drm-driver:\ti915\ndrm-pdev:\t0000:00:02.0\ndrm-client-id:\t4\n"
             "drm-engine-render:\t{} ns\n")
    drm_fd(good, 3, intel.format(1_000_000_000))
    b = backend(tmp_path, clock)
    for render in (1_000_000_000, 1_500_000_000):
        drm_fd(good, 3, intel.format(render))
        cycle = b.sample(slow=False)
        devices = {d.info.pci_bus_id: d for d in cycle.devices}
        assert sorted(devices) == ["0000:00:02.0", "0000:03:00.0"]
        amd_proc = devices["0000:03:00.0"].processes[0]
        assert (amd_proc.pid, dict(amd_proc.engine_busy_seconds)) == (10, {})
        assert amd_proc.memory_used_bytes == 2048 * 1024  # the client's good lines count
        assert devices["0000:00:02.0"].engine_busy_seconds == {"render": render / 1e9}
        assert dict(cycle.errors) == {"parse": 1}
        clock.now += 1.0

    # The largest u64 parses, but is 584 years of busy time since boot: not believed.
    drm_fd(bad, 3, amd(cid=1, gfx_ns=2**64 - 1))
    cycle = b.sample(slow=False)
    p = {d.info.pci_bus_id: d for d in cycle.devices}["0000:03:00.0"].processes[0]
    assert p.engine_busy_seconds == {}
    assert dict(cycle.errors) == {"implausible": 1}


def test_unknown_or_garbage_pdev_is_counted_not_a_gpu(tmp_path: Path) -> None:
    # Item 12: a drm-pdev that is no card here made a GPU of its own that never went away.
    gpu(tmp_path)
    gpu(tmp_path, "0000:05:00.0", "nvidia")  # a real card, but not the client's driver
    drm_fd(proc(tmp_path, 10), 3, amd(cid=1, gfx_ns=1))
    drm_fd(proc(tmp_path, 11), 3, amd(cid=2, gfx_ns=1, pdev="0000:99:00.0"))
    drm_fd(proc(tmp_path, 12), 3, amd(cid=3, gfx_ns=1, pdev="<script>"))
    drm_fd(proc(tmp_path, 13), 3, amd(cid=4, gfx_ns=1, pdev="0000:05:00.0"))
    cycle = backend(tmp_path).sample(slow=False)
    dev = only_device(cycle.devices)
    assert dev.info.pci_bus_id == "0000:03:00.0"
    assert [p.pid for p in dev.processes] == [10]
    assert dict(cycle.errors) == {"unknown_device": 3}


def test_a_gpu_that_went_away_is_no_longer_reported(tmp_path: Path) -> None:
    clock = Clock()
    gpu(tmp_path)
    second = gpu(tmp_path, "0000:0c:00.0")
    drm_fd(proc(tmp_path, 10), 3, amd(cid=1, gfx_ns=1))
    d = proc(tmp_path, 11)
    drm_fd(d, 3, amd(cid=2, gfx_ns=1, pdev="0000:0c:00.0"))
    b = backend(tmp_path, clock)
    assert [x.info.pci_bus_id for x in b.sample(slow=False).devices] == [
        "0000:03:00.0", "0000:0c:00.0"]
    remove_card(tmp_path / "sys", second)  # unplugged: its client's fd now errors
    clock.now += 1.0
    assert [x.info.pci_bus_id for x in b.sample(slow=False).devices] == ["0000:03:00.0"]


def test_process_name_is_the_shared_reader(tmp_path: Path) -> None:
    # Item 13: NVML's and fdinfo's processes are named by one function.
    gpu(tmp_path)
    comm = b"\x1b[31m" + b"n" * 80 + b"\xff"
    drm_fd(proc(tmp_path, 10, comm), 3, amd(cid=1, gfx_ns=1))
    p = only_device(backend(tmp_path).sample(slow=False).devices).processes[0]
    assert p.process == process_name(comm + b"\n")
    assert p.process == "[31m" + "n" * 60  # control characters dropped, 64 at most


def test_vanished_fd_is_counted_once_per_process(tmp_path: Path) -> None:
    # A live process whose DRM fd closes between listing and reading, scan after scan
    # (a client opened and closed in a loop): one count while the process lives.
    gpu(tmp_path)
    drm_fd(proc(tmp_path, 10), 3, amd(cid=1, gfx_ns=1))
    churn = proc(tmp_path, 11)
    drm_fd(churn, 4, None)  # fdinfo/4 already gone
    drm_fd(churn, 5, None)
    b = backend(tmp_path)
    assert [dict(b.sample(slow=False).errors) for _ in range(3)] == [{"vanished": 1}, {}, {}]
    shutil.rmtree(churn)  # exits; pid 11 is reused by a process with the same trouble
    assert dict(b.sample(slow=False).errors) == {}
    drm_fd(proc(tmp_path, 11), 4, None)
    assert dict(b.sample(slow=False).errors) == {"vanished": 1}


def unprivileged_errors(b: FdinfoBackend, scans: int) -> list[dict[str, int]]:
    """Scan as a user that may not read root's private dirs (as the exporter runs).

    Every scan must still report pid 10, the one readable client."""
    def run() -> list[dict[str, int]]:
        cycles = [b.sample(slow=False) for _ in range(scans)]
        assert all([p.pid for p in only_device(c.devices).processes] == [10] for c in cycles)
        return [dict(c.errors) for c in cycles]

    if os.geteuid() != 0:
        return run()
    os.seteuid(65534)  # nobody; root may switch back since its saved uid stays 0
    try:
        return run()
    finally:
        os.seteuid(0)


def private_proc(root: Path, pid: int, *fdinfo: str) -> None:
    """A process of another user: its fd dir (or only some fdinfo files) unreadable."""
    d = proc(root, pid)
    for fd in (3, 4):
        drm_fd(d, fd, amd(cid=pid * 10 + fd, gfx_ns=1))
    for name in fdinfo:
        (d / "fdinfo" / name).chmod(0o000)
    if not fdinfo:
        (d / "fd").chmod(0o000)


def test_permission_errors_count_processes_not_attempts() -> None:
    # Item 14: other users' processes without CAP_SYS_PTRACE were counted on every scan
    # (15,405 in three minutes); now each unreadable process counts once while it lives.
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="fdinfo-perm-"))  # tmp_path is private to root
    try:
        root.chmod(0o755)
        gpu(root)
        drm_fd(proc(root, 10), 3, amd(cid=1, gfx_ns=1))
        for pid in (20, 21, 22):
            private_proc(root, pid)
        private_proc(root, 23, "3", "4")  # fd dir readable, both DRM fdinfo files not
        config = Config(procfs=str(root / "proc"), sysfs=str(root / "sys"))
        b = FdinfoBackend(config, clock=Clock())
        b.open()
        from structlog.testing import capture_logs

        with capture_logs() as logs:
            assert unprivileged_errors(b, 3) == [{"permission": 4}, {}, {}]
        # One line for the run, naming the first process refused and who we run as.
        (line,) = [e for e in logs if e["event"].startswith("process fdinfo unreadable")]
        assert (line["pid"], line["euid"]) == (20, os.geteuid() or 65534)
        assert line["process"] == (root / "proc" / "20" / "comm").read_text().strip()
        assert "CAP_SYS_PTRACE" in line["hint"]

        shutil.rmtree(root / "proc" / "21")  # exits: forgotten...
        private_proc(root, 30)  # ...while a new one appears
        assert unprivileged_errors(b, 2) == [{"permission": 1}, {}]
        private_proc(root, 21)  # pid 21 reused by another private process
        assert unprivileged_errors(b, 2) == [{"permission": 1}, {}]
    finally:
        for p in root.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(root)


def test_a_refusal_while_running_as_root_says_so(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Root is refused only by a dropped capability or a security module: the one line
    says that, and which process, instead of the non-root advice."""
    from structlog.testing import capture_logs

    from exporter.sources.fdinfo import backend as fdinfo_backend

    gpu(tmp_path)
    proc(tmp_path, 42, comm=b"trainer")
    b = FdinfoBackend(Config(procfs=str(tmp_path / "proc"), sysfs=str(tmp_path / "sys")))
    monkeypatch.setattr(fdinfo_backend.os, "geteuid", lambda: 0)
    b.scanner.count(42, ErrorReason.PERMISSION, Counter())
    with capture_logs() as logs:
        b._log_changes(ScanResult())
        b._log_changes(ScanResult())  # once per run
    assert [(e["pid"], e["process"], e["euid"]) for e in logs] == [(42, "trainer", 0)]
    assert logs[0]["hint"].startswith("running as root")


def test_nvidia_only_host_skips_the_scan(tmp_path: Path) -> None:
    # Issue 13: without a driver that writes DRM usage stats there is nothing to find;
    # the backend is off with the reason, and on again once such a card is bound.
    add_pci_card(tmp_path / "sys", "0000:18:00.0", "card0", driver="nvidia", render="renderD128")
    drm_fd(proc(tmp_path, 10), 3, "pos:\t0\nflags:\t02\n", node="/dev/dri/card0")
    config = Config(procfs=str(tmp_path / "proc"), sysfs=str(tmp_path / "sys"), interval=0.5)
    b = FdinfoBackend(config)
    # the collector's back-off re-checks open() at most this far apart (no udev here)
    assert b.capabilities.retry_interval == HOTPLUG_POLL
    with pytest.raises(BackendUnavailable, match="no amdgpu, i915 or xe"):
        b.open()
    gpu(tmp_path, "0000:03:00.0")  # an AMD card is bound later
    drm_fd(proc(tmp_path, 11), 3, amd(cid=1, gfx_ns=1))
    b.open()
    assert [p.pid for p in only_device(b.sample(slow=False).devices).processes] == [11]
    remove_card(tmp_path / "sys", "card1")  # and goes again
    with pytest.raises(BackendFailed, match="no amdgpu, i915 or xe"):
        b.sample(slow=False)


CORRUPT = ("NaN", "inf", "-inf", "1e400", "9" * 400, str(2**64 - 1), str(2**64), "-5", "",
           "0x" + "f" * 17, "\u0663", "1_000")


def test_campaign_corruptions_never_raise_and_stay_in_range(tmp_path: Path) -> None:
    # Item 11: every number of a real-shaped fdinfo (build_proc.py's amdgpu, xe and
    # i915 texts) replaced by what the campaign wrote. One process per variant; two
    # scans. Nothing raises, and every value served is finite and within its unit.
    import math
    import re

    from tests.fixtures import build_proc as build

    texts = {
        "amdgpu": build.amdgpu("0000:03:00.0", 5, 1024, 64, engines={"gfx": 7, "dec": 9}),
        "xe": build.xe("0000:09:00.0", 6, 1024, 64, 8, {"rcs": 5, "ccs": 3}, 100),
        "i915": build.i915("0000:00:02.0", 7, 512, 256, 0, {"render": 4, "video-enhance": 0}),
    }
    gpu(tmp_path)
    gpu(tmp_path, "0000:09:00.0", "xe")
    gpu(tmp_path, "0000:00:02.0", "i915")
    pid = 100
    for text in texts.values():
        lines = text.splitlines()
        kinds = set()  # one line of each kind: drm-engine-*, drm-total-cycles-*, ...
        for i, line in enumerate(lines):
            key, _, value = line.partition(":")
            kind = key.rsplit("-", 1)[0]
            if not key.startswith(("drm-", "amd-")) or kind in kinds or not re.search(r"\d", value):
                continue
            kinds.add(kind)
            for bad in CORRUPT:
                corrupted = f"{key}:{re.sub(r'[0-9]+', bad, value, count=1)}"
                variant = [*lines[:i], corrupted, *lines[i + 1:]]
                drm_fd(proc(tmp_path, pid), 3, "\n".join(variant) + "\n")
                pid += 1
    assert pid > 100 + 20 * len(CORRUPT)
    clock = Clock()
    b = backend(tmp_path, clock)
    for _ in range(2):
        cycle = b.sample(slow=False)
        clock.now += 1.0
    assert {d.info.pci_bus_id for d in cycle.devices} == {
        "0000:03:00.0", "0000:09:00.0", "0000:00:02.0"}
    assert cycle.errors["parse"] > 0
    for d in cycle.devices:
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in d.engine_utilization_ratio.values())
        assert all(math.isfinite(v) and v >= 0 for v in d.engine_busy_seconds.values())
        for p in d.processes:
            for v in (p.memory_used_bytes, p.shared_memory_used_bytes, p.host_memory_bytes):
                assert v is None or (math.isfinite(v) and 0 <= v <= 2**64)
            assert all(0 <= v <= 1 for v in p.utilization_ratio.values())
            assert all(math.isfinite(v) and v >= 0 for v in p.engine_busy_seconds.values())
