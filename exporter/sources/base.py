"""The contract every backend keeps, the errors it may raise, and what it hands over.

A backend owns ONE persistent handle to its library or kernel interface.
``open()`` acquires it and returns the GPUs it can see; ``sample()`` reads them;
``close()`` lets it go. The collector calls these from the backend's own thread
only, so a backend needs no locking of its own.

Everything else a backend says is data, never a method the collector looks for: its
``capabilities`` (a cheap open() retried at its own pace, the sub-features it serves,
such as NVIDIA's ``gpm``) and, in each ``Cycle`` it returns, beside the devices and
error counts, what that cycle hands over to the merge (pod attribution, join series
such as pod labels and Slurm jobs, the restarts of a supervised child process).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from exporter.core.joins import JoinSource
from exporter.core.labels import ErrorReason
from exporter.core.model import Allocation, DeviceInfo, DeviceSample, PodRef

# Source priority for the collector's merge (one device, one series): when several
# backends report the same device key, each value comes from the backend with the
# lowest number that has it. A new backend only declares which of these it is.
LIBRARY = 0  # a vendor library (NVML, Level Zero, amdsmi, macmon)
KERNEL = 10  # kernel files read directly (amdgpu / i915 / xe sysfs and hwmon)
DERIVED = 20  # sums and estimates (per-process fdinfo summed per device)

# Seconds between open attempts after a failure (the collector's back-off); a backend
# that restarts something of its own (macmon's child) backs off the same way.
REOPEN_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class BackendUnavailable(Exception):
    """The library, driver or device is absent: not an error, the backend is just off.

    The message is the reason shown in logs (once), ``/snapshot`` and the landing page.
    """


class BackendFailed(Exception):
    """The handle went bad (driver reloaded, GPU lost from under NVML, ...).

    The collector closes the backend and reopens it with back-off.
    """


class Enricher(Protocol):
    """Labels the merged devices and processes with what they belong to (Kubernetes).

    Called by the collector when it builds the merged view, so it must answer from
    what it already holds (maps refreshed on its backend's own tier): no socket,
    no network on this path.
    """

    def allocations(self, info: DeviceInfo) -> Sequence[Allocation]:
        """The containers the kubelet allocated this device to (empty when none)."""
        ...

    def pod_of(self, pid: int) -> PodRef | None:
        """The container a process runs in, or None for a host process / unknown."""
        ...


@dataclass(frozen=True)
class Cycle:
    """What one ``sample()`` call returns: the devices, the cycle's error counts, and
    what the backend hands over beside them (None: it has none; the collector keeps
    each one of the backend's last cycle)."""

    devices: Sequence[DeviceSample]
    # reason -> values/processes dropped in this cycle ("parse", "permission", "gpu_lost", ...)
    errors: Mapping[ErrorReason, int] = field(default_factory=dict)
    # Attribution of devices and processes to what they belong to (the kubernetes
    # backend): the collector applies the newest one after the merge.
    enricher: Enricher | None = None
    # Join series served beside the devices (pod labels, Slurm jobs; exporter.core.joins).
    joins: JoinSource | None = None
    # The child processes a backend that runs one (macmon) has replaced since it was
    # created (gpu_exporter_child_restarts_total).
    child_restarts: int | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers the collector beyond open/sample/close, as data."""

    # open() is cheap (a listdir, a socket check): after it fails, the collector's
    # back-off grows no longer than ``retry_interval`` seconds, so a card bound later or
    # a restarted kubelet is picked up within that (a card added wakes it at once:
    # Hub.reprobe). None: the back-off alone.
    retry_interval: float | None = None
    # The sub-features with a switch of their own that it serves (``gpm`` of ``nvidia``),
    # each with why this opened backend cannot serve it, None when it can: read, after
    # open(), by the start-up check of a sub-feature the operator forced on.
    features: Mapping[str, str | None] = field(default_factory=lambda: MappingProxyType({}))


PLAIN = Capabilities()  # a backend that offers nothing more


class Backend(Protocol):
    name: str  # "nvidia", "amd", "intel", "fdinfo", ...: the `backend` label
    # The `source` label its samples carry ("nvml", "sysfs", ...): also the one of the
    # gpu_up 0 series the collector reports for the GPUs open() returned, should the
    # backend go stale before its first sample.
    source: str
    # Seconds between samples; None means the fast tier (--collector.interval).
    interval: float | None
    # LIBRARY, KERNEL or DERIVED: which backend's value wins when two report one device.
    priority: int

    @property
    def capabilities(self) -> Capabilities:
        """Read by the collector when it needs it (after a failed open(); the forced-on
        check after open()), so it may change with what the backend found."""
        ...

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
