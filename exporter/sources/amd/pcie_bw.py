"""PCIe throughput of amdgpu cards from ``pcie_bw``, read on a thread of its own.

A read of ``pcie_bw`` does not return at once: the driver starts its PCIe performance
counters, sleeps one second and prints what they counted ({si,cik,vi,soc15}_get_pcie_usage;
the format is exporter.sources.kernel.amdgpu.parse_pcie_bw's). Read in the backend's cycle it
would hold every other value of every card for a second per card, and a host with three
cards would look stale (three fast intervals). So the backend asks for a read on the
slow tier (``request``) and this reader's thread reads the cards one after the other;
each card serves the throughput of the last read that completed (``rates``): the
counters' one-second window, at most one slow interval old, from the second slow
cycle on. A card whose read fails (APUs answer ENODATA, ASICs without the counters an
error) is not asked again until it is requested anew after a hotplug; a read that
is not three numbers counts ``parse``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from exporter.core.fs import clean_text, read_bytes
from exporter.core.labels import Direction, ErrorReason
from exporter.sources.kernel.amdgpu import parse_pcie_bw

FILE = "pcie_bw"
_NO_ERRORS: Mapping[ErrorReason, int] = MappingProxyType({})


class PcieBwReader:
    """Reads the ``pcie_bw`` of the requested device directories, in the background."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: tuple[str, ...] = ()
        self._rates: dict[str, dict[str, float]] = {}  # device dir -> direction -> B/s
        self._failed: set[str] = set()  # reads that failed: not asked again
        self._errors: Counter[ErrorReason] = Counter()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self._thread: threading.Thread | None = None

    def request(self, device_dirs: Sequence[str]) -> None:
        """Read these cards' ``pcie_bw`` once more (the slow tier); returns at once."""
        with self._lock:
            self._wanted = tuple(d for d in device_dirs if d not in self._failed)
            for gone in set(self._rates) - set(device_dirs):
                del self._rates[gone]
            if not self._wanted or self._stop:
                return
            self._idle.clear()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="amd-pcie-bw",
                                                daemon=True)
                self._thread.start()
        self._wake.set()

    def rates(self, device_dir: str) -> dict[str, float]:
        """The card's last throughput, by direction (empty before its first read)."""
        with self._lock:
            return dict(self._rates.get(device_dir, {}))

    def take_errors(self) -> Mapping[ErrorReason, int]:
        """What the reads counted since the last call (the backend's cycle errors)."""
        if not self._errors:  # nothing counted (the usual cycle): no lock, no new Counter
            return _NO_ERRORS
        with self._lock:
            errors, self._errors = self._errors, Counter()
            return errors

    def forget(self, device_dir: str) -> None:
        """A card that went (or came back): its state goes, its file is tried again."""
        with self._lock:
            self._rates.pop(device_dir, None)
            self._failed.discard(device_dir)

    def close(self) -> None:
        with self._lock:
            self._stop = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                if self._stop:
                    return
                wanted = self._wanted
            for device_dir in wanted:
                raw = read_bytes(f"{device_dir}/{FILE}", 4096)  # blocks ~1 s in the driver
                text = None if raw is None else clean_text(raw)
                rates = None if text is None else parse_pcie_bw(text)
                with self._lock:
                    if text is None:  # an error, or nothing: not exposed on this card
                        self._failed.add(device_dir)
                    elif rates is None:
                        self._errors[ErrorReason.PARSE] += 1
                    else:
                        self._rates[device_dir] = {Direction.RX: rates[0],
                                                   Direction.TX: rates[1]}
            with self._lock:
                if not self._wake.is_set():
                    self._idle.set()
