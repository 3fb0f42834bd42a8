"""XID errors from an NVML event set: counted per code, never polled away.

One event set for the life of the NVML handle, registered for
``nvmlEventTypeXidCriticalError`` on every GPU that supports it. Each cycle drains
it without blocking (timeout 0) and returns (uuid, xid) pairs; the backend keeps
the per-code counters so an XID between two scrapes is never lost.
"""

from __future__ import annotations

from typing import Any

import structlog

from exporter.sources.nvidia.calls import text

log = structlog.get_logger(__name__)

MAX_EVENTS_PER_CYCLE = 1024  # an event storm must not stall a cycle


class XidEvents:
    def __init__(self, nvml: Any, handles: dict[str, Any]) -> None:
        self.nvml = nvml
        self.event_set: Any = None
        self.registered: set[str] = set()
        xid = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if xid is None:
            return
        self.event_set = nvml.nvmlEventSetCreate()
        for uuid, handle in handles.items():
            try:
                nvml.nvmlDeviceRegisterEvents(handle, xid, self.event_set)
            except nvml.NVMLError as e:
                # Not supported (e.g. vGPU guests) or no permission: no XID series for it.
                log.info("nvml_xid_events_unavailable", uuid=uuid, reason=str(e))
                continue
            self.registered.add(uuid)

    def drain(self) -> tuple[list[tuple[str, int]], int]:
        """Pending XID events as (uuid, xid), and how many events could not be read."""
        if self.event_set is None or not self.registered:
            return [], 0
        nvml = self.nvml
        timeout = getattr(nvml, "NVML_ERROR_TIMEOUT", 10)
        out: list[tuple[str, int]] = []
        failed = 0
        for _ in range(MAX_EVENTS_PER_CYCLE):
            try:
                data = nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != timeout:
                    failed += 1
                break
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            try:
                uuid = text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                failed += 1
                continue
            out.append((uuid, int(data.eventData)))
            log.warning("nvml_xid_error", uuid=uuid, xid=int(data.eventData))
        return out, failed

    def close(self) -> None:
        if self.event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self.event_set)
            except self.nvml.NVMLError:
                pass
            self.event_set = None
