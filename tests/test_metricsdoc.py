"""The generated docs are what the code emits: docs/metrics.md, docs/otlp.md's table,
docs/coverage.md and docs/cardinality.md's counts, all written by one command
(``python -m tools.metricsdoc``); and every family a golden output shows is documented."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from tests.daemon import REPO
from tools.metricsdoc import generate, outputs


def test_every_generated_doc_is_what_the_code_writes() -> None:
    written = outputs(REPO)
    assert {p.name for p in written} == {"metrics.md", "otlp.md", "coverage.md",
                                         "cardinality.md"}
    stale = [p.name for p, text in written.items() if p.read_text() != text]
    assert stale == [], "run: python -m tools.metricsdoc"


def test_every_family_in_the_goldens_is_documented() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", generate(), re.M))
    emitted = set()
    for golden in (REPO / "tests" / "golden").glob("*.prom"):
        for family in text_string_to_metric_families(golden.read_text()):
            for sample in family.samples:
                emitted.add(re.sub(r"_(bucket|count|sum)$", "", sample.name))
    assert emitted, "no goldens"
    assert emitted - documented == set()
