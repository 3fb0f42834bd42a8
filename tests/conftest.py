"""Shared pytest set-up: the fast lane's ``slow`` marker, and the goldens' update order.

``slow`` marks a test that starts a process (the exporter, promtool, Prometheus, a
browser, ``helm``, ``docker``): explicitly (``@pytest.mark.slow``), or found here, when
the test, a fixture it uses or a helper either of them calls (in tests/, followed
through names) runs one. ``pytest -m "not slow"`` is the fast lane; CI runs everything.

Every test also checks that no code path let FakeNVML's driver model look past an NVML
array (``_no_nvml_array_overrun``).

``UPDATE_GOLDEN=1 python -m pytest -m golden`` rewrites every golden output: the plain
goldens (tests/test_golden.py) first, since the others compare with them.

Hypothesis (the property tests of every parser of untrusted input) runs under one of two
profiles: ``fast`` by default (60 examples a test, for the fast lane), ``ci`` where
``HYPOTHESIS_PROFILE=ci`` (.ci/run sets it: 1,000 examples; CI runs every test in one run,
not the fast lane). No deadline per example (machines are shared) and no example database
written into the checkout.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import textwrap
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.fakes import fake_nvml
from tests.image_build import built_image  # noqa: F401  (the image, built once per run)

TESTS = Path(__file__).resolve().parent
# What starts a process: the harness (tests/daemon.py's running, test_server's run_cli),
# subprocess, and the tools the end-to-end tests run.
STARTS = re.compile(r"\b(?:running|run_cli|Popen|subprocess\.(?:run|call|check_call|"
                    r"check_output)|create_subprocess_exec|promtool_check|probe)\s*\(")


@cache
def _in_tests_file(filename: str) -> bool:
    return Path(filename).resolve().is_relative_to(TESTS)


def _in_tests(obj: Any) -> bool:
    try:
        return _in_tests_file(inspect.getfile(obj))
    except (OSError, TypeError):
        return False


@cache
def _direct(func: Callable[..., Any]) -> tuple[bool, tuple[Callable[..., Any], ...]]:
    """Whether ``func``'s own source starts a process, and the functions of tests/ it
    names (a class of tests/: its methods)."""
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return False, ()
    if STARTS.search(source):
        return True, ()
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    scope = getattr(func, "__globals__", {})
    out: list[Callable[..., Any]] = []
    for name in names:
        g = scope.get(name)
        if inspect.isfunction(g):
            g = inspect.unwrap(g)  # a @contextmanager helper's own function, in tests/
        if inspect.isfunction(g) and _in_tests(g):
            out.append(g)
        elif inspect.isclass(g) and _in_tests(g):
            out.extend(m for m in vars(g).values() if inspect.isfunction(m))
    return False, tuple(out)


_STARTS: dict[Callable[..., Any], bool] = {}  # settled answers


def _starts_a_process(func: Callable[..., Any],
                      path: frozenset[Callable[..., Any]] = frozenset()) -> bool:
    """Whether ``func``, or a function of tests/ it names (followed through names), starts
    a process. A "no" found while a caller was still open (a cycle) is not kept."""
    func = inspect.unwrap(func)
    if func in _STARTS:
        return _STARTS[func]
    if func in path:
        return False
    starts, named = _direct(func)
    result = starts or any(_starts_a_process(g, path | {func}) for g in named)
    if result or not path:
        _STARTS[func] = result
    return result


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") or not isinstance(item, pytest.Function):
            continue
        info = item._fixtureinfo  # the fixtures it uses, transitively
        funcs = [item.function] + [d.func for defs in info.name2fixturedefs.values()
                                   for d in defs if _in_tests(d.func)]
        if any(_starts_a_process(f) for f in funcs):
            item.add_marker(pytest.mark.slow)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        items.sort(key=lambda item: item.path.name != "test_golden.py")  # stable: else as is


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
settings.register_profile("ci", max_examples=1000, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))
