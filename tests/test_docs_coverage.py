"""docs/coverage.md is the coverage matrix of the goldens, regenerated: it cannot drift.

The matrix is checked against one golden read here by hand (a plain text scan, not the
generator's parser), so a generator that marked nothing, or everything, fails too.
"""

from __future__ import annotations

import re

from tests.coverage_matrix import GOLDEN, matrix

# docs/coverage.md itself is checked with every generated doc (tests/test_metricsdoc.py).


def _row(family: str) -> list[str]:
    lines = matrix().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(line for line in lines if line.startswith(f"| `{family}` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    return [h for h, c in zip(header, cells, strict=True) if c == "✓"]


def test_marks_agree_with_the_golden_files() -> None:
    t4 = (GOLDEN / "nvidia-t4.prom").read_text()
    assert re.search(r'^gpu_power_watts\{[^}]*source="nvml"', t4, re.M)
    assert "nvidia `nvml`" in _row("gpu_power_watts")
    apple = (GOLDEN / "apple-m1max.prom").read_text()
    assert not re.search(r"^gpu_pcie_link_width\{", apple, re.M)
    assert "apple `macmon`" not in _row("gpu_pcie_link_width")
    # amdgpu's sysfs has no busy-time counter: no AMD sysfs mark on the counter family.
    assert "amd `sysfs`" not in _row("gpu_engine_busy_seconds_total")
    assert "amd `sysfs`" in _row("gpu_engine_utilization_ratio")
