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


def _vocabulary_words() -> dict[str, set[str]]:
    """word -> the enums that have it: every closed vocabulary of the package (labels'
    label values, health and error words; the flags' choices; the live view's states and
    the auth middleware's report)."""
    from enum import Enum

    from exporter.core import config, labels
    from exporter.serve import connections
    from exporter.serve import words as view_words

    words: dict[str, set[str]] = {}
    for module, base in ((labels, labels.Vocabulary), (config, config.Choice),
                         (view_words, labels.Vocabulary), (connections, labels.Vocabulary)):
        for name in dir(module):
            enum = getattr(module, name)
            if isinstance(enum, type) and issubclass(enum, base) and enum is not base:
                assert issubclass(enum, Enum)
                for member in enum:
                    words.setdefault(member.value, set()).add(enum.__name__)
    return words


# Words compared in another vocabulary that shares the word: the fleet poller's message
# kind ("failed"), a history series ("temperature"), a
# fleet reader's field ("power") and family ("info"), dcgm's label name ("gpu"), amdsmi's
# device role ("gpu"), Level Zero's empty serial ("unknown"), fdinfo memory regions.
OTHER_VOCABULARIES = {
    ("client/fleet/command.py", "failed"),
    ("serve/landing.py", "temperature"), ("client/fleet/ql.py", "power"),
    ("client/fleet/nodes.py", "info"), ("output/dcgm.py", "gpu"),
    ("sources/amd/amdsmi.py", "gpu"), ("sources/intel/level_zero.py", "unknown"),
    ("sources/kernel/drm_fdinfo.py", "cpu"), ("sources/kernel/drm_fdinfo.py", "memory")}


def test_no_bare_word_is_compared_where_its_enum_exists() -> None:
    """A word of a closed vocabulary is compared, and looked up in a sample's mapping, as
    its enum's member, never as a bare string (health compared "uncorrected", "hw_thermal",
    "critical"): the type checker catches a misspelt member, this test a string."""
    import ast
    from pathlib import Path

    from exporter.core.model import DeviceSample

    words = _vocabulary_words()
    mappings = {f for f in DeviceSample.__dataclass_fields__}
    package = Path(__file__).resolve().parent.parent / "exporter"
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where.startswith("attribution/kubernetes/proto/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                constants = [c for o in operands
                             for c in (o.elts if isinstance(o, ast.Tuple | ast.Set | ast.List)
                                       else [o])]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and isinstance(node.func.value, ast.Attribute)
                  and node.func.value.attr in mappings):
                constants = node.args[:1]  # d.ecc_errors.get("uncorrected")
            elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                  and node.value.attr in mappings):
                constants = [node.slice]  # d.ecc_errors["uncorrected"]
            else:
                continue
            for c in constants:
                if (isinstance(c, ast.Constant) and isinstance(c.value, str)
                        and c.value in words and (where, c.value) not in OTHER_VOCABULARIES):
                    found.append(f"{where}:{c.lineno}: {c.value!r} ({', '.join(words[c.value])})")
    assert found == [], "\n".join(found)


def test_health_s_tables_are_keyed_by_their_vocabularies() -> None:
    """Each rule table of the verdict is keyed by the members of the vocabulary its input
    is in, and the recovery actions by every one of nvml.h's."""
    from exporter.core.labels import RecoveryAction, Threshold, ThrottleReason
    from exporter.sources.nvidia import health as nvidia_health

    assert all(isinstance(k, Threshold) for k in health.LIMIT_STATUS)
    assert all(isinstance(k, ThrottleReason) for k in health.THROTTLES)
    assert set(health.RECOVERY_ACTIONS) == set(RecoveryAction)
    assert all(isinstance(k, RecoveryAction) for k in health.RECOVERY_ACTIONS)
    assert list(nvidia_health.RECOVERY_ACTIONS.values()) == list(RecoveryAction)
