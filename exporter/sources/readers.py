"""Whether anyone read the served values since a reading was last taken.

Some readings are counters or rates that only a reader of the metrics sees: no health
verdict, live-page chart or energy split uses them (NVIDIA's NVLink throughput and
error counters, GPM profiling ratios, PCIe throughput, clock-event times). A rate needs
two reads, not a fixed cadence: read when due and only if a scrape, a ``/snapshot`` or
a push came since the last read, the rate is the average over the time between the
two reads, and a daemon nobody scrapes does not pay for them at all. The first read
of each is always taken (at open and on the first slow cycle), so a first scrape finds
them.

The renderer marks every ``/metrics`` request and the server every ``/snapshot``
(``Readers.read``); with an OTLP push every reading is wanted (``always``), and so it is
for a backend built without one (tests, the ``snapshot`` command).
"""

from __future__ import annotations


class Readers:
    """How many times the served values were read; shared by the backends (Shared)."""

    def __init__(self, always: bool = False) -> None:
        self.always = always  # every reading is wanted: pushed, or no server counts reads
        self.count = 0  # reads so far (an int bumped under the GIL: no lock needed)

    def read(self) -> None:
        """Someone read the served values (a scrape, /snapshot)."""
        self.count += 1


ALWAYS = Readers(always=True)


class Wanted:
    """One reading's gate: ``due()`` is True the first time, and then only when a reader
    came since the last time it was True (each reading keeps its own mark)."""

    def __init__(self, readers: Readers = ALWAYS) -> None:
        self.readers = readers
        self._seen: int | None = None  # the read count at the last reading; None: never read

    def due(self) -> bool:
        """Take the reading now? (Call it only on a cycle where the reading's tier is due.)"""
        count = self.readers.count
        if self.readers.always or self._seen != count:
            self._seen = count
            return True
        return False

    def reset(self) -> None:
        """Read it on the next due cycle whatever the readers (after a loss or a reopen)."""
        self._seen = None
