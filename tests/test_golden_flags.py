"""The golden /metrics of the families only flags bring: the config reload gauges
(``--config.file``) and the OTLP push counter (``--otlp.endpoint``).

The daemon runs on one small fixture machine as tests/test_golden.py runs every machine
(one collection, intervals of an hour), with a config file written here and pushing to a
real OTLP/HTTP receiver on 127.0.0.1 (tests/test_otlp.py's). Its /metrics, through
test_golden.normalize (which zeroes the reload timestamp and the push counts: they depend
on timing), is compared with ``tests/golden/flags.prom``. Those values are asserted on their
own below, against the test's clock and the receiver.

Regenerate after an intended change:
``UPDATE_GOLDEN=1 python -m pytest tests/test_golden_flags.py``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

from exporter.output.render.selfmetrics import OTLP, RELOAD_OK, RELOAD_TIME
from tests.daemon import FIXTURES, machine_args, promtool_check, running, values_of
from tests.test_golden import GOLDEN, ONE_CYCLE, normalize
from tests.test_otlp import exports_in, otlp_exports, receiving, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.golden]  # UPDATE_GOLDEN=1 pytest -m golden
MACHINE = "intel-xe-tigerlake"  # a test_golden machine with one of the smallest goldens
FLAGS_GOLDEN = GOLDEN / "flags.prom"
# What the two flags add to the machine's plain golden (tests/golden/<MACHINE>.prom).
FLAG_FAMILIES = (RELOAD_OK.name, RELOAD_TIME.name, OTLP.name)


@dataclass(frozen=True)
class Flagged:
    text: str  # the daemon's /metrics
    started: float  # wall clock before the daemon started
    ended: float  # wall clock after the scrape
    pushes: int  # OTLP requests the receiver had decoded after the scrape


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Flagged:
    tmp = tmp_path_factory.mktemp("flags")
    config = tmp / "config.yml"
    config.write_text("log.level: info\nmax-processes-per-gpu: 64\n")
    started = time.time()
    with receiving() as receiver, running(
            [*machine_args(FIXTURES / MACHINE), *ONE_CYCLE, "--config.file", str(config),
             "--otlp.endpoint", receiver.url, "--otlp.interval", "200ms"], tmp) as daemon:
        receiver.wait(1)
        # The counter moves once the receiver's answer is back, just after its request.
        wait_for(lambda: otlp_exports(daemon).get("sent", 0) >= 1)
        text = daemon.get().text
        pushes = len(receiver.requests)
    return Flagged(text, started, time.time(), pushes)


def test_golden_with_flags(flagged: Flagged) -> None:
    got = normalize(flagged.text)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        FLAGS_GOLDEN.write_text(got)
    assert FLAGS_GOLDEN.exists(), "no flags golden: run with UPDATE_GOLDEN=1"
    assert got == FLAGS_GOLDEN.read_text(), f"/metrics with flags differs from {FLAGS_GOLDEN}"


def test_promtool_lints_it(flagged: Flagged) -> None:
    result = promtool_check(flagged.text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_config_file_loaded_while_the_test_ran(flagged: Flagged) -> None:
    assert values_of(flagged.text, RELOAD_OK.name) == [1]
    (loaded,) = values_of(flagged.text, RELOAD_TIME.name)
    assert flagged.started <= loaded <= flagged.ended


def test_pushes_the_receiver_got_are_counted_sent(flagged: Flagged) -> None:
    exports = exports_in(flagged.text)
    assert set(exports) == {"sent", "failed", "dropped"}
    # Each counted push reached the receiver first; the receiver answered every one 200.
    assert 1 <= exports["sent"] <= flagged.pushes
    assert exports["failed"] == 0


def test_the_flags_add_their_families_and_change_nothing_else(flagged: Flagged) -> None:
    """The flags golden is the machine's plain golden plus the flag families' lines and the
    push thread's CPU time (``backend="otlp"``, a documented series of a family already
    there): the same collection, so every other line is the same."""
    plain = (GOLDEN / f"{MACHINE}.prom").read_text().splitlines()
    flags = normalize(flagged.text).splitlines()
    added = [line for line in flags if line not in plain]
    assert [line for line in plain if line not in flags] == []
    assert added and all(any(f in line for f in FLAG_FAMILIES) or 'backend="otlp"' in line
                         for line in added), added
    for family in FLAG_FAMILIES:
        assert f"# TYPE {family.removesuffix('_total')}" in "\n".join(added), family
