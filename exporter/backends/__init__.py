"""The backends, listed explicitly: no discovery by import side effects.

``build_backends`` returns every backend the Config does not switch off. A backend
whose library or driver is missing is still returned: its ``open()`` raises
BackendUnavailable and it reports ``gpu_exporter_backend_up 0`` with the reason.
Off Linux, the Linux-only backends are replaced by one stand-in that says so.
"""

from __future__ import annotations

import sys

from exporter.backends.base import Backend, BackendFailed, BackendUnavailable, Cycle
from exporter.config import Config

__all__ = ["Backend", "BackendFailed", "BackendUnavailable", "Cycle", "build_backends"]


# sysfs, pyudev and /proc: these only exist on Linux.
LINUX_ONLY = ("amd", "intel", "processes")


def build_backends(config: Config) -> list[Backend]:
    on_linux = sys.platform.startswith("linux")
    backends: list[Backend] = []
    if config.collector_enabled("nvidia") is not False:
        from exporter.backends.nvidia import NvidiaBackend

        backends.append(NvidiaBackend(config))

    if not on_linux:
        from exporter.backends.unsupported import NotOnThisPlatform

        backends.extend(NotOnThisPlatform(name) for name in LINUX_ONLY
                        if config.collector_enabled(name) is not False)
    wants_amd = on_linux and config.collector_enabled("amd") is not False
    wants_intel = on_linux and config.collector_enabled("intel") is not False
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

    if on_linux and config.collector_enabled("processes") is not False:
        from exporter.backends.fdinfo import FdinfoBackend

        backends.append(FdinfoBackend(config))

    # macmon: auto on macOS (its open() says when the executable is missing); elsewhere
    # only when forced on, which is how the tests run it with a fake macmon.
    apple = config.collector_enabled("apple")
    if apple or (apple is None and sys.platform == "darwin"):
        from exporter.backends.apple import AppleBackend

        backends.append(AppleBackend(config))
    return backends
