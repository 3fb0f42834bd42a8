"""The backend table: every collector an operator can switch, in one place.

Each row names a collector (``--collector.<key>`` / ``--no-collector.<key>``), its
default (on, off, or auto), its help, the platforms it runs on, and either the
factory of its backend or, for a sub-feature such as ``gpm``, the backend it belongs
to (which says whether it can serve it: its ``capabilities``, exporter.sources.base).
From this table come the switches and their help (exporter.app.flags), ``build_backends``
and the forced-on check (``forced_but_unavailable``); a new backend is one row here.

``build_backends`` returns every backend the Config does not switch off. A backend
whose library or driver is missing is still returned: its ``open()`` raises
BackendUnavailable and it reports ``gpu_exporter_backend_up 0`` with the reason.
The exceptions are optional sources that a machine either has or not (amdsmi, the
kubelet socket, macmon off macOS): their row has a ``present`` test, and without
it there is no backend at all, so a machine without them keeps its series shapes,
unless the switch forces them on. Off their platforms, backends are replaced by one
stand-in that says so.

This module imports no backend: a row's factory imports its package when called, so
the running configuration loads only what it uses.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from exporter.core.config import ALIASES
from exporter.sources.base import (
    Backend,
    BackendFailed,
    BackendUnavailable,
    Cycle,
)
from exporter.sources.readers import Readers

if TYPE_CHECKING:
    from exporter.core.config import Config
    from exporter.sources.discovery import DrmDiscovery

__all__ = ["Backend", "BackendFailed", "BackendUnavailable", "Cycle", "COLLECTORS", "TABLE",
           "ALIASES", "build_backends", "forced_but_unavailable", "switch"]


class Shared:
    """What several backends share: one DRM discovery for every backend that asks which
    cards are bound, made on first use (the Daemon stops it), and the count of reads of
    the served values (exporter.sources.readers)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._discovery: DrmDiscovery | None = None
        # Who read the served values since a backend's last reading of one only a reader
        # sees: the renderer and the server mark it; an OTLP push wants every reading.
        self.readers = Readers(always=config.otlp_endpoint is not None)

    @property
    def discovery(self) -> DrmDiscovery:
        if self._discovery is None:
            from exporter.core.fs import SysFS
            from exporter.sources.discovery import DrmDiscovery

            self._discovery = DrmDiscovery(SysFS(self.config.sysfs),
                                           hotplug=self.config.sysfs == "/sys")
        return self._discovery

    def on_card_added(self, callback: Callable[[], None]) -> None:
        """``callback`` runs when a DRM card appears (the Hub's ``reprobe``: its
        backends that could not open look again at once); nothing where no backend
        asked for the discovery."""
        if self._discovery is not None:
            self._discovery.on_card_added(callback)

    def stop(self) -> None:
        if self._discovery is not None:
            self._discovery.stop()


@dataclass(frozen=True)
class Row:
    key: str  # the switch name; also the backend's name with "-" for "_"
    help: str
    default: bool | None  # None: auto
    factory: Callable[[Config, Shared], Backend] | None = None  # None: a sub-feature
    platforms: tuple[str, ...] = ()  # sys.platform prefixes it runs on; () = any
    # Auto only where this holds at start (an optional package, a socket); None: always.
    present: Callable[[Config], bool] | None = None
    auto: str = ""  # what auto means for it, in --help: ", when ..."
    forced: str = ""  # appended to the forced-on error: what to set instead
    parent: str | None = None  # a sub-feature: the row of the backend that serves it


def _nvidia(config: Config, shared: Shared) -> Backend:
    from exporter.sources.nvidia.backend import NvidiaBackend

    return NvidiaBackend(config, readers=shared.readers)


def _amd(config: Config, shared: Shared) -> Backend:
    from exporter.sources.amd.backend import AmdBackend

    return AmdBackend(config, shared.discovery)


def _intel(config: Config, shared: Shared) -> Backend:
    from exporter.sources.intel.backend import IntelBackend

    return IntelBackend(config, shared.discovery)


def _fdinfo(config: Config, shared: Shared) -> Backend:
    from exporter.sources.fdinfo.backend import FdinfoBackend

    return FdinfoBackend(config, shared.discovery)


def _pmu(config: Config, shared: Shared) -> Backend:
    from exporter.sources.intel.pmu import PmuBackend

    return PmuBackend(config, shared.discovery)


def _level_zero(config: Config, shared: Shared) -> Backend:
    from exporter.sources.intel.level_zero import LevelZeroBackend

    return LevelZeroBackend(config)


def _amdsmi(config: Config, shared: Shared) -> Backend:
    from exporter.sources.amd.amdsmi import AmdSmiBackend

    return AmdSmiBackend(config)


def _apple(config: Config, shared: Shared) -> Backend:
    from exporter.sources.apple.backend import AppleBackend

    return AppleBackend(config)


def _kubernetes(config: Config, shared: Shared) -> Backend:
    from exporter.attribution.kubernetes.backend import KubernetesBackend

    return KubernetesBackend(config)


