"""pyproject.toml lists the packages by hand (discovery would walk the fixture trees'
symlink cycles): every package under exporter/ must be in that list, or wheels and the
image ship without it."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_under_exporter_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {str(init.parent.relative_to(ROOT)).replace("/", ".")
             for init in (ROOT / "exporter").rglob("__init__.py")}
    assert "exporter.sources.nvidia" in found
    assert "exporter.attribution.kubernetes.proto" in found
    assert found - listed == set(), "add them to [tool.setuptools] packages"
    assert listed - found == set(), "listed, but no such package"


@pytest.mark.slow
def test_the_live_pages_files_are_package_data(tmp_path: Path) -> None:
    """The page's script and style sheet are files of exporter.serve, served through
    importlib.resources: setuptools' build_py (what a wheel is made of) copies them,
    as [tool.setuptools.package-data] says, and every non-Python file under
    exporter/serve/static is matched by it."""
    import shutil
    import subprocess
    import sys

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    static = sorted(p.name for p in (ROOT / "exporter/serve/static").iterdir())
    assert static == ["app.css", "app.js"]
    assert data["exporter.serve"] == ["static/*.js", "static/*.css"]
    # build from a copy: build_py writes an egg-info beside pyproject.toml
    src = tmp_path / "src"
    shutil.copytree(ROOT / "exporter", src / "exporter",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q",
                    "build_py", "--build-lib", str(tmp_path / "lib")], cwd=src, check=True,
                   capture_output=True, timeout=120)
    built = tmp_path / "lib" / "exporter" / "serve" / "static"
    assert sorted(p.name for p in built.iterdir()) == static
    for name in static:
        assert (built / name).read_bytes() == (ROOT / "exporter/serve/static" / name).read_bytes()
