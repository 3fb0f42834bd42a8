"""Which energy counter a device exports when it has several, and power from its deltas.

Owns one rule shared by the Intel sysfs backend (hwmon ``card`` / ``pkg`` / unlabelled
``energy1`` channels) and the Level Zero backend (one counter per power domain):

- The counter is chosen once, in the caller's order of preference, among the channels
  that exist. A channel that reads 0 is not chosen: energy since driver load is never 0
  on a running card, so 0 means "not filled" (Battlemage on xe 6.16 leaves ``card`` at
  0 while ``pkg`` counts; amdgpu's SMU13 accumulator does the same). A preferred channel
  that cannot be read is waited for during ``STUCK_CYCLES`` cycles before the next one
  is taken: a transient read error must not move the choice for the life of the process,
  and one that never reads (``sensors`` shows B580's ``card`` as N/A) must not hide the
  others forever.
- Never splice two counters into one series: once chosen, the channel stays. If it
  stops moving for ``STUCK_CYCLES`` cycles in a row while another channel moves, it is
  not a live counter after all; the device's energy and power are withdrawn (no series)
  rather than switched to the other channel, which would fake a jump.
- Power is the average over the interval between two readings of the chosen counter;
  none on the first reading, when no time passed, or when the counter went back
  (driver reload, wrap): one missing point beats a wrong spike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog

log = structlog.get_logger(__name__)

STUCK_CYCLES = 3


def power_from_energy(
    previous: tuple[float, float] | None, current: tuple[float, float]
) -> float | None:
    """Average watts between two ``(joules, seconds)`` readings of one counter."""
    if previous is None:
        return None
    d_joules = current[0] - previous[0]
    d_seconds = current[1] - previous[1]
    if d_seconds <= 0 or d_joules < 0:
        return None
    return d_joules / d_seconds


class EnergyCounter:
    """The energy counter of one device and the power derived from it (see module doc)."""

    def __init__(self, device: str) -> None:
        self.device = device  # for the one log line when the chosen counter is stuck
        self.chosen: str | None = None
        self.stuck = False
        self._last: dict[str, float] = {}
        self._still = 0  # cycles in a row the chosen counter stood while another moved
        self._previous: tuple[float, float] | None = None  # chosen (joules, seconds)
        self._waited = 0  # cycles spent waiting for an unreadable preferred channel

    def update(
        self, channels: Sequence[str], readings: Mapping[str, float | None],
        seconds: float | Mapping[str, float],
    ) -> tuple[float | None, float | None]:
        """``channels``: the ones that exist, preferred first; ``readings``: this cycle's
        values in J (None or absent: not readable now); ``seconds``: when they were read
        (one clock, or each counter's own timestamp). Returns (joules, watts)."""
        if self.stuck:
            return None, None
        if self.chosen is None:
            self.chosen = _choose(channels, readings, skip_unreadable=self._waited >= STUCK_CYCLES)
            self._waited += 1
        chosen = self.chosen
        joules = readings.get(chosen) if chosen is not None else None
        moved = {k: v != self._last[k] for k, v in readings.items()
                 if v is not None and k in self._last}
        self._last.update({k: v for k, v in readings.items() if v is not None})
        if chosen is None or joules is None:
            return None, None
        if moved.get(chosen) is False and any(m for k, m in moved.items() if k != chosen):
            self._still += 1
            if self._still >= STUCK_CYCLES:
                self.stuck = True
                log.warning("energy counter stuck while another moves; energy withdrawn",
                            device=self.device, channel=chosen)
                return None, None
        elif chosen in moved:
            self._still = 0
        at = seconds if isinstance(seconds, (int, float)) else seconds.get(chosen)
        if at is None:
            return joules, None
        watts = power_from_energy(self._previous, (joules, at))
        self._previous = (joules, at)
        return joules, watts


def _choose(channels: Sequence[str], readings: Mapping[str, float | None],
            skip_unreadable: bool) -> str | None:
    for channel in channels:
        value = readings.get(channel)
        if value is None:
            if skip_unreadable:
                continue
            return None  # preferred but unreadable this cycle: wait for it
        if value > 0:
            return channel
    return None
