"""AMD sysfs: PCIe throughput from ``pcie_bw`` and the driver version, on fixture machines.

``pcie_bw`` strings are real captures (amdgpu-sysfs-rs rx580 and vega56, prometheus/procfs
Vega 10): "<received> <sent> <max payload size>" per second; expected bytes per second are
worked out here from the files. The driver version is the amdgpu module's where the tree
has ``sys/module/amdgpu/version``, else the kernel release from ``proc/sys/kernel/osrelease``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.core.model import DeviceSample
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.discovery import DrmDiscovery
from exporter.sources.kernel.amdgpu import parse_pcie_bw

FIXTURES = Path(__file__).parent / "fixtures"
RX580 = FIXTURES / "amd-polaris-rx580" / "sys"


def backend(sys_root: Path, proc: Path | None = None) -> AmdBackend:
    config = Config(sysfs=str(sys_root), procfs=str(proc or FIXTURES / "empty-proc"))
    return AmdBackend(config, DrmDiscovery(SysFS(sys_root), hotplug=False))


def cycles(b: AmdBackend, n: int) -> list[tuple[DeviceSample, dict[str, int]]]:
    """``n`` slow cycles, each after the background pcie_bw reads have completed."""
    b.open()
    out = []
    for _ in range(n):
        cycle = b.sample(slow=True)
        (d,) = [d for d in cycle.devices if not d.info.parent_key]
        out.append((d, dict(cycle.errors)))
        assert b._pcie is not None and b._pcie._idle.wait(5.0)
    b.close()
    return out


def pcie_bw_file(sys_root: Path) -> Path:
    return (sys_root / "class" / "drm" / "card0" / "device" / "pcie_bw").resolve()


@pytest.mark.parametrize(("text", "expected"), [
    ("11886 2528 256\n", (11886 * 256, 2528 * 256)),  # rx580 (amdgpu-sysfs-rs)
    ("85 0 256\n", (85 * 256, 0)),  # vega56 (amdgpu-sysfs-rs, LACT)
    ("6641 815 256\n", (6641 * 256, 815 * 256)),  # Vega 10 (prometheus/procfs)
])
def test_pcie_bw_captures_are_received_then_sent_times_the_payload_size(
        text: str, expected: tuple[int, int]) -> None:
    assert parse_pcie_bw(text) == (float(expected[0]), float(expected[1]))


@pytest.mark.parametrize("text", [None, "", "1 2", "1 2 3 4", "1 2 300", "a 2 256",
                                  "-1 2 256", "1 2 0", f"{1 << 64} 0 256"])
def test_pcie_bw_that_is_not_three_sane_numbers_is_dropped(text: str | None) -> None:
    assert parse_pcie_bw(text) is None


def test_rx580_serves_pcie_throughput_from_the_second_slow_cycle() -> None:
    received, sent, mps = (int(w) for w in pcie_bw_file(RX580).read_text().split())
    (first, errors0), (second, errors1) = cycles(backend(RX580), 2)
    assert first.pcie_throughput_bytes_per_second == {}  # the read is still counting
    assert second.pcie_throughput_bytes_per_second == {"rx": received * mps,
                                                       "tx": sent * mps}
    assert second.source_of("pcie_throughput_bytes_per_second", "rx") == "sysfs"
    assert errors0 == errors1 == {}


def test_a_card_without_pcie_bw_has_no_throughput_and_no_reader_thread() -> None:
    b = backend(FIXTURES / "amd-rdna2-rx6900xt" / "sys")
    for d, errors in cycles(b, 2):
        assert d.pcie_throughput_bytes_per_second == {}
        assert errors == {}
    assert b._pcie is None  # closed by cycles(); never started a thread either


def test_a_pcie_bw_that_fails_to_read_is_not_asked_again(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(RX580, root, symlinks=True)
    f = pcie_bw_file(root)
    f.unlink()
    f.mkdir()  # reading a directory fails (EISDIR), as an ASIC without counters does
    b = backend(root)
    b.open()
    for _ in range(3):
        cycle = b.sample(slow=True)
        assert b._pcie is not None and b._pcie._idle.wait(5.0)
        assert cycle.devices[0].pcie_throughput_bytes_per_second == {}
        assert cycle.errors == {}
    assert {Path(d).resolve() for d in b._pcie._failed} == {f.parent}
    assert b._pcie._wanted == ()  # no longer read
    b.close()


def test_garbage_in_pcie_bw_is_counted_as_parse(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(RX580, root, symlinks=True)
    pcie_bw_file(root).write_text("11886 2528\n")
    (_, _), (second, errors) = cycles(backend(root), 2)
    assert second.pcie_throughput_bytes_per_second == {}
    assert errors.get("parse") == 1  # the first read, taken into the second cycle


def test_driver_version_is_the_kernel_release_for_the_in_tree_driver() -> None:
    machine = FIXTURES / "amd-mi300x"
    release = (machine / "proc" / "sys" / "kernel" / "osrelease").read_text().strip()
    b = backend(machine / "sys", machine / "proc")
    (d,) = [i for i in b.open() if not i.parent_key]
    assert d.driver_version == release == "6.12.12"  # what amd-smi reported for this card
    b.close()


def test_driver_version_is_the_module_version_where_the_module_has_one(tmp_path: Path) -> None:
    machine = FIXTURES / "amd-mi300x"
    root = tmp_path / "sys"
    shutil.copytree(machine / "sys", root, symlinks=True)
    (root / "module" / "amdgpu").mkdir(parents=True)
    # The DKMS driver's version as rocm-smi printed it on an MI100 with ROCm 5.7.1.
    (root / "module" / "amdgpu" / "version").write_text("6.2.4\n")
    b = backend(root, machine / "proc")
    (d,) = [i for i in b.open() if not i.parent_key]
    assert d.driver_version == "6.2.4"
    b.close()


def test_no_version_anywhere_leaves_it_empty() -> None:
    b = backend(RX580)  # empty procfs, no module version
    (d,) = b.open()
    assert d.driver_version == ""
    b.close()
