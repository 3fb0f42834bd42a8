"""Snapshot -> prometheus-client metric families -> cached exposition bytes.

``families``: the per-GPU and per-process families, from the field table of
``exporter.core.model``; ``selfmetrics``: the ``gpu_exporter_*`` families and thread CPU time;
``exposition``: the renderer's thread, the per-snapshot cache of bytes and when to render.
"""

from exporter.output.render.exposition import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    VARIANTS,
    Exposition,
    Renderer,
    Worker,
    snapshot_families,
)
from exporter.output.render.families import RenderOptions, device_families

__all__ = ["OPENMETRICS_CONTENT_TYPE", "TEXT_CONTENT_TYPE", "VARIANTS", "Exposition",
           "RenderOptions", "Renderer", "Worker", "device_families",
           "snapshot_families"]
