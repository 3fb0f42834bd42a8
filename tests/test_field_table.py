"""One field table: the HELP and TYPE served, docs/metrics.md and the declarations agree.

The specs (exporter.core.model's value fields, render's gpu_info/gpu_up/allocation specs,
render.selfmetrics' gpu_exporter_* specs) are the one declaration. A real daemon's
/metrics (fake NVML on the H100 fixture: NVLink, GPM, processes, XID) and every golden
(byte-identical to what the daemon serves, test_golden.py) are parsed with
prometheus-client's parser, and each family's HELP and TYPE is compared with its spec;
docs/metrics.md's rows are compared with the same specs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution import slurm
from exporter.attribution.kubernetes import podlabels, unallocated
from exporter.core.fieldspec import Exposure, Kind, MetricSpec, value_specs
from exporter.core.labels import VOCABULARIES, Engine
from exporter.core.model import DeviceSample, DeviceValues
from exporter.output.render.families import (
    ALLOCATION,
    DEVICE_SPECS,
    INFO,
    PROCESS_SPECS,
    UP,
    families_of,
)
from exporter.output.render.selfmetrics import EXPORTER
from exporter.pipeline import health
from tests.daemon import FIXTURES, REPO, machine_args, running
from tests.test_golden import ONE_CYCLE

ALL_SPECS: list[MetricSpec] = [INFO, UP, ALLOCATION, *(s for _, s in DEVICE_SPECS),
                               *(s for _, s in PROCESS_SPECS), *EXPORTER, health.STATUS,
                               health.CHECK, podlabels.SPEC, unallocated.SPEC, slurm.SPEC]
# family name as served -> (help, type)
DECLARED = {name: (doc, spec.kind.value) for spec in ALL_SPECS
            for name, doc in families_of(spec)}


def _families(text: str) -> Iterator[Metric]:
    yield from text_string_to_metric_families(text)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = FIXTURES / "nvidia-h100x2"
    with running([*machine_args(root), *ONE_CYCLE], tmp_path_factory.mktemp("table"),
                 nvml_json=root / "nvml.json") as d:
        text: str = d.get().text
        return text


def _served_name(family: Metric) -> str:
    # The parser names a counter family without _total; the table names it as sampled.
    return f"{family.name}_total" if family.type == "counter" else family.name


@pytest.mark.slow
def test_every_gpu_family_served_has_the_help_and_type_its_spec_declares(served: str) -> None:
    texts = [served, *(p.read_text() for p in sorted((REPO / "tests/golden").glob("*.prom")))]
    checked = set()
    for text in texts:
        for family in _families(text):
            name = _served_name(family)
            if not name.startswith("gpu_"):
                continue  # prometheus-client's process_* / python_*
            assert name in DECLARED, f"{name} is served but declared nowhere"
            assert (family.documentation, family.type) == DECLARED[name], name
            checked.add(name)
    # Enough of the table is served here for the check to mean something: every
    # gpu_exporter_* family (macmon restarts from the Apple golden; the OTLP counter and
    # the reload gauges, served only with --otlp.endpoint and --config.file, from
    # tests/golden/flags.prom), the NVML families.
    assert {s.name for s in EXPORTER} - checked == set()
    assert {"gpu_nvlink_up", "gpu_sm_active_ratio", "gpu_process_memory_used_bytes",
            "gpu_energy_joules_total", "gpu_xid_errors_total"} <= checked


def test_docs_metrics_md_rows_are_the_declared_help_and_type() -> None:
    # name | type | labels | (cadence, in the tables that have it) | help
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\w+) \|[^|]*\|"
                      r"(?: (?:(?:fast|slow|static)(?: \([^)|]*\))?|`--[a-z.-]+`) \|)? (.*) \|$",
                      (REPO / "docs" / "metrics.md").read_text(), re.M)
    documented = {name: (kind, doc) for name, kind, doc in rows}
    assert set(documented) == set(DECLARED)
    for name, (doc, kind) in DECLARED.items():
        assert documented[name][0] == kind, name
        assert documented[name][1].startswith(doc), name


def test_counters_and_only_counters_end_in_total() -> None:
    for spec in ALL_SPECS:
        for name, _ in families_of(spec):
            assert name.endswith("_total") == (spec.kind is Kind.COUNTER), name


def test_every_value_field_declares_a_metric_and_units_gate_knows_its_unit() -> None:
    from exporter.core.units import RANGES

    values = {f for f in DeviceValues.__dataclass_fields__}
    assert values == {name for name, _ in value_specs(DeviceSample)}
    for _, spec in (*DEVICE_SPECS, *PROCESS_SPECS):
        assert not spec.unit or spec.unit in RANGES, spec.name
    # xid_last is the one value served only under dcgm-exporter's name; the others without
    # a family of their own are what the health verdict reads (exporter.pipeline.health)
    exposure = {n: s.exposure for n, s in DEVICE_SPECS if not s.served}
    assert exposure == {"xid_last": Exposure.DCGM_ONLY, "recovery_action": Exposure.INTERNAL,
                        "retired_pages_pending": Exposure.INTERNAL,
                        "xid_seen_seconds": Exposure.INTERNAL}
    assert all(not s.name for n, s in DEVICE_SPECS if n in exposure)
    with pytest.raises(ValueError):  # a name and its exposure cannot disagree
        MetricSpec("", "no name", exposure=Exposure.SERVED)
    with pytest.raises(ValueError):
        MetricSpec("gpu_x", "a name", exposure=Exposure.INTERNAL)


@pytest.mark.slow
def test_closed_label_vocabularies_cover_every_value_served(served: str) -> None:
    goldens = [served, *(p.read_text() for p in (REPO / "tests/golden").glob("*.prom"))]
    mapped = {label for _, spec in DEVICE_SPECS for label in spec.labels}
    seen: dict[str, set[str]] = {}
    for text in goldens:
        for family in _families(text):
            if not family.name.startswith("gpu_") or family.name.startswith("gpu_exporter"):
                continue
            for sample in family.samples:
                for label, vocab in VOCABULARIES.items():
                    if label in sample.labels and label in mapped:
                        seen.setdefault(label, set()).add(sample.labels[label])
                        assert sample.labels[label] in {v.value for v in vocab}, (
                            family.name, label, sample.labels[label])
    assert {"sensor", "clock", "reason", "direction", "severity"} <= set(seen)
    # Engine is open (fdinfo passes driver names through), but every engine the fixture
    # machines show is one the readers map to.
    engines = {s.labels["engine"] for text in goldens for family in _families(text)
               for s in family.samples if "engine" in s.labels}
    assert engines and engines <= {e.value for e in Engine}

