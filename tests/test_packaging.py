"""pyproject.toml lists the packages by hand (discovery would walk the fixture trees'
symlink cycles): every package under exporter/ must be in that list, or wheels and the
image ship without it."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_under_exporter_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {str(init.parent.relative_to(ROOT)).replace("/", ".")
             for init in (ROOT / "exporter").rglob("__init__.py")}
    assert "exporter.collect.backends.nvidia" in found
    assert "exporter.collect.kubernetes.proto" in found
    assert found - listed == set(), "add them to [tool.setuptools] packages"
    assert listed - found == set(), "listed, but no such package"
