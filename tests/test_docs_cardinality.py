"""docs/cardinality.md's counts are the goldens' counts, and its fleet table their sums.

Counted here from the golden files with prometheus-client's parser: series per GPU (the
largest GPU, without a ``pid`` label) and per process (the most of one (gpu, pid)).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "cardinality.md").read_text()
NODES, GPUS = 1000, 8


def counts(machine: str) -> tuple[int, int]:
    text = (ROOT / "tests" / "golden" / f"{machine}.prom").read_text()
    per_gpu: Counter[str] = Counter()
    per_process: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith("gpu_") or s.name.startswith("gpu_exporter_"):
                continue
            if "pid" in s.labels:
                per_process[(s.labels["gpu"], s.labels["pid"])] += 1
            else:
                per_gpu[s.labels.get("gpu", "")] += 1
    return max(per_gpu.values()), max(per_process.values(), default=0)


def rows(header: str) -> dict[str, list[int]]:
    lines = DOC.split(header, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")),
               len(lines))
    out = {}
    for line in lines[start + 2:end]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0].strip("`")] = [int(c.replace(",", "")) for c in cells if
                                    re.fullmatch(r"[\d,]+", c)]
    return out


def test_series_per_gpu_and_per_process_are_the_goldens() -> None:
    table = rows("## Series per GPU and per process")
    assert set(table) == {"nvidia-h100x2", "nvidia-t4", "amd-rdna3-rx7800xt", "intel-xe-b580"}
    for machine, (per_gpu, per_process) in table.items():
        assert counts(machine) == (per_gpu, per_process), machine


def test_fleet_table_is_the_sum() -> None:
    per = rows("## Series per GPU and per process")
    fleet = rows("## Fleet sizing: 1,000 nodes x 8 GPUs")
    assert set(fleet) == set(per)
    for machine, (gpu, process) in per.items():
        assert fleet[machine] == [(gpu + n * process) * NODES * GPUS for n in (0, 4, 64)]
