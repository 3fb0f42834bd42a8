"""One merged view per snapshot, computed by the publisher: readers never merge.

The Hub's publish step runs the merge, the process cap, pod attribution and the health
verdicts once per snapshot; the renderer, ``/snapshot``, the landing page and history only
read the result, from whatever thread they run on.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

import exporter.pipeline.state
from exporter.core.config import Config
from exporter.core.model import DeviceSample, ProcessSample
from exporter.pipeline.hub import Hub
from exporter.serve.snapshot import snapshot_json
from tests.test_collector import Scripted, scrape


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every call to exporter.pipeline.merge.merge made for a snapshot."""
    calls: list[str] = []
    real = exporter.pipeline.state.merge

    def counting(*args: Any, **kwargs: Any) -> list[DeviceSample]:
        calls.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(exporter.pipeline.state, "merge", counting)
    return calls


@pytest.mark.slow
def test_each_snapshot_is_merged_once_by_the_publisher_and_never_by_a_reader(
        merges: list[str]) -> None:
    backends = [Scripted("nvidia", ["0000:18:00.0"]), Scripted("amd", ["0000:03:00.0"])]
    hub = Hub(Config(), backends)
    snapshot = hub.collect_once()
    published = len(merges)
    assert published == snapshot.generation  # one merge per snapshot built, none more
    assert set(merges) == {threading.current_thread().name}  # the thread that published

    seen: list[tuple[tuple[str, ...], int, int]] = []

    def read() -> None:
        for _ in range(20):
            gpus = tuple(g for g, _ in hub.snapshot.devices)
            seen.append((gpus, len(hub.snapshot.health), hub.snapshot.processes_truncated_total))
            scrape(hub)
            snapshot_json(hub.snapshot)

    readers = [threading.Thread(target=read, name=f"reader-{i}") for i in range(4)]
    for t in readers:
        t.start()
    for t in readers:
        t.join()
    hub.stop()
    assert len(merges) == published  # 80 reads, renders and /snapshot bodies: no merge
    assert set(seen) == {(("0", "1"), 2, 0)}


def test_the_truncated_count_advances_in_generation_order(merges: list[str]) -> None:
    """Each snapshot owns its count: a reader of an older snapshot sees that snapshot's
    count, whatever was published or read since."""
    backend = Scripted("nvidia", ["0000:18:00.0"])
    backend.processes = tuple(ProcessSample(pid=pid, process="p", memory_used_bytes=float(pid))
                              for pid in range(1, 6))
    hub = Hub(Config(max_processes_per_gpu=2), [backend])
    snapshots = [hub.collect_once()]
    backend.processes = tuple(ProcessSample(pid=pid, process="p", memory_used_bytes=float(pid))
                              for pid in range(1, 9))
    for _ in range(3):
        hub._sample(backend, slow=False)  # type: ignore[arg-type]
        snapshots.append(hub.snapshot)
    hub.stop()
    # pids 1-3 cut first (5 processes, cap 2); then 1-6 of 8: 4, 5, 6 are new cuts
    totals = [s.processes_truncated_total for s in snapshots]
    assert totals == [3, 6, 6, 6]
    # read in reverse order: nothing changes, nothing is merged again
    before = len(merges)
    assert [s.processes_truncated_total for s in reversed(snapshots)] == totals[::-1]
    assert len(merges) == before
    kept: Sequence[int] = [p.pid for p in snapshots[-1].devices[0][1].processes]
    assert kept == [8, 7]
