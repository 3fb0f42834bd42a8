"""Shared pytest set-up.

``UPDATE_GOLDEN=1 python -m pytest -m golden`` rewrites every golden output: the plain
goldens (tests/test_golden.py) first, since the others compare with them.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("UPDATE_GOLDEN") == "1":
        items.sort(key=lambda item: item.path.name != "test_golden.py")  # stable: else as is
