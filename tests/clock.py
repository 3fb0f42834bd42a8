"""A stepped clock for the Hub (exporter.pipeline.hub.Clock): virtual monotonic time that
moves only when the test steps it, so cadence, back-off and staleness are tested without
sleeping and without timing slack."""

from __future__ import annotations

import threading

from exporter.pipeline.hub import Clock

REAL_TIMEOUT = 10.0  # seconds of real time a step waits for the Hub's threads


class SteppedClock(Clock):
    """Each wait of a Hub thread blocks until virtual time reaches its deadline (or the
    Hub stops). ``run_until`` moves time from deadline to deadline, each time once every
    thread of the Hub is waiting again, so each thread sees the times it would see."""

    def __init__(self, start: float = 1000.0) -> None:
        self.t = start
        self._cond = threading.Condition()
        self._deadlines: dict[int, float] = {}  # waiting thread -> its deadline

    def now(self) -> float:
        with self._cond:
            return self.t

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        me = threading.get_ident()
        with self._cond:
            deadline = self.t + max(seconds, 0.0)
            self._deadlines[me] = deadline
            self._cond.notify_all()
            while self.t < deadline and not stop.is_set():
                self._cond.wait(0.02)  # stop is an Event of its own: look at it often
            del self._deadlines[me]
            self._cond.notify_all()
            return stop.is_set()

    def run_until(self, end: float, threads: int) -> None:
        """Step virtual time to ``end``; ``threads``: how many Hub threads wait on this
        clock (one per backend, and the watchdog once started)."""
        with self._cond:
            while True:
                if not self._cond.wait_for(lambda: len(self._deadlines) >= threads,
                                           REAL_TIMEOUT):
                    raise AssertionError(f"{len(self._deadlines)} of {threads} threads wait")
                step = min(self._deadlines.values())
                if step > end:
                    self.t = end
                    self._cond.notify_all()
                    return
                self.t = max(self.t, step)
                self._cond.notify_all()
                # the threads due now leave their wait before the next step
                if not self._cond.wait_for(
                        lambda: all(d > self.t for d in self._deadlines.values()),
                        REAL_TIMEOUT):
                    raise AssertionError("a thread due did not wake")
