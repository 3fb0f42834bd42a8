"""The history's clocks (exporter.serve.history): a wall clock stepped back (NTP, a bad RTC)
while the GPU's load changes, with the wall and monotonic clocks injected and stepped."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence

import pytest

from exporter.core.config import Config
from exporter.core.model import DeviceSample
from exporter.pipeline.hub import Hub
from exporter.serve import history as history_module
from exporter.serve.history import History
from exporter.sources.base import Cycle
from tests.test_collector import Scripted, info


class Busy(Scripted):
    """The Scripted backend with a utilisation the test sets."""

    def __init__(self, name: str, buses: Sequence[str]) -> None:
        super().__init__(name, buses)
        self.utilization = 0.2

    def sample(self, slow: bool) -> Cycle:
        return Cycle([DeviceSample(info=info(b), source=self.name, up=True,
                                   utilization_ratio=self.utilization) for b in self.buses])


class Clocks:
    """Stands in for the ``time`` module that exporter.serve.history reads: a wall clock the
    test can step back and a monotonic clock that only goes forward."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_700_000_000.0, 5_000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def tick(self, seconds: float = 1.0, wall_step: float = 0.0) -> None:
        self.mono += seconds
        self.wall += seconds + wall_step


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    fake = Clocks()
    monkeypatch.setattr(history_module, "time", fake)
    return fake


def _wire(history: History, since: float = 0.0) -> dict[str, object]:
    return json.loads(json.dumps(history.as_json(since)))  # as /api/v1/history sends it


def test_a_wall_clock_stepped_back_freezes_nothing(clocks: Clocks) -> None:
    backend = Busy("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    history = History(window=900.0, interval=1.0)
    history.add(hub.collect_once())
    clocks.tick()
    history.add(hub.collect_once())
    first = _wire(history)
    (gpu,) = first["gpus"]  # type: ignore[misc]
    since = gpu["t"][-1]  # what the page and `top` ask with next
    assert gpu["t"] == [1_700_000_000.0, 1_700_000_001.0] and gpu["utilization"] == [20, 20]

    clocks.tick(wall_step=-600.0)  # NTP steps the clock back 10 minutes ...
    backend.utilization = 0.85  # ... as the GPU gets busy
    history.add(hub.collect_once())
    for _ in range(3):
        clocks.tick()
        history.add(hub.collect_once())
    reply = _wire(history, since)
    (device,) = reply["devices"]  # type: ignore[misc]
    assert device["utilization"] == 0.85  # the current values: not the 20 % of before
    (gpu,) = reply["gpus"]  # type: ignore[misc]
    # Every interval recorded, after the client's ``since``, labels never going back:
    # the last label plus half the monotonic time while the wall clock reads earlier.
    assert gpu["t"] == [since + 0.5, since + 1.0, since + 1.5, since + 2.0]
    assert gpu["utilization"] == [85, 85, 85, 85]
    assert reply["now"] == since + 2.0
    # 598 s behind the last label: caught up after twice that, labels the wall clock again.
    clocks.tick(seconds=1195.0)
    history.add(hub.collect_once())
    assert clocks.wall == since + 599.0
    assert _wire(history, since + 2)["gpus"][0]["t"] == [since + 599.5]  # type: ignore[index]
    clocks.tick(seconds=2.0)
    history.add(hub.collect_once())
    assert _wire(history, since + 600)["gpus"][0]["t"] == [clocks.wall]  # type: ignore[index]


def test_the_page_draws_its_charts_against_the_labels_clock(clocks: Clocks) -> None:
    """The page drew its server-side charts against ``time.time()``: after a step back
    every sample labelled since lay right of "now", off the chart."""
    from exporter.serve.landing import page

    backend = Busy("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    history = History(window=900.0, interval=1.0)
    for _ in range(3):
        history.add(hub.collect_once())
        clocks.tick()
    clocks.tick(wall_step=-600.0)
    snapshot = hub.collect_once()
    history.add(snapshot)
    assert clocks.wall < history.now() == _wire(history)["now"]
    html = page(snapshot, history, "/metrics")
    assert f'data-rendered="{history.now():.3f}"' in html
    utilization = re.compile(r'data-points="(\d+)"><title>Utili[sz]ation')
    assert int(utilization.findall(html)[0]) >= 2  # 4 samples in 3.5 s: 2+ pixel columns
    then = page(snapshot, history, "/metrics", now=clocks.wall)  # as it drew before
    assert utilization.findall(then) == ["1"]  # all right of "now": one point at the edge


def test_a_wall_clock_stepped_forward_is_followed_and_throttles_nothing(
        clocks: Clocks) -> None:
    backend = Busy("amd", ["0000:03:00.0"])
    hub = Hub(Config(), [backend])
    history = History(window=60.0, interval=1.0)
    history.add(hub.collect_once())
    clocks.tick(seconds=0.5, wall_step=3600.0)  # an hour forward within one interval
    history.add(hub.collect_once())  # not a new interval on the monotonic clock
    assert len(_wire(history)["gpus"][0]["t"]) == 1  # type: ignore[index]
    clocks.tick(seconds=0.5)
    history.add(hub.collect_once())
    assert _wire(history)["gpus"][0]["t"] == [  # type: ignore[index]
        1_700_000_000.0, 1_700_003_601.0]
    # A GPU is forgotten after a window of the monotonic clock, not of the wall clock.
    backend.buses = []
    for _ in range(59):
        clocks.tick(wall_step=-100.0)
        history.add(hub.collect_once())
    assert [g["gpu"] for g in _wire(history)["gpus"]] == ["0"]  # type: ignore[union-attr]
    clocks.tick(seconds=2.0)
    history.add(hub.collect_once())
    assert _wire(history)["gpus"] == []


def test_the_real_clocks_label_samples_with_wall_time() -> None:
    history = History(window=60.0, interval=1.0)
    history.add(Hub(Config(), [Busy("amd", ["0000:03:00.0"])]).collect_once())
    (t,) = _wire(history)["gpus"][0]["t"]  # type: ignore[index]
    assert abs(t - time.time()) < 5
