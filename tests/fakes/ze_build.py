"""Compile the Level Zero stub loader (tests/fakes/ze_stub) with the machine's C compiler.

``build_stub(directory)`` writes ``directory/libze_loader.so.1``: the file name the
exporter asks the dynamic linker for, so a daemon started with
``LD_LIBRARY_PATH=directory`` loads it exactly as it would load the real loader.
Without a C compiler the calling test is skipped with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

STUB = Path(__file__).resolve().parent / "ze_stub"
REAL_HEADER = Path("/usr/include/level_zero/zes_api.h")


def compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the Level Zero stub loader")
    return cc


def build_stub(directory: Path, *, with_zesinit: bool = True) -> Path:
    """Compile the stub into ``directory/libze_loader.so.1`` and return that path."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "libze_loader.so.1"
    cmd = [compiler(), "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-I", str(STUB),
           "-o", str(out), str(STUB / "ze_stub.c")]
    if not with_zesinit:
        cmd.insert(1, "-DZE_STUB_NO_ZESINIT")
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"stub did not compile: {done.stderr}"
    return out


def real_header_layout(directory: Path) -> str:
    """The layout table compiled against the installed <level_zero/zes_api.h>."""
    if not REAL_HEADER.exists():
        pytest.skip(f"{REAL_HEADER} not installed (Debian: apt-get install libze-dev)")
    exe = directory / "layout_real"
    subprocess.run([compiler(), "-I", str(STUB), "-o", str(exe), str(STUB / "layout_real.c")],
                   check=True, capture_output=True, text=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
