"""Shared pytest set-up: the lanes (tests/lanes.py), the goldens' update order, and what
no test may do.

A test leaves the environment running the tests as it found it: one that uninstalls
gpu-exporter from it (``pip install --prefix`` with this interpreter did) fails.

Every test also checks that no code path let FakeNVML's driver model look past an NVML
array (``_no_nvml_array_overrun``).

``UPDATE_GOLDEN=1 python -m pytest -m golden`` rewrites every golden output: the plain
goldens (tests/test_golden.py) first, since the others compare with them.

Hypothesis (the property tests of every parser of untrusted input) runs under one of two
profiles: ``fast`` by default (60 examples a test, for the fast lane), ``ci`` where
``HYPOTHESIS_PROFILE=ci`` (.ci/run sets it: 500 examples; CI runs every test in one run,
not the fast lane). No deadline per example (machines are shared) and no example database
written into the checkout.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.fakes import fake_nvml
from tests.image_build import built_image  # noqa: F401  (the image, built once per run)

pytest_plugins = ["tests.lanes", "pytester"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        items.sort(key=lambda item: item.path.name != "test_golden.py")  # stable: else as is


def _installed_here() -> list[Path]:
    """gpu-exporter as installed in the environment running the tests (its dist-info and
    command), where it is installed there (the README's .venv)."""
    paths = sysconfig.get_paths()
    found = sorted(Path(paths["purelib"]).glob("gpu_exporter-*.dist-info"))
    command = Path(paths["scripts"]) / "gpu-exporter"
    return found + [command] if found and command.exists() else found


INSTALLED = _installed_here()


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    """The test left gpu-exporter installed in the environment running the tests."""
    yield
    gone = [str(p) for p in INSTALLED if not p.exists()]
    assert gone == [], f"the test removed gpu-exporter's install from {sys.prefix}: {gone}"


@pytest.fixture(autouse=True)
def _no_nvml_array_overrun(request: pytest.FixtureRequest) -> Iterator[None]:
    """No code path lets FakeNVML's driver model look past the caller's array (the class of
    defect that crashed the daemon on NVLinked GPUs); the test that shows the model sees
    nvidia-ml-py's own wrapper do it opts out with ``@pytest.mark.overrun_expected``."""
    start = len(fake_nvml.OVERRUNS)
    yield
    if request.node.get_closest_marker("overrun_expected") is None:
        assert fake_nvml.OVERRUNS[start:] == [], "the NVML driver model looked past an array"


# Hypothesis' profiles (the docstring says which runs which).
settings.register_profile("fast", max_examples=60, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=500, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