LINUX = ("linux",)  # sysfs, pyudev and /proc
TABLE: tuple[Row, ...] = (
    Row("nvidia", "NVIDIA GPUs through NVML", None, _nvidia),
    Row("amd", "AMD GPUs through amdgpu sysfs and hwmon", None, _amd, LINUX),
    Row("intel", "Intel GPUs through i915/xe sysfs and hwmon", None, _intel, LINUX),
    Row("fdinfo", "the /proc/<pid>/fdinfo scan: per-process use of AMD and Intel GPUs "
        "(NVML, amdsmi and Level Zero report processes of their own)", None, _fdinfo, LINUX),
    # The i915/xe PMU (engine busy time, as intel_gpu_top reads it): its own backend, so
    # that EACCES without CAP_PERFMON turns off this source only, never sysfs.
    Row("pmu", "Intel engine utilisation from the i915/xe PMU (needs CAP_PERFMON)", None, _pmu,
        LINUX),
    Row("gpm", "NVIDIA GPM profiling metrics (Hopper and later)", None, parent="nvidia"),
    # Off unless asked for: docs/vendors-intel.md says why.
    Row("level-zero", "Intel GPUs through Level Zero Sysman", False, _level_zero),
    Row("amdsmi", "AMD GPUs through the amdsmi library", None, _amdsmi,
        present=lambda config: importlib.util.find_spec("amdsmi") is not None,
        auto=", when the amdsmi package imports"),
    Row("apple", "Apple Silicon GPUs through macmon", None, _apple,
        present=lambda config: sys.platform == "darwin", auto=", on macOS when macmon is found"),
    # A workstation's series never grow empty pod labels: auto only on a Kubernetes node,
    # where the kubelet's default socket exists at start or the operator names a socket
    # (the chart and the manifests do): absent, that one is down with the reason and
    # retried every --kubernetes.interval, never an exit.
    Row("kubernetes", "pod attribution from the kubelet and the CRI runtime", None, _kubernetes,
        present=lambda config: (config.kubernetes_pod_resources_socket is not None
                                or os.path.exists(config.pod_resources_socket)),
        auto=", when the kubelet's pod-resources socket exists or "
             "--kubernetes.pod-resources-socket is given",
        forced="; without --collector.kubernetes it is auto: down, not an exit, where the "
               "socket is absent (Helm chart: kubernetes.enabled=auto; false turns it off)"),
)
# Switch defaults: None = auto (on when its library/driver is present), True, False.
COLLECTORS: Mapping[str, bool | None] = MappingProxyType({r.key: r.default for r in TABLE})


def _runs_here(row: Row) -> bool:
    return not row.platforms or sys.platform.startswith(row.platforms)


def switch(config: Config, key: str) -> bool | None:
    """A collector's switch: the operator's (``config.collectors``), else the table's
    default. True (forced on), False (off) or None (auto)."""
    key = ALIASES.get(key, key)
    given = config.collectors.get(key)
    return given if key in config.collectors else COLLECTORS.get(key)


def _wanted(row: Row, config: Config) -> bool:
    switch_ = switch(config, row.key)
    if switch_ is None and row.present is not None:
        return row.present(config)
    return switch_ is not False


def build_backends(config: Config, shared: Shared | None = None) -> list[Backend]:
    """A backend per row that is not switched off, in table order."""
    shared = shared or Shared(config)
    backends: list[Backend] = []
    for row in TABLE:
        if row.factory is None or not _wanted(row, config):
            continue
        if _runs_here(row):
            backends.append(row.factory(config, shared))
        else:
            from exporter.sources.unsupported import NotOnThisPlatform

            backends.append(NotOnThisPlatform(backend_name(row.key)))
    # Not a switch: the directory flag itself turns the Slurm job mapping on.
    if config.slurm_job_mapping_dir:
        from exporter.attribution.slurm import SlurmBackend

        backends.append(SlurmBackend(config))
    return backends


def backend_name(key: str) -> str:
    """The ``backend`` label of a row's backend (``level-zero`` -> ``level_zero``)."""
    return key.replace("-", "_")


def forced_but_unavailable(config: Config, backends: Sequence[Backend]) -> str | None:
    """The reason a collector switched on by the operator cannot run, or None.

    A forced backend is opened once (and closed) before serving: a missing library,
    driver or device is then an error, with the backend's own reason. A forced
    sub-feature (``gpm``) needs its parent backend on and opened, and that backend
    to say it can serve it.
    """
    by_name = {b.name: b for b in backends}
    forced = [row for row in TABLE if switch(config, row.key) is True]
    for row in forced:
        owner = row.parent or row.key
        backend = by_name.get(backend_name(owner))
        if backend is None:
            return (f"--collector.{row.key} is on but --no-collector.{owner} switches off "
                    "the backend that serves it")
        try:
            backend.open()
            reason = None
            if row.parent is not None:
                features = backend.capabilities.features
                reason = (features[row.key] if row.key in features
                          else f"the {owner} backend does not say whether it serves it")
        except BackendUnavailable as e:
            reason = str(e)
        except Exception as e:  # noqa: BLE001 - the same: say it in one line
            return f"--collector.{row.key} is on but failed: {e!r}"
        finally:
            try:
                backend.close()
            except Exception:  # noqa: BLE001
                pass
        if reason is not None:
            return f"--collector.{row.key} is on but unavailable: {reason}{row.forced}"
    return None
