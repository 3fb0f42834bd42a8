"""The contract every backend keeps, and the errors it may raise.

A backend owns ONE persistent handle to its library or kernel interface.
``open()`` acquires it and returns the GPUs it can see; ``sample()`` reads them;
``close()`` lets it go. The collector calls these from the backend's own thread
only, so a backend needs no locking of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from exporter.model import DeviceInfo, DeviceSample


class BackendUnavailable(Exception):
    """The library, driver or device is absent: not an error, the backend is just off.

    The message is the reason shown in logs (once), ``/snapshot`` and the landing page.
    """


class BackendFailed(Exception):
    """The handle went bad (driver reloaded, GPU lost from under NVML, ...).

    The collector closes the backend and reopens it with back-off.
    """


@dataclass(frozen=True)
class Cycle:
    """What one ``sample()`` call returns."""

    devices: Sequence[DeviceSample]
    # reason -> values/processes dropped in this cycle ("parse", "permission", "gpu_lost", ...)
    errors: Mapping[str, int] = field(default_factory=dict)


class Backend(Protocol):
    name: str  # "nvidia", "amd", "intel", "processes": the `backend` label
    # Seconds between samples; None means the fast tier (--collector.interval).
    interval: float | None

    def open(self) -> Sequence[DeviceInfo]:
        """Acquire the persistent handle. Raises BackendUnavailable(reason)."""
        ...

    def sample(self, slow: bool) -> Cycle:
        """One collection. ``slow`` is True when the slow tier is due (expensive calls);
        otherwise the backend reuses its last slow values. Raises BackendFailed when the
        handle is unusable; anything per device or per value is caught inside and counted.
        """
        ...

    def close(self) -> None: ...
