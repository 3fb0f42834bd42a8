"""The /proc scanner and the ``processes`` backend, over real directory trees.

Committed machines (tests/fixtures/<machine>/proc, built by build_proc.py) check
what one collection yields; tmp_path trees check what needs mutation between
scans. Expected values are worked out by hand from the fdinfo text written here
or in build_proc.py (KiB x 1024, ns / 1e9, delta / seconds / capacity).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from exporter.backends.base import BackendFailed, BackendUnavailable
from exporter.backends.fdinfo import FdinfoBackend, error_reason, parse_rss, process_label
from exporter.config import Config
from exporter.model import DeviceSample, ProcessSample

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
    parent, child = proc(tmp_path, 300, b"parent"), proc(tmp_path, 42, b"child")
    for d in (parent, child):
        drm_fd(d, 7, amd(cid=77, gfx_ns=5_000_000_000, vram_kib=2048))
    dev = only_device(backend(tmp_path).sample(slow=False).devices)
    assert [p.pid for p in dev.processes] == [42]
    assert dev.processes[0].memory_used_bytes == 2048 * 1024
    assert dev.engine_busy_seconds["gfx"] == 5.0


def test_vanishing_unreadable_garbled_and_huge_are_counted(tmp_path: Path) -> None:
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
    pci = tmp_path / "sys" / "devices" / "pci0000:00" / "0000:00:02.0"
    node = pci / "drm" / "renderD128"
    node.mkdir(parents=True)
    os.symlink("../..", node / "device")
    (tmp_path / "sys" / "class" / "drm").mkdir(parents=True)
    os.symlink("../../devices/pci0000:00/0000:00:02.0/drm/renderD128",
               tmp_path / "sys" / "class" / "drm" / "renderD128")
    d = proc(tmp_path, 10)
    drm_fd(d, 3, "drm-driver:\ti915\ndrm-client-id:\t9\ndrm-engine-render:\t5 ns\n")
    drm_fd(d, 4, "drm-driver:\ti915\ndrm-client-id:\t10\n", node="/dev/dri/renderD200")
    cycle = backend(tmp_path).sample(slow=False)
    assert only_device(cycle.devices).info.pci_bus_id == "0000:00:02.0"
    assert dict(cycle.errors) == {"unresolved_device": 1}


def test_other_drivers_are_skipped_without_errors(tmp_path: Path) -> None:
    drm_fd(proc(tmp_path, 10), 3, "drm-driver:\tv3d\ndrm-client-id:\t44\n"
           "drm-engine-render:\t7 ns\n", node="/dev/dri/card0")
    drm_fd(proc(tmp_path, 11), 3, "drm-driver:\tamdxdna_accel_driver\ndrm-client-id:\t1\n"
           "drm-pdev:\t0000:c5:00.1\n", node="/dev/accel/accel0")
    cycle = backend(tmp_path).sample(slow=False)
    assert list(cycle.devices) == [] and dict(cycle.errors) == {}


def test_budget_stops_keeps_and_resumes(tmp_path: Path) -> None:
    for pid in (10, 20):
        drm_fd(proc(tmp_path, pid, comm=f"p{pid}".encode()), 3, amd(cid=pid, gfx_ns=pid))
    b = backend(tmp_path, Clock(tick=1.0), budget=0.5)  # every clock read costs 1 s
    first = b.sample(slow=False)
    assert [p.pid for p in only_device(first.devices).processes] == [10]
    assert dict(first.errors) == {"budget": 1}
    second = b.sample(slow=False)  # resumes at 20; 10 keeps its last values
    assert [p.pid for p in only_device(second.devices).processes] == [10, 20]
    assert dict(second.errors) == {"budget": 1}


def test_host_memory_falls_back_to_status(tmp_path: Path) -> None:
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


def test_process_label_is_safe() -> None:
    assert process_label(b"a\tb\x07c\xff\n") == "abc\ufffd"
    assert process_label(b"kworker/0:1\n") == "kworker/0:1"


def test_unreadable_procfs(tmp_path: Path) -> None:
    config = Config(procfs=str(tmp_path / "nope"), sysfs=str(tmp_path))
    with pytest.raises(BackendUnavailable):
        FdinfoBackend(config).open()
    (tmp_path / "proc").mkdir()
    b = backend(tmp_path)
    assert list(b.sample(slow=False).devices) == []  # no clients is fine
    (tmp_path / "proc").rmdir()
    with pytest.raises(BackendFailed):
        b.sample(slow=False)


def test_tier_and_name(tmp_path: Path) -> None:
    config = Config(procfs=str(tmp_path), processes_interval=7.0)
    b = FdinfoBackend(config)
    assert (b.name, b.interval) == ("processes", 7.0)
