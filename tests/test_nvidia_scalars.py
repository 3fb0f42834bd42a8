"""NVIDIA's plain scalars as rows (exporter.sources.nvidia.scalars): the names hold.

A row's field is typed (``ValueField``: mypy rejects a misspelt one); its getter is a
string named once, so it is held here to the installed nvidia-ml-py, as is every name of
``Nvml``, and to the fake written from it. What each row reads is asserted by the value
tests of tests/test_nvidia.py and the tiers by tests/test_cadence.py.
"""

from __future__ import annotations

import pynvml

from exporter.core.fieldspec import Cadence, value_specs
from exporter.core.model import DeviceValues
from exporter.sources.nvidia.calls import Nvml
from exporter.sources.nvidia.scalars import SCALARS, Tier
from tests.fakes.fake_nvml import FakeGPU, FakeNVML
from tests.test_nvidia import backend

SPECS = dict(value_specs(DeviceValues))
CADENCE = {Tier.STATIC: Cadence.STATIC, Tier.FAST: Cadence.FAST, Tier.SLOW: Cadence.SLOW,
           Tier.RARE: Cadence.SLOW}


def test_every_getter_is_a_function_of_nvidia_ml_py_and_of_the_fake() -> None:
    names = [row.getter for row in SCALARS] + [fn.value for fn in Nvml]
    assert [n for n in names if not callable(getattr(pynvml, n, None))] == []
    assert len(set(names)) == len(names)  # each function named once: a row or Nvml
    fake = FakeNVML([FakeGPU()])
    assert [row.getter for row in SCALARS
            if not callable(getattr(fake, row.getter, None))] == []


def test_each_field_has_one_row_at_the_tier_it_declares() -> None:
    fields = [row.field for row in SCALARS]
    assert len(set(fields)) == len(fields)
    assert {row.field: SPECS[row.field].cadence_of("nvidia") for row in SCALARS} == {
        row.field: CADENCE[row.tier] for row in SCALARS}


def test_a_zero_enforced_limit_is_none_and_a_zero_reading_is_zero() -> None:
    """A row with ``zero=False`` (the enforced power limit: 0 is what a card without one
    answers) drops a 0; any other row serves it (0 W default limit, 0 sessions)."""
    d = backend(FakeNVML([FakeGPU(power_limit_mw=0, power_default_limit_mw=0)])).sample(
        slow=True).devices[0]
    assert (d.power_limit_watts, d.power_limit_default_watts, d.encoder_sessions) == (
        None, 0.0, 0)
