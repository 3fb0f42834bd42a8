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

from exporter.backends.amd.backend import AmdBackend
from exporter.backends.amd.ids import AmdgpuIds, default_path, parse_amdgpu_ids
from exporter.cli import load_config
from exporter.config import Config
from exporter.discovery import DrmDiscovery
from exporter.fs import SysFS

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
IDS = FIXTURES / "libdrm" / "amdgpu.ids"
AMD = sorted(p.name for p in FIXTURES.iterdir()
             if p.name.startswith("amd-") and (p / "sys").is_dir())


def test_parse_format() -> None:
    table = parse_amdgpu_ids("# comment\n\n1.0.0\n73BF,\tC0,\tAMD Radeon RX 6900 XT\n"
                             "73BF,\tC1,\tAMD Radeon RX 6800 XT\nZZZZ,\t00,\tbad id\n"
                             "67DF,\tE7,\tAMD Radeon RX 580 Series\x07\n")
    assert table == {(0x73BF, 0xC0): "AMD Radeon RX 6900 XT",
                     (0x73BF, 0xC1): "AMD Radeon RX 6800 XT",
                     (0x67DF, 0xE7): "AMD Radeon RX 580 Series"}


def test_exact_revision_only(tmp_path: Path) -> None:
    (tmp_path / "ids").write_text("1.0.0\n73BF,\tC0,\tAMD Radeon RX 6900 XT\n")
    ids = AmdgpuIds(tmp_path / "ids")
    assert ids.name("0x73bf", "0xc0") == "AMD Radeon RX 6900 XT"
    assert ids.name("0x73bf", "0xc3") == ""  # another product, not a guess
    assert ids.name("0x73bf", None) == "" and ids.name("garbage", "0xc0") == ""
    assert AmdgpuIds(tmp_path / "missing").name("0x73bf", "0xc0") == ""


def test_default_path_is_beside_the_sysfs_root() -> None:
    assert default_path("/sys") == Path("/usr/share/libdrm/amdgpu.ids")
    machine = FIXTURES / "amd-polaris-rx580"
    assert default_path(str(machine / "sys")) == machine.resolve() / "usr/share/libdrm/amdgpu.ids"


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
    # Without the flag and without a file beside the root: no name, not an error.
    (info,) = AmdBackend(Config(sysfs=str(root)), DrmDiscovery(SysFS(root), hotplug=False)).open()
    assert info.name == ""


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
    expected = independent_name((dev / "device").read_text().strip(), revision) \
        if revision else ""
    golden = (GOLDEN / f"{machine}.prom").read_text()
    (name,) = re.findall(r'^gpu_info\{.*?name="([^"]*)"', golden, re.M)
    assert name == expected
    if machine in ("amd-polaris-rx580", "amd-rdna2-rx6900xt"):
        assert name  # these two are in libdrm 2.4.114's table
