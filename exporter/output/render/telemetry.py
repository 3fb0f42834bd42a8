"""What the exporter reports about itself beside the snapshot: the threads whose CPU time
it serves (``gpu_exporter_thread_cpu_seconds_total``), the OTLP pusher's status, the
last configuration reload and the HTTP server's connection evictions. The daemon builds
one and hands it to the renderer and the server, which read it; nothing sets attributes
on them from outside."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

OtlpStatus = Callable[[], Mapping[str, Any]]  # the pusher's endpoint, counts, last error
ReloadStatus = Callable[[], tuple[bool, float]]  # (last reload succeeded, when it did)
ConnectionCounts = Callable[[], Mapping[str, int]]  # the HTTP server's evictions by state


class ThreadTable:
    """label -> the threads whose CPU time is reported under it; a part adds its own
    threads as they start (the server its event loop's, the daemon the pusher's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[str, tuple[threading.Thread, ...]] = {}

    def add(self, label: str, thread: threading.Thread) -> None:
        with self._lock:
            self._threads[label] = (*self._threads.get(label, ()), thread)

    def as_dict(self) -> dict[str, tuple[threading.Thread, ...]]:
        with self._lock:
            return dict(self._threads)


@dataclass(frozen=True)
class Telemetry:
    threads: ThreadTable = field(default_factory=ThreadTable)
    otlp: OtlpStatus | None = None  # with --otlp.endpoint
    reload: ReloadStatus | None = None  # when a reload can change something
    connections: ConnectionCounts | None = None  # while an HTTP server listens

    def connection_counts(self) -> Mapping[str, int] | None:
        return self.connections() if self.connections is not None else None

    def otlp_status(self) -> Mapping[str, Any] | None:
        return self.otlp() if self.otlp is not None else None

    def reload_status(self) -> tuple[bool, float] | None:
        return self.reload() if self.reload is not None else None
