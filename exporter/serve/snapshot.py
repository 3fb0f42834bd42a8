"""A Snapshot as plain JSON: what ``/snapshot`` and ``gpu-exporter snapshot`` print.

The first thing to look at when a metric is missing: every backend with its state
and the reason it is off, and every value each backend read, by GPU.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from exporter import __version__
from exporter.pipeline.state import Snapshot


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if v is None or (isinstance(v, (Mapping, tuple)) and not v):
                continue  # "not exposed": left out, as in /metrics
            out[f.name] = _plain(v)
        return out
    if isinstance(value, Mapping):
        return {("/".join(map(str, k)) if isinstance(k, tuple) else str(k)): _plain(v)
                for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def snapshot_dict(s: Snapshot, otlp: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``otlp``: the OTLP pusher's status (endpoint, exports, last error), when it runs."""
    backends = []
    for state in s.backends:
        entry: dict[str, Any] = {
            "backend": state.name,
            "up": state.up and not state.stale,
            "reason": "no completed collection within --stale-after" if state.stale
            else state.reason,
            # gpu_exporter_backend_down_reason's code; null while it answers
            "code": state.down_reason,
            "last_collection_timestamp": state.last_success,
            "errors_total": dict(state.errors_total),
        }
        if state.last is not None:
            devices = []
            for d in state.last.devices:
                index = s.gpu_index.get(d.info.parent_key or d.info.key)
                # A string, as the ``gpu`` label and devices[] below give it.
                item = {"gpu": None if index is None else str(index)}
                item.update(_plain(d))
                devices.append(item)
            entry["duration_seconds"] = state.last.duration_seconds
            entry["devices"] = devices
        backends.append(entry)
    verdicts = {id(d): v for _, d, v in s.health}
    merged = []
    for gpu, d in s.devices:
        one: dict[str, Any] = {"gpu": gpu, **_plain(d)}
        if (verdict := verdicts.get(id(d))) is not None:
            one["health"] = verdict.as_dict()
        merged.append(one)
    out = {"version": __version__, "generation": s.generation, "created": s.created,
           "ready": s.ready, "processes_truncated_total": s.processes_truncated_total,
           "backends": backends, "devices": merged}
    if otlp is not None:
        out["otlp"] = dict(otlp)
    return out


def snapshot_json(s: Snapshot, indent: int | None = None,
                  otlp: Mapping[str, Any] | None = None) -> bytes:
    return json.dumps(snapshot_dict(s, otlp), indent=indent, sort_keys=False).encode()
