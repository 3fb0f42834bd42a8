"""DeviceValues.overlay() and present(), the per-cycle merge of a backend's fragments.

Both skip dataclass machinery for speed (bench/nvml_calls.py --stub --cycle): present()
knows which fields are mappings up front, overlay() copies the instance dict instead of
calling dataclasses.replace(), and quick_init fills a new instance's dict at once. These
tests hold them to what replace(), the generated __init__ and the field
table say, so a field, a __post_init__ or cached state added later cannot slip by.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from types import MappingProxyType

import pytest

from exporter.core.model import (
    DeviceInfo,
    DeviceSample,
    DeviceValues,
    ProcessSample,
    copy_with,
    quick_init,
)

INFO = DeviceInfo(vendor="nvidia", pci_bus_id="0000:01:00.0", uuid="GPU-1", name="H100")


def test_overlay_equals_replace() -> None:
    base = DeviceSample(info=INFO, source="nvml", power_watts=100.0,
                        clocks_hertz={"sm": 1.98e9})
    fragment = DeviceValues(power_watts=0.0, temperatures_celsius={"gpu": 40.0},
                            clocks_hertz={}, utilization_ratio=None)
    got = base.overlay(fragment)
    assert got == replace(base, power_watts=0.0, temperatures_celsius={"gpu": 40.0})
    assert type(got) is DeviceSample and got.source == "nvml" and got.info is INFO
    assert got.power_watts == 0.0  # a zero is a value: it wins
    assert got.clocks_hertz == {"sm": 1.98e9}  # an empty mapping is not: the base's stays
    assert base.power_watts == 100.0  # the base is not changed
    assert base.overlay(DeviceValues()) is base


def test_later_fragment_wins() -> None:
    got = DeviceValues().overlay(DeviceValues(power_watts=1.0), DeviceValues(power_watts=2.0))
    assert got.power_watts == 2.0 and got == DeviceValues(power_watts=2.0)


def test_present_follows_the_field_table() -> None:
    # Every value field set to a non-empty value is present; defaults are not.
    assert DeviceValues().present() == {}
    full = {f.name: ({"k": 1.0} if f.default is not None else 1.0)
            for f in fields(DeviceValues)}
    assert set(DeviceValues(**full).present()) == set(full)


def test_instances_hold_only_their_fields() -> None:
    # What overlay()'s copy of __dict__ relies on.
    assert not hasattr(DeviceValues, "__post_init__")
    assert not hasattr(DeviceSample, "__post_init__")
    sample = DeviceSample(info=INFO, source="nvml")
    assert set(vars(sample)) == {f.name for f in fields(DeviceSample)}


def test_present_of_a_fragment_and_of_a_sample_agree() -> None:
    # A fragment takes a shortcut over its __dict__; a sample goes by the field table.
    # Falsy scalars (0.0, False, "") are values; empty mappings of any type are not.
    values = {"power_watts": 0.0, "retired_pages_pending": False, "recovery_action": "",
              "clocks_hertz": {}, "temperatures_celsius": MappingProxyType({}),
              "engine_utilization_ratio": {"compute": 0.0}, "fan_speed_ratio": None}
    fragment = DeviceValues(**values)  # type: ignore[arg-type]
    sample = DeviceSample(info=INFO, source="nvml", **values)  # type: ignore[arg-type]
    assert fragment.present() == sample.present() == {
        "power_watts": 0.0, "retired_pages_pending": False, "recovery_action": "",
        "engine_utilization_ratio": {"compute": 0.0}}


@pytest.mark.parametrize("cls", [DeviceValues, DeviceSample, ProcessSample])
def test_the_quick_init_builds_what_the_generated_one_does(cls: type) -> None:
    required = {"info": INFO, "source": "nvml"} if cls is DeviceSample else \
        {"pid": 7, "process": "python"} if cls is ProcessSample else {}
    full = {f.name: ({"k": 1.0} if f.default is MISSING and f.default_factory is not MISSING
                     else 1.0) for f in fields(cls) if f.name not in required}
    for kwargs in ({**required}, {**required, "power_watts": 0.0} if cls is not ProcessSample
                   else {**required, "memory_used_bytes": 0.0}, {**required, **full}):
        quick = cls(**kwargs)
        generated = object.__new__(cls)
        cls.__init__.__wrapped__(generated, **kwargs)  # type: ignore[misc]
        assert quick == generated
        assert list(vars(quick).items()) == list(vars(generated).items())  # field order too
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        cls(**required, bogus=1)
    if required:
        with pytest.raises(TypeError, match="missing"):
            cls()


def test_the_quick_init_refuses_a_default_factory_of_fresh_objects() -> None:
    @dataclass(frozen=True)
    class Fresh:
        values: dict[str, float] = field(default_factory=dict)

    with pytest.raises(TypeError, match="fresh objects"):
        quick_init(Fresh)


def test_copy_with_is_replace_without_init() -> None:
    sample = DeviceSample(info=INFO, source="nvml", power_watts=1.0,
                          clocks_hertz={"sm": 1.5e9},
                          processes=(ProcessSample(pid=7, process="python"),))
    process = sample.processes[0]
    for original, changes in ((sample, {"power_watts": 2.0, "field_sources": {"x": "y"}}),
                              (process, {"source": "nvml", "memory_used_bytes": 5.0})):
        copied = copy_with(original, **changes)
        assert copied == replace(original, **changes)  # type: ignore[arg-type]
        assert list(vars(copied)) == list(vars(original))  # field order kept
        assert copied is not original and vars(original) != vars(copied)


def test_value_field_names_every_value_field_in_order() -> None:
    """ValueField, the names a reader that builds values by name is typed against
    (exporter.sources.nvidia.scalars), is every value field of DeviceValues, in order."""
    from typing import get_args

    from exporter.core.fieldspec import value_specs
    from exporter.core.model import ValueField

    assert list(get_args(ValueField)) == [name for name, _ in value_specs(DeviceValues)]
