"""The fixture builders rebuild the committed trees from what the repository holds.

Each builder that writes a machine's ``sys/``, ``proc/`` or recorded lines is run into
``tmp_path`` (its module's ``HERE`` pointed there), reading its captures from
``tests/fixtures/captures`` (see SOURCES.md there), and every file and symlink it writes
must be byte-identical to the committed one. Where a builder owns a tree (it deletes and
rewrites it), the committed tree must hold nothing the builders no longer write. Git
keeps no empty directories, so only files and symlinks are compared.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CAPTURES = FIXTURES / "captures"
Entry = tuple[str, bytes]
# The machines whose pid directories build_proc.py writes (its MACHINES).
PROC_MACHINES = {"amd-rdna3-rx7800xt", "amd-apu-phoenix", "intel-xe-b580", "intel-i915-cometlake"}


def load(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh copy of the builder script (registered: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(f"_fixture_{name}", FIXTURES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def tree(root: Path) -> dict[str, Entry]:
    """Every file (its bytes) and symlink (its target) under ``root``, by relative path."""
    found: dict[str, Entry] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path).encode())
            elif path.is_file():
                found[rel] = ("file", path.read_bytes())
    return found


def build_all(out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the builders in the order the committed trees were made (proc before intel:
    an empty ``proc/`` gets a ``.keep``; pmu adds its events to intel's ``sys/``)."""
    for var in ("AMD_SAMPLES", "MACMON_SAMPLES", "AMDGPU_IDS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # build_pmu/build_amd extend it
    proc = load("build_proc", monkeypatch)
    assert set(proc.MACHINES) == PROC_MACHINES
    for machine in proc.MACHINES:
        proc.build(machine, out / machine / "proc")
    amd = load("build_amd", monkeypatch)
    assert amd.SAMPLES == CAPTURES
    monkeypatch.setattr(amd, "HERE", out)
    monkeypatch.setattr(amd, "IDS", out / "libdrm" / "amdgpu.ids")  # a link's target only
    amd.main()
    amd.build_mi300x()
    macmon = load("build_macmon", monkeypatch)
    assert macmon.SAMPLES == CAPTURES / "macmon"
    monkeypatch.setattr(macmon, "HERE", out / "macmon")
    macmon.main()
    for name in ("build_intel", "build_pmu", "build_nvidia"):
        module = load(name, monkeypatch)
        monkeypatch.setattr(module, "HERE", out)
        module.main()


def owned(path: str, proc_machines: set[str]) -> bool:
    """A committed path inside a tree the builders delete and rewrite whole."""
    machine, _, rest = path.partition("/")
    sub = rest.split("/")
    if machine.startswith("nvidia-"):  # build_nvidia: the whole machine
        return True
    if machine.startswith(("amd-", "intel-")) and sub[0] in ("sys", "usr"):
        return True
    return (machine in proc_machines and sub[0] == "proc" and len(sub) > 1
            and sub[1].isdigit())  # build_proc's pids


def test_builders_rebuild_the_committed_trees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    build_all(tmp_path, monkeypatch)
    capsys.readouterr()
    built, committed = tree(tmp_path), tree(FIXTURES)
    machines = {path.split("/", 1)[0] for path in built}
    assert {"amd-polaris-rx580", "amd-mi300x", "intel-xe-b580", "nvidia-t4", "macmon"} <= machines
    assert len(built) > 800
    assert sorted(p for p in built if p not in committed) == []
    assert sorted(p for p in built if built[p] != committed[p]) == []
    stale = sorted(p for p in committed
                   if p.split("/", 1)[0] in machines and owned(p, PROC_MACHINES) and p not in built)
    assert stale == []


def test_builders_read_only_the_repository_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every capture it opens lies under tests/fixtures/captures, and none there is unread:
    the copy holds exactly what the builders need."""
    opened: set[str] = set()
    armed: list[bool] = []

    def hook(event: str, args: tuple[object, ...]) -> None:
        if armed and event == "open" and isinstance(args[0], str) and args[1] in ("r", "rb"):
            opened.add(os.path.realpath(args[0]))

    sys.addaudithook(hook)  # audit hooks stay for the process: this one records while armed
    monkeypatch.setattr(sys, "path", list(sys.path))
    amd, macmon = load("build_amd", monkeypatch), load("build_macmon", monkeypatch)
    monkeypatch.setattr(amd, "HERE", tmp_path)
    monkeypatch.setattr(amd, "IDS", tmp_path / "ids")
    monkeypatch.setattr(macmon, "HERE", tmp_path / "macmon")
    armed.append(True)
    try:
        amd.main()
        macmon.main()
    finally:
        armed.clear()
    read = {p for p in opened if not p.startswith(str(tmp_path))}
    assert read == {os.path.realpath(p) for p in CAPTURES.rglob("*")
                    if p.is_file() and p.name != "SOURCES.md"}


def test_the_tree_comparison_can_fail(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1\n")
    (tmp_path / "l").symlink_to("a")
    before = tree(tmp_path)
    assert before == {"a": ("file", b"1\n"), "l": ("link", b"a")}
    (tmp_path / "a").write_bytes(b"1")
    assert tree(tmp_path) != before
