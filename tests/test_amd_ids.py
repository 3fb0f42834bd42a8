"""AMD names from libdrm's amdgpu.ids: the parser, the path rule, the flag, the goldens.

The golden check re-reads the fixture's amdgpu.ids with a plain split (not the
exporter's parser) and the card's ``device`` / ``revision`` files, and compares the
``name`` label of each AMD golden.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from exporter.app.flags import load_config
from exporter.core.config import Config
from exporter.core.fs import SysFS
from exporter.sources.amd.backend import AmdBackend
from exporter.sources.amd.ids import (
    AmdgpuIds,
    lookup_paths,
    parse_amdgpu_ids,
    parse_pci_ids,
)
from exporter.sources.discovery import DrmDiscovery

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
IDS = FIXTURES / "libdrm" / "amdgpu.ids"
PCI_IDS = FIXTURES / "hwdata" / "pci.ids"
AMD = sorted(p.name for p in FIXTURES.iterdir()
             if p.name.startswith("amd-") and (p / "sys").is_dir())


def test_parse_format() -> None:
    table = parse_amdgpu_ids("# comment\n\n1.0.0\n73BF,\tC0,\tAMD Radeon RX 6900 XT\n"
                             "73BF,\tC1,\tAMD Radeon RX 6800 XT\nZZZZ,\t00,\tbad id\n"
                             "67DF,\tE7,\tAMD Radeon RX 580 Series\x07\n")
    assert table == {(0x73BF, 0xC0): "AMD Radeon RX 6900 XT",
                     (0x73BF, 0xC1): "AMD Radeon RX 6800 XT",
                     (0x67DF, 0xE7): "AMD Radeon RX 580 Series"}


def test_exact_revision_only_then_the_synthetic_name(tmp_path: Path) -> None:
    (tmp_path / "ids").write_text("1.0.0\n73BF,\tC0,\tAMD Radeon RX 6900 XT\n")
    ids = AmdgpuIds([tmp_path / "ids"])
    assert ids.name("0x73bf", "0xc0") == "AMD Radeon RX 6900 XT"
    assert ids.name("0x73bf", "0xc3") == "AMD 0x73bf"  # another product: not a guess
    assert ids.name("0x73bf", None) == "AMD 0x73bf"
    assert ids.name("garbage", "0xc0") == "" and ids.name(None, None) == ""
    assert AmdgpuIds([tmp_path / "missing"]).name("0x73bf", "0xc0") == "AMD 0x73bf"


def test_pci_ids_parse() -> None:
    assert parse_pci_ids(PCI_IDS.read_text()) == {
        0x747E: "Navi 32 [Radeon RX 7700 XT / 7800 XT]"}  # not 8086's 7550, no subsystem


def test_fallback_order_and_one_warning(tmp_path: Path) -> None:
    first, second = tmp_path / "first.ids", tmp_path / "second.ids"
    first.write_text("1.0.0\n747E,\tC8,\tFrom The First\n")
    second.write_text("1.0.0\n747E,\tC8,\tFrom The Second\n747E,\tFF,\tOnly Second\n")
    with capture_logs() as logged:
        ids = AmdgpuIds([first, second], [tmp_path / "no-pci.ids", PCI_IDS])
        assert ids.name("0x747e", "0xc8") == "From The First"
        assert ids.name("0x747e", "0xff") == "Only Second"
        assert ids.name("0x747e", "0x01") == "AMD Navi 32 [Radeon RX 7700 XT / 7800 XT]"
        assert ids.name("0x7550", "0xc0") == "AMD 0x7550"  # 8086's 7550 is not AMD's
    assert logged == []

    with capture_logs() as logged:
        none = AmdgpuIds([tmp_path / "a", tmp_path / "b"], [PCI_IDS])
        for _ in range(3):
            assert none.name("0x747e", "0xc8") == "AMD Navi 32 [Radeon RX 7700 XT / 7800 XT]"
    assert [e["log_level"] for e in logged] == ["warning"]
    assert logged[0]["paths"] == [str(tmp_path / "a"), str(tmp_path / "b")]


def test_lookup_paths(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    root.mkdir()
    tables, pcis = lookup_paths(str(root), None, Path("/img"))
    assert tables == [tmp_path.resolve() / "usr/share/libdrm/amdgpu.ids",
                      Path("/img/usr/share/libdrm/amdgpu.ids")]
    assert pcis == [tmp_path.resolve() / "usr/share/misc/pci.ids",
                    tmp_path.resolve() / "usr/share/hwdata/pci.ids",
                    Path("/img/usr/share/misc/pci.ids"), Path("/img/usr/share/hwdata/pci.ids")]
    # The real root: each file once.
    assert lookup_paths("/sys", None)[0] == [Path("/usr/share/libdrm/amdgpu.ids")]
    # The flag pins the table; pci.ids only beside the sysfs root.
    tables, pcis = lookup_paths(str(root), "/x/ids", Path("/img"))
    assert tables == [Path("/x/ids")] and all(p.is_relative_to(tmp_path.resolve())
                                              for p in pcis)


def test_the_first_table_tried_is_beside_the_sysfs_root() -> None:
    assert lookup_paths("/sys", None)[0][0] == Path("/usr/share/libdrm/amdgpu.ids")
    machine = FIXTURES / "amd-polaris-rx580"
    first = lookup_paths(str(machine / "sys"), None)[0][0]
    assert first == machine.resolve() / "usr/share/libdrm/amdgpu.ids"


def test_flag_env_and_backend(tmp_path: Path) -> None:
    assert load_config([], {}).amdgpu_ids is None
    assert load_config(["--path.amdgpu-ids", "/x/ids"], {}).amdgpu_ids == "/x/ids"
    assert load_config([], {"GPU_EXPORTER_PATH_AMDGPU_IDS": "/y"}).amdgpu_ids == "/y"
    # The flag wins over the file beside the sysfs root.
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "amd-rdna2-rx6900xt/sys", root, symlinks=True)
    (tmp_path / "mine.ids").write_text("1.0.0\n73BF,\tC0,\tRenamed By Flag\n")
    config = Config(sysfs=str(root), amdgpu_ids=str(tmp_path / "mine.ids"))
    (info,) = AmdBackend(config, DrmDiscovery(SysFS(root), hotplug=False)).open()
    assert info.name == "Renamed By Flag"
    # Without a table that names it: the synthetic name, never empty.
    config = Config(sysfs=str(root), amdgpu_ids=str(tmp_path / "missing.ids"))
    (info,) = AmdBackend(config, DrmDiscovery(SysFS(root), hotplug=False)).open()
    assert info.name == "AMD 0x73bf"


def independent_name(device: str, revision: str) -> str:
    for line in IDS.read_text().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 3 and cols[0].lower() == device[2:].lower() \
                and cols[1].lower() == revision[2:].lower():
            return ",".join(cols[2:])
    return ""


@pytest.mark.parametrize("machine", AMD)
def test_golden_names_match_the_ids_file(machine: str) -> None:
    (card,) = (FIXTURES / machine / "sys/class/drm").glob("card[0-9]")
    dev = card / "device"
    revision = (dev / "revision").read_text().strip() if (dev / "revision").exists() else ""
    device = (dev / "device").read_text().strip()
    # Not in the fixture's table: the synthetic name (the goldens read no pci.ids).
    expected = (independent_name(device, revision) if revision else "") or f"AMD {device}"
    golden = (GOLDEN / f"{machine}.prom").read_text()
    (name,) = re.findall(r'^gpu_info\{.*?name="([^"]*)"', golden, re.M)
    assert name == expected
    if machine in ("amd-polaris-rx580", "amd-rdna2-rx6900xt"):
        assert name  # these two are in libdrm 2.4.114's table
