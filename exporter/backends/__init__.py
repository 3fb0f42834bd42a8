"""The backends, listed explicitly: no discovery by import side effects.

``build_backends`` returns every backend the Config does not switch off. A backend
whose library or driver is missing is still returned: its ``open()`` raises
BackendUnavailable and it reports ``gpu_exporter_backend_up 0`` with the reason.
The exceptions are optional sources that a machine either has or not (amdsmi, the
kubelet socket, macmon off macOS): without them there is no backend at all, so a
machine without them keeps its series shapes, unless the switch forces them on.
Off Linux, the Linux-only backends are replaced by one stand-in that says so.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from exporter.backends.base import Backend, BackendFailed, BackendUnavailable, Cycle
from exporter.config import Config

__all__ = ["Backend", "BackendFailed", "BackendUnavailable", "Cycle", "build_backends"]

# sysfs, pyudev and /proc: these only exist on Linux.
LINUX_ONLY = ("amd", "intel", "processes", "pmu")


def build_backends(config: Config) -> list[Backend]:
    backends: list[Backend] = []
    if config.collector_enabled("nvidia") is not False:
        from exporter.backends.nvidia.backend import NvidiaBackend

        backends.append(NvidiaBackend(config))

    on_linux = sys.platform.startswith("linux")
    if not on_linux:
        from exporter.backends.unsupported import NotOnThisPlatform

        backends.extend(NotOnThisPlatform(name) for name in LINUX_ONLY
                        if config.collector_enabled(name) is not False)
    wants_amd = on_linux and config.collector_enabled("amd") is not False
    wants_intel = on_linux and config.collector_enabled("intel") is not False
    wants_processes = on_linux and config.collector_enabled("processes") is not False
    wants_pmu = on_linux and config.collector_enabled("pmu") is not False
    # One DRM discovery for every backend that asks which cards are bound.
    if wants_amd or wants_intel or wants_processes or wants_pmu:
        from exporter.discovery import DrmDiscovery
        from exporter.fs import SysFS

        discovery = DrmDiscovery(SysFS(config.sysfs), hotplug=config.sysfs == "/sys")
        if wants_amd:
            from exporter.backends.amd.backend import AmdBackend

            backends.append(AmdBackend(config, discovery))
        if wants_intel:
            from exporter.backends.intel.backend import IntelBackend

            backends.append(IntelBackend(config, discovery))
        if wants_processes:
            from exporter.backends.fdinfo.backend import FdinfoBackend

            backends.append(FdinfoBackend(config, discovery))
        # The i915/xe PMU (engine busy time, as intel_gpu_top reads it): its own backend,
        # so that EACCES without CAP_PERFMON turns off this source only, never sysfs.
        if wants_pmu:
            from exporter.backends.intel.pmu import PmuBackend

            backends.append(PmuBackend(config, discovery))

    if config.collector_enabled("level-zero"):  # opt-in: docs/vendors-intel.md says why
        from exporter.backends.intel.level_zero import LevelZeroBackend

        backends.append(LevelZeroBackend(config))

    # amdsmi is an optional extra: without the package there is no amdsmi backend at all
    # (no backend_up series), unless --collector.amdsmi asks for it and is told why not.
    amdsmi_switch = config.collector_enabled("amdsmi")
    if amdsmi_switch or (amdsmi_switch is None and importlib.util.find_spec("amdsmi")):
        from exporter.backends.amd.amdsmi import AmdSmiBackend

        backends.append(AmdSmiBackend(config))

    # macmon: auto on macOS (its open() says when the executable is missing); elsewhere
    # only when forced on, which is how the tests run it with a fake macmon.
    apple = config.collector_enabled("apple")
    if apple or (apple is None and sys.platform == "darwin"):
        from exporter.backends.apple.backend import AppleBackend

        backends.append(AppleBackend(config))

    # Auto: on when the kubelet's pod-resources socket exists at start (a GPU node's
    # DaemonSet), so a workstation's series never grow empty pod labels.
    kubernetes = config.collector_enabled("kubernetes")
    if kubernetes or (kubernetes is None
                      and os.path.exists(config.kubernetes_pod_resources_socket)):
        from exporter.kubernetes.backend import KubernetesBackend

        backends.append(KubernetesBackend(config))
    if config.slurm_job_mapping_dir:
        from exporter.slurm import SlurmBackend

        backends.append(SlurmBackend(config))
    return backends
