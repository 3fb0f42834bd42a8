"""The live page's script and style sheet, served as ``/static/app.js`` and
``/static/app.css`` from the exporter's own origin, so the page runs under a
Content-Security-Policy that allows no inline script or style.

They are files of the package (``exporter/serve/static/``, package data in the wheel),
read once through importlib.resources. The script's vocabularies (the marks of the
states and verdicts, the GPUs and backends tables' columns, how many process rows the
page shows) are the server's own (exporter.serve.view, exporter.serve.landing), filled
in here, so the page's refresh writes what the server's render wrote.
"""

from __future__ import annotations

import json
from importlib import resources

from exporter.core.labels import HealthStatus
from exporter.serve.landing import BACKEND_COLUMNS, GPU_COLUMNS
from exporter.serve.tables import TOP_PROCESSES
from exporter.serve.view import MARKS, OtlpState, State

WORDS = {m.name: m.value for vocabulary in (State, HealthStatus, OtlpState) for m in vocabulary}


def _read(name: str) -> str:
    return resources.files("exporter.serve").joinpath("static").joinpath(name).read_text("utf-8")


APP_JS = (_read("app.js")
          .replace("__MARKS__", json.dumps({str(k): v for k, v in MARKS.items()},
                                           ensure_ascii=False))
          .replace("__GPU_COLUMNS__", json.dumps(GPU_COLUMNS))
          .replace("__BACKEND_COLUMNS__", json.dumps(BACKEND_COLUMNS))
          .replace("__TOP_PROCESSES__", str(TOP_PROCESSES))
          .replace("__WORDS__", json.dumps(WORDS)))
APP_CSS = _read("app.css")
