"""The contracts the type checker sees: the package is mypy-clean (strict) and ruff-clean,
and a string where a closed vocabulary is expected is rejected, not policed by a regex."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mypy import api

pytestmark = pytest.mark.slow  # the type checker reads the whole package: seconds

ROOT = Path(__file__).resolve().parent.parent


def mypy(*args: str) -> tuple[str, int]:
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), *args])
    return out + err, status


def test_the_package_is_mypy_clean() -> None:
    out, status = mypy()
    assert status == 0, out


def test_the_tree_is_ruff_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "exporter", "tests",
                             "bench"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_string_error_reason_is_a_type_error(tmp_path: Path) -> None:
    """A cycle's error counter is keyed by ErrorReason: "parse" where ErrorReason.PARSE
    belongs does not type-check (the type-checked form beside it does)."""
    snippet = tmp_path / "reasons.py"
    snippet.write_text(textwrap.dedent("""
        from collections import Counter
        from exporter.sources.base import Cycle
        from exporter.core.labels import ErrorReason

        errors: Counter[ErrorReason] = Counter()
        errors[ErrorReason.PARSE] += 1
        ok = Cycle(devices=[], errors=errors)
        errors["parse"] += 1
        bad = Cycle(devices=[], errors={"parse": 1})
    """))
    out, status = mypy("--strict", str(snippet))
    assert status == 1
    lines = [line for line in out.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in lines] == ["9", "10"], out
