"""exporter.sources.kernel.i915_xe_pmu on the fixture machines' event_source trees (built by
tests/fixtures/build_pmu.py from the listings cited in tests/fixtures/PMU_SOURCES.md)
and on the strings the drivers print."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.sources.kernel.i915_xe_pmu import (
    encode,
    i915_engines,
    parse_cpumask,
    parse_format,
    parse_pmu_name,
    parse_terms,
    read_pmus,
    xe_engine_candidates,
)

FIXTURES = Path(__file__).parent / "fixtures"


def only_pmu(machine: str):  # type: ignore[no-untyped-def]
    (pmu,) = read_pmus(FIXTURES / machine / "sys")
    return pmu


def test_integrated_i915_is_the_bare_name_with_gen9_engines() -> None:
    pmu = only_pmu("intel-i915-cometlake")
    assert (pmu.name, pmu.driver, pmu.pci_bus_id, pmu.type, pmu.cpu) == \
        ("i915", "i915", None, 12, 0)
    # config = class << 12 | instance << 4 | sample (busy = 0), from i915_drm.h
    assert i915_engines(pmu) == {("rcs", 0): 0x0, ("bcs", 0): 0x1000, ("vcs", 0): 0x2000,
                                 ("vecs", 0): 0x3000}
    assert "rc6-residency" in pmu.events and "rc6-residency.unit" not in pmu.events


def test_discrete_i915_is_named_after_its_pci_address() -> None:
    pmu = only_pmu("intel-i915-arc-a380")
    assert (pmu.name, pmu.pci_bus_id, pmu.type) == ("i915_0000_08_00.0", "0000:08:00.0", 23)
    engines = i915_engines(pmu)
    assert engines[("vcs", 1)] == 0x2010 and engines[("ccs", 0)] == 0x4000
    assert ("vcs", 1) in engines and len(engines) == 7  # -wait/-sema are not busy counters


def test_xe_engine_configs_come_from_the_format_fields() -> None:
    pmu = only_pmu("intel-xe-b580")
    assert (pmu.name, pmu.driver, pmu.pci_bus_id) == ("xe_0000_09_00.0", "xe", "0000:09:00.0")
    assert pmu.formats["gt"] == ((60, 63),) and pmu.formats["engine_class"] == ((20, 27),)
    candidates = xe_engine_candidates(pmu, [0, 1])
    assert candidates[("rcs", 0, 0)] == (0x2, 0x3)
    # vcs1 on the media GT: gt 1 << 60 | class 2 << 20 | instance 1 << 12 | event
    assert candidates[("vcs", 1, 1)] == (1 << 60 | 2 << 20 | 1 << 12 | 2,
                                        1 << 60 | 2 << 20 | 1 << 12 | 3)
    assert len(candidates) == 2 * 5 * 9


@pytest.mark.parametrize(("name", "parsed"), [
    ("i915", ("i915", None)),
    ("i915_0000_03_00.0", ("i915", "0000:03:00.0")),
    ("xe_0000_00_02.0", ("xe", "0000:00:02.0")),
    ("xe", None), ("i915_0000:03:00.0", None), ("amdgpu_df_0", None), ("msr", None),
])
def test_pmu_names(name: str, parsed: tuple[str, str | None] | None) -> None:
    assert parse_pmu_name(name) == parsed


def test_small_parsers_refuse_garbage() -> None:
    assert parse_cpumask("0") == 0 and parse_cpumask("4-7") == 4 and parse_cpumask("2,6") == 2
    assert parse_cpumask("") is None and parse_cpumask("x") is None
    assert parse_format("config:60-63") == ((60, 63),)
    assert parse_format("config:7") == ((7, 7),)
    assert parse_format("config1:0-3") is None and parse_format("config:9-70") is None
    assert parse_terms("config=0x2010") == {"config": 0x2010}
    assert parse_terms("event=0x02,umask") == {"event": 2, "umask": 1}
    assert parse_terms("config=") is None and parse_terms("") is None


def test_encode_refuses_an_unknown_term_or_a_value_too_wide() -> None:
    pmu = only_pmu("intel-xe-b580")
    assert encode(pmu, "engine-active-ticks", gt=1) == 1 << 60 | 2
    assert encode(pmu, "engine-active-ticks", gt=16) is None  # gt is 4 bits
    assert encode(pmu, "engine-active-ticks", colour=1) is None
    assert encode(pmu, "no-such-event") is None


def test_a_tree_without_pmus_or_with_broken_files_gives_none(tmp_path: Path) -> None:
    assert read_pmus(tmp_path) == []
    devices = tmp_path / "bus" / "event_source" / "devices"
    (devices / "i915").mkdir(parents=True)
    (devices / "i915" / "type").write_text("not a number\n")
    (devices / "i915" / "cpumask").write_text("0\n")
    (devices / "xe_0000_03_00.0").mkdir()
    (devices / "xe_0000_03_00.0" / "type").write_text("31\n")  # no cpumask
    assert read_pmus(tmp_path) == []
