"""What an XID means: the catalogue table, ``gpu_xid_info``, the health reasons.

The expected words are NVIDIA's catalogue descriptions (docs.nvidia.com/deploy/xid-errors,
"Analyzing Xid Errors with the Xid Catalog": 79 "GPU has fallen off the bus", 48 "Double
Bit ECC Error", 13 "Graphics Engine Exception", 74 "NVLINK Error"), written here by hand.
"""

from __future__ import annotations

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.core.xid import CATALOGUE, meaning
from exporter.pipeline.health import evaluate
from exporter.sources.nvidia.backend import NvidiaBackend
from tests.fakes.fake_nvml import FakeGPU, FakeNVML

NOT_LISTED = 9999  # no such code in the catalogue (codes end in the 160s today)


def nvidia(gpu: FakeGPU) -> DeviceSample:
    b = NvidiaBackend(Config(procfs="/nonexistent"), nvml=FakeNVML([gpu]))
    b.open()
    return b.sample(slow=True).devices[0]


@pytest.mark.parametrize(("code", "words"), [
    (79, "GPU has fallen off the bus"), (48, "double-bit ECC error"),
    (13, "graphics engine exception"), (74, "NVLink error"), (NOT_LISTED, "unknown"),
])
def test_meaning_of_a_code(code: int, words: str) -> None:
    assert meaning(code) == words


def test_the_table_is_short_and_has_no_code_zero() -> None:
    assert 0 not in CATALOGUE  # the exporter's always-0 marker is no XID
    assert all(1 <= code <= 200 and 0 < len(text) <= 70 for code, text in CATALOGUE.items())


def test_every_counted_code_gets_an_info_series_with_its_meaning() -> None:
    d = nvidia(FakeGPU(xids=[79, 13, 13, NOT_LISTED]))
    assert d.xid_errors == {0: 0, 79: 1, 13: 2, NOT_LISTED: 1}
    assert dict(d.xid_info) == {(79, "GPU has fallen off the bus"): True,
                                (13, "graphics engine exception"): True,
                                (NOT_LISTED, "unknown"): True}


def test_a_gpu_without_xids_has_the_marker_but_no_info_series() -> None:
    d = nvidia(FakeGPU())
    assert d.xid_errors == {0: 0} and dict(d.xid_info) == {}


def test_health_reasons_say_what_the_code_means() -> None:
    d = nvidia(FakeGPU(xids=[79, 13, NOT_LISTED]))
    v = evaluate(d, max(d.xid_seen_seconds.values()))
    reasons = {r["reason"] for r in v.as_dict()["reasons"]}  # what /snapshot, / and top show
    assert reasons == {"XID 79: GPU has fallen off the bus", f"XID {NOT_LISTED}: unknown"}
