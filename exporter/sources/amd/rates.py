"""Rates and "was active" flags from AMD counters read across cycles (one card's state).

Shared by the sysfs backend (``gpu_metrics`` v1.4+ XGMI accumulators and throttler
residencies) and the amdsmi backend (``amdsmi_get_link_metrics`` read/write). A rate
needs two readings, so the first cycle after a card appears exports none.

A counter that goes back (driver reload, wrap, a different table) restarts the rate
from the new reading instead of producing a huge or negative spike, and a reading
whose timestamp did not move (the firmware table was not refreshed between two reads)
keeps the previous rate. Every rate is bounded by exporter.core.units.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

from exporter.core import units

K = TypeVar("K", bound=Hashable)


class AccumulatorRates(Generic[K]):
    """Per-key rate of change of monotonically increasing counters."""

    def __init__(self, unit: str = "bytes_per_second") -> None:
        self.unit = unit
        self._last: dict[K, tuple[float, float]] = {}  # key -> (seconds, counter)
        self._rate: dict[K, float] = {}

    @property
    def known(self) -> bool:
        """Whether a counter is remembered from an earlier update."""
        return bool(self._last)

    def update(self, now: float, counters: Mapping[K, float]) -> dict[K, float]:
        """Rates for the keys read now; keys no longer read are forgotten."""
        out: dict[K, float] = {}
        for key, value in counters.items():
            prev = self._last.get(key)
            if prev is not None and now <= prev[0]:
                if key in self._rate:  # same table as last time: nothing new to say
                    out[key] = self._rate[key]
                continue
            self._last[key] = (now, value)
            if prev is None or value < prev[1]:
                self._rate.pop(key, None)  # first reading, or the counter restarted
                continue
            rate = units.bounded((value - prev[1]) / (now - prev[0]), self.unit)
            if rate is None:
                self._rate.pop(key, None)
                continue
            self._rate[key] = out[key] = rate
        for gone in set(self._last) - set(counters):
            self._last.pop(gone, None)
            self._rate.pop(gone, None)
        return out


class ResidencyFlags:
    """Throttler residency accumulators -> which reasons held the clocks since last cycle."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def update(self, residency: Mapping[str, int], reasons: Mapping[str, str]) -> dict[str, bool]:
        """{reason: active}: a throttler is active if its accumulator grew. {} on the first
        reading (nothing to compare with) and for a counter that went back."""
        out: dict[str, bool] = {}
        for name, value in residency.items():
            prev = self._last.get(name)
            self._last[name] = value
            if prev is None or value < prev or name not in reasons:
                continue
            reason = reasons[name]
            out[reason] = out.get(reason, False) or value > prev
        return out
