"""A stand-in for a backend that cannot run on this operating system.

The amdgpu / i915 / xe sysfs readers, DRM discovery (pyudev) and the /proc fdinfo
scan exist only on Linux. On any other system ``build_backends`` lists this in their
place, so the exporter starts and says why they are off (``gpu_exporter_backend_up``
0, the reason in the log, ``/snapshot`` and the landing page) instead of failing
at import or open.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from exporter.core.model import DeviceInfo
from exporter.sources.base import KERNEL, PLAIN, BackendUnavailable, Cycle


class NotOnThisPlatform:
    priority = KERNEL
    capabilities = PLAIN
    interval: float | None = None

    def __init__(self, name: str, needs: str = "Linux") -> None:
        self.name = name
        self.source = name  # it never opens: no series carries it
        self.reason = f"not on {needs} (this is {sys.platform})"

    def open(self) -> Sequence[DeviceInfo]:
        raise BackendUnavailable(self.reason)

    def sample(self, slow: bool) -> Cycle:  # never called: open() never succeeds
        raise BackendUnavailable(self.reason)

    def close(self) -> None:
        pass
