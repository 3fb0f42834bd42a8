"""The contract every backend keeps, the errors it may raise, and its optional hooks.

A backend owns ONE persistent handle to its library or kernel interface.
``open()`` acquires it and returns the GPUs it can see; ``sample()`` reads them;
``close()`` lets it go. The collector calls these from the backend's own thread
only, so a backend needs no locking of its own.

A backend may also declare hooks (the protocols below), by having their members:
``retry_interval`` (a cheap open(): the back-off grows no longer than that),
``attribution()`` (pod attribution applied after the merge), ``joins()`` (join series
such as pod labels and Slurm jobs), ``child_restarts``
(a supervised child process) and ``feature_unavailable()`` (a sub-feature with a
switch of its own, such as NVIDIA's ``gpm``). The collector reads a hook on the backend's thread,
right after ``sample()``; a backend without it is simply not asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

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


@dataclass(frozen=True)
class Cycle:
    """What one ``sample()`` call returns."""

    devices: Sequence[DeviceSample]
    # reason -> values/processes dropped in this cycle ("parse", "permission", "gpu_lost", ...)
    errors: Mapping[ErrorReason, int] = field(default_factory=dict)


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


# -- optional hooks -----------------------------------------------------------------------
@runtime_checkable
class RetriesOpen(Protocol):
    """open() is cheap (a listdir, a socket check): after it fails, the collector retries
    it on its back-off grown no longer than ``retry_interval`` seconds, so a card bound
    later or a restarted kubelet is picked up within that (a card added also wakes it
    at once: Hub.reprobe)."""

    @property
    def retry_interval(self) -> float: ...


@runtime_checkable
class Attributes(Protocol):
    """Attribution of devices and processes to what they belong to (the kubernetes
    backend): the collector applies the newest one after the merge."""

    def attribution(self) -> Enricher | None:
        """The attribution of the last sample(), None when there is none."""
        ...


@runtime_checkable
class Joins(Protocol):
    """Serves join series (pod labels, Slurm jobs; exporter.core.joins) beside the devices:
    the collector keeps the newest source while the backend is serving."""

    def joins(self) -> JoinSource | None:
        """The join rows of the last sample(), None when there are none."""
        ...


@runtime_checkable
class SupervisesChild(Protocol):
    """The backend runs a child process (macmon): ``child_restarts`` counts the children
    it has replaced since it was created (``gpu_exporter_child_restarts_total``)."""

    @property
    def child_restarts(self) -> int: ...


@runtime_checkable
class ServesFeatures(Protocol):
    """Serves sub-features that have a switch of their own (``gpm`` of ``nvidia``): asked,
    after open(), by the start-up check of a sub-feature the operator forced on."""

    def feature_unavailable(self, feature: str) -> str | None:
        """Why this opened backend cannot serve ``feature``, or None when it can."""
        ...
