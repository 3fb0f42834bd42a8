"""Closed vocabularies are enums the type checker sees (exporter.core.labels): health checks and
finding codes, keyed as such by dcgm mode's mapping; the values served stay the strings."""

from __future__ import annotations

import json

from exporter.core.labels import Check, FindingCode
from exporter.core.model import DeviceInfo, DeviceSample
from exporter.output import dcgm
from exporter.pipeline import health


def test_every_check_but_xid_is_a_dcgm_health_watch_and_codes_are_finding_codes() -> None:
    assert set(dcgm.HEALTH_WATCHES) == set(Check) - {Check.XID}  # docs/dcgm-compat.md
    assert all(isinstance(code, FindingCode) for code in dcgm.HEALTH_CODES)
    assert health.CHECKS == tuple(Check)
    assert [str(c) for c in health.CHECKS] == ["thermal", "memory", "xid", "interconnect",
                                              "power", "pcie", "driver"]


def test_a_lost_gpu_s_finding_serves_plain_strings() -> None:
    lost = DeviceSample(info=DeviceInfo(vendor="nvidia", pci_bus_id="0000:18:00.0",
                                        uuid="GPU-1"), source="nvml", up=False)
    verdict = health.evaluate(lost, now=0.0)
    body = json.loads(json.dumps(verdict.as_dict()))
    assert body == {"status": "failed", "checks": {"driver": 2}, "reasons": [
        {"check": "driver", "status": "failed", "code": "gpu_unreadable",
         "reason": "GPU cannot be read: lost, fallen off the bus, or its driver stopped "
                   "answering"}]}
    (family,) = dcgm.health_family([("0", lost, verdict)], "host")
    assert {s.labels["health_watch"]: s.labels["health_error_code"]
            for s in family.samples} == {"DRIVER": "DCGM_FR_UNKNOWN"}


def test_reload_s_live_settings_name_real_fields() -> None:
    """reload's live settings are named groups, not slices: each name is a field."""
    from dataclasses import fields

    from exporter.app import reload
    from exporter.core.config import Config
    from exporter.serve.webconfig import WebConfig

    config = {f.name for f in fields(Config)}
    web = {f.name for f in fields(WebConfig)}
    assert set(reload.LIVE) <= config and set(reload.SELECTION) <= set(reload.LIVE)
    assert set(reload.WEB_LIVE) <= web and set(reload.TLS_FILES) <= set(reload.WEB_LIVE)
    assert set(reload.LIVE) == {*reload.HUB_LIVE, *reload.SELECTION}


def test_every_collection_error_reason_served_is_one_of_the_vocabulary() -> None:
    """Reasons are one closed vocabulary (labels.ErrorReason): the code keys its error
    counters by the enum (the type checker rejects a string: tests/test_types.py), and
    every reason the goldens serve is a member."""
    import re
    from pathlib import Path

    from exporter.core.labels import ErrorReason

    root = Path(__file__).resolve().parent.parent
    served = {m.group(1) for path in (root / "tests" / "golden").rglob("*.prom")
              for m in re.finditer(r'^gpu_exporter_collection_errors_total\{[^}]*reason="'
                                   r'([a-z_]+)"', path.read_text(), re.M)}
    assert served and "unreadable" in served
    values = {r.value for r in ErrorReason}
    assert served - values == set()
    assert {"nvml_error", "amdsmi_error", "level_zero_error"} <= values  # backends.calls
