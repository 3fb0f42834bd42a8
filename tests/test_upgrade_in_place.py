"""An upgrade under a running daemon (``pip install -U``, a reinstall of the checkout)
replaces the package's files before the service restarts: what the daemon imports on a
page's first request must not come from the new files (exporter.serve.installed).

The daemon runs from a copy of the package, which the test then replaces the way pip
does (every file removed, the new version's written), with a version in which the live
page's module moved (the old code answered ``GET /`` with a 500: No module named
'exporter.serve.landing')."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.serve.installed import RESTART, Installed, PackageChanged, fingerprint
from tests.daemon import EMPTY_PROC, FIXTURES, PERF_SHIM, REPO, SHIM, running

MACHINE = FIXTURES / "amd-rdna3-rx7800xt"


def install(site: Path, moved: bool = False) -> None:
    """The package into ``site`` as pip puts it there; ``moved``: the next version, where
    the live page's module has another name."""
    if (site / "exporter").exists():
        shutil.rmtree(site / "exporter")
    shutil.copytree(REPO / "exporter", site / "exporter",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if moved:
        serve = site / "exporter" / "serve"
        (serve / "landing.py").rename(serve / "page.py")


@pytest.mark.slow
def test_a_daemon_upgraded_under_it_says_restart_and_keeps_serving_metrics(
        tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site)
    env = {"PYTHONPATH": os.pathsep.join(map(str, (SHIM, PERF_SHIM, site, REPO)))}
    args = ["--path.sysfs", str(MACHINE / "sys"), "--path.procfs", str(EMPTY_PROC)]
    with running(args, tmp_path, env=env, cwd=tmp_path) as d:
        assert d.get("/snapshot").status_code == 200  # imported before the upgrade
        install(site, moved=True)
        for path in ("/", "/static/app.js", "/static/app.css", "/"):
            r = d.get(path)
            assert (r.status_code, r.text) == (503, RESTART), path
        assert d.get("/snapshot").status_code == 200  # its code is this process's already
        assert d.get("/metrics").status_code == 200
        assert d.get("/-/ready").status_code == 200
        said = d.records("the installed package changed under this process: restart it")
        assert len(said) == 1 and said[0]["package"] == str(site / "exporter")
    assert "Traceback" not in d.log()


@pytest.fixture()
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "upgraded_pkg"
    root.mkdir()
    for name in ("__init__", "first", "second"):
        (root / f"{name}.py").write_text(f"NAME = {name!r}\n")
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as a daemon writes it
    yield root
    for name in [m for m in sys.modules if m.split(".")[0] == "upgraded_pkg"]:
        del sys.modules[name]


def test_a_first_import_comes_only_from_the_files_the_process_started_with(
        package: Path) -> None:
    installed = Installed(package)
    assert installed.load("upgraded_pkg.first").NAME == "first"
    # the interpreter's own cache, written by that import, is not a change
    assert (package / "__pycache__").is_dir()
    assert installed.load("upgraded_pkg.second").NAME == "second"
    del sys.modules["upgraded_pkg.second"]
    (package / "second.py").write_text("NAME = 'the next version'\n")
    with pytest.raises(PackageChanged):
        installed.load("upgraded_pkg.second")
    assert installed.load("upgraded_pkg.first").NAME == "first"  # imported already: kept


def test_the_fingerprint_sees_a_file_added_removed_or_rewritten(package: Path) -> None:
    start = fingerprint(package)
    assert fingerprint(package) == start
    (package / "third.py").write_text("")
    assert fingerprint(package) != start
    (package / "third.py").unlink()
    assert fingerprint(package) == start
    os.utime(package / "first.py", ns=(0, 0))  # same size, written again
    assert fingerprint(package) != start
