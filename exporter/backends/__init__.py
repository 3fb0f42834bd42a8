"""The backends, listed explicitly: no discovery by import side effects.

``build_backends`` returns every backend the Config does not switch off. A backend
whose library or driver is missing is still returned: its ``open()`` raises
BackendUnavailable and it reports ``gpu_exporter_backend_up 0`` with the reason.
"""

from __future__ import annotations

import os

from exporter.backends.base import Backend, BackendFailed, BackendUnavailable, Cycle
from exporter.config import Config

__all__ = ["Backend", "BackendFailed", "BackendUnavailable", "Cycle", "build_backends"]


def build_backends(config: Config) -> list[Backend]:
    backends: list[Backend] = []
    if config.collector_enabled("nvidia") is not False:
        from exporter.backends.nvidia import NvidiaBackend

        backends.append(NvidiaBackend(config))

    wants_amd = config.collector_enabled("amd") is not False
    wants_intel = config.collector_enabled("intel") is not False
    if wants_amd or wants_intel:
        from exporter.discovery import DrmDiscovery
        from exporter.fs import SysFS

        discovery = DrmDiscovery(SysFS(config.sysfs), hotplug=config.sysfs == "/sys")
        if wants_amd:
            from exporter.backends.amd import AmdBackend

            backends.append(AmdBackend(config, discovery))
        if wants_intel:
            from exporter.backends.intel import IntelBackend

            backends.append(IntelBackend(config, discovery))

    if config.collector_enabled("processes") is not False:
        from exporter.backends.fdinfo import FdinfoBackend

        backends.append(FdinfoBackend(config))

    # Auto: on when the kubelet's pod-resources socket exists at start (a GPU node's
    # DaemonSet), so a workstation's series never grow empty pod labels.
    kubernetes = config.collector_enabled("kubernetes")
    if kubernetes or (kubernetes is None
                      and os.path.exists(config.kubernetes_pod_resources_socket)):
        from exporter.kubernetes.backend import KubernetesBackend

        backends.append(KubernetesBackend(config))
    return backends
