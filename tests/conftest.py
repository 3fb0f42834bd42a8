"""Shared pytest set-up: the fast lane's ``slow`` marker, and the goldens' update order.

``slow`` marks a test that starts a process (the exporter, promtool, Prometheus, a
browser, ``helm``, ``docker``): explicitly (``@pytest.mark.slow``), or found here, when
the test, a fixture it uses or a helper either of them calls (in tests/, followed
through names) runs one. ``pytest -m "not slow"`` is the fast lane; CI runs everything.

``UPDATE_GOLDEN=1 python -m pytest -m golden`` rewrites every golden output: the plain
goldens (tests/test_golden.py) first, since the others compare with them.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import textwrap
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
# What starts a process: the harness (tests/daemon.py's running, test_server's run_cli),
# subprocess, and the tools the end-to-end tests run.
STARTS = re.compile(r"\b(?:running|run_cli|Popen|subprocess\.(?:run|call|check_call|"
                    r"check_output)|create_subprocess_exec|promtool_check|probe)\s*\(")


@cache
def _starts_a_process(func: Callable[..., Any]) -> bool:
    """Whether ``func``, or a function of tests/ it names, starts a process."""
    seen: set[Callable[..., Any]] = set()
    todo = [func]
    while todo:
        f = inspect.unwrap(todo.pop())
        if f in seen:
            continue
        seen.add(f)
        try:
            source = textwrap.dedent(inspect.getsource(f))
        except (OSError, TypeError):
            continue
        if STARTS.search(source):
            return True
        names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)}
        scope = getattr(f, "__globals__", {})
        for name in names:
            g = scope.get(name)
            if inspect.isfunction(g) and _in_tests(g) and g not in seen:
                todo.append(g)
            elif inspect.isclass(g) and _in_tests(g):
                todo.extend(m for m in vars(g).values() if inspect.isfunction(m))
    return False


def _in_tests(obj: Any) -> bool:
    try:
        return Path(inspect.getfile(obj)).resolve().is_relative_to(TESTS)
    except (OSError, TypeError):
        return False


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
