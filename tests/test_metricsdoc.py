"""docs/metrics.md is what the code emits: generated from the renderer, and every family a
golden output shows is documented in it."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from exporter.metricsdoc import generate
from tests.daemon import REPO


def test_docs_metrics_md_is_generated_from_the_code() -> None:
    committed = (REPO / "docs" / "metrics.md").read_text()
    assert committed == generate(), "run: python -m exporter.metricsdoc > docs/metrics.md"


def test_every_family_in_the_goldens_is_documented() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9_]+)`", generate(), re.M))
    emitted = set()
    for golden in (REPO / "tests" / "golden").glob("*.prom"):
        for family in text_string_to_metric_families(golden.read_text()):
            for sample in family.samples:
                emitted.add(re.sub(r"_(bucket|count|sum)$", "", sample.name))
    assert emitted, "no goldens"
    assert emitted - documented == set()
