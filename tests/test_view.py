"""The live view (exporter.serve.view): the one typed contract between the history that
produces it and the page, the JSON and ``gpu-exporter top`` that read it. What is
written reads back the same; what cannot be read is "no data", never an exception; the
state and verdict words exist once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from exporter.core.config import Config
from exporter.core.labels import HealthStatus
from exporter.core.model import ProcessSample
from exporter.pipeline.health import STATUS_NAMES
from exporter.pipeline.hub import Hub
from exporter.serve import view
from exporter.serve.history import History
from exporter.serve.landing_static import APP_JS
from tests.test_collector import Scripted
from tests.test_landing import Limited

ROOT = Path(__file__).resolve().parent.parent


def _history() -> History:
    backend = Limited("amd", ["0000:03:00.0", "0000:04:00.0"])
    backend.engines = {"encoder": 0.25}
    backend.processes = (ProcessSample(pid=41, process="trainer", memory_used_bytes=3e9,
                                       utilization_ratio={"gfx": 0.5}, pod="train-0",
                                       namespace="ml", container="main", user="alice",
                                       command="python3 train.py"),)
    absent = Scripted("intel", [])
    absent.unavailable = "no Intel GPU"
    hub = Hub(Config(), [backend, absent])
    history = History(60.0, 1.0)
    for i in range(3):
        history.add(hub.collect_once(), now=100.0 + i)
    return history


def test_what_is_written_reads_back_the_same() -> None:
    written = _history().view(now=103.0, otlp={"endpoint": "http://x", "last_error": ""})
    wire = json.loads(json.dumps(written.to_json()))
    assert view.HistoryView.from_json(wire) == written
    assert wire["devices"][0]["state"] == "up" and wire["backends"][1]["state"] == "down"
    assert wire["devices"][0]["temperature"] == {"sensor": "edge", "celsius": 50.0,
                                                 "critical": 90.0, "heat": "cool"}
    assert wire["processes"]["0"]["rows"][0]["engines"] == {"gfx": 0.5}


def test_unreadable_values_are_no_data() -> None:
    assert view.HistoryView.from_json("x") == view.HistoryView(0.0, 0.0, 0.0, 0, ())
    dev = view.Device.from_json({"gpu": "0", "state": "sideways", "utilization": "50",
                                 "power_watts": float("nan"), "fan": True,
                                 "temperature": {"celsius": "hot"},
                                 "health": {"status": "fine", "reasons": "none"},
                                 "clocks": [], "cells": {"memory": 5}})
    assert dev == view.Device("0")
    assert dev.cells.memory == view.NO_DATA
    assert view.Device.from_json({"name": "no label"}) is None
    assert view.Process.from_json({"pid": -1}) is None
    assert view.Processes.from_json({"rows": [{"pid": 1}] * 1000, "more": "x"}) == \
        view.Processes((view.Process(1, ""),) * view.MAX_ROWS, 0)
    columns = view.GpuHistory.from_json({"gpu": "0", "t": [1.0, 2.0], "power": [5, "x", 7]},
                                        ("power", "memory"))
    assert columns is not None
    assert (columns.t, dict(columns.values)) == ([1.0, 2.0], {"power": [5.0, None],
                                                              "memory": [None, None]})


def test_the_words_are_defined_once() -> None:
    """The states, heats and verdicts are enums; the health check's words are the
    verdict's (gpu_health_status's order); the page's script gets the marks and the
    words from the server; no module of the live view writes a state as a literal."""
    assert STATUS_NAMES == ("healthy", "degraded", "failed") == tuple(HealthStatus)
    for word, text in view.MARKS.items():
        assert text.endswith(f" {word}") and json.dumps(text, ensure_ascii=False) in APP_JS
    words = "up|down|stale|healthy|degraded|failed|failing|cool|warm|hot"
    literal = re.compile(rf"""["']({words})["']""")
    for path in ("exporter/serve/history.py", "exporter/serve/landing.py",
                 "exporter/serve/static/app.js", "exporter/client/top/command.py",
                 "exporter/client/fleet/model.py", "exporter/client/fleet/screen.py"):
        assert not literal.findall((ROOT / path).read_text()), path


@pytest.mark.slow
def test_a_client_imports_the_view_without_the_daemon() -> None:
    """``top`` decodes with these classes: importing them loads no collector, server or
    prometheus-client."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, exporter.serve.view, exporter.client.top.model; "
         "print(' '.join(sorted(sys.modules)))"], capture_output=True, text=True, cwd=ROOT,
        check=True, timeout=60).stdout.split()
    assert "exporter.serve.view" in loaded
    heavy = [m for m in loaded if m.startswith(("exporter.pipeline", "exporter.output",
                                                "exporter.serve.server", "prometheus_client",
                                                "starlette", "rich"))]
    assert heavy == []
