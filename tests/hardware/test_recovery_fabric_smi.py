"""NVML's GPU recovery action and NVSwitch fabric state as the exporter reads them, against
``nvidia-smi -q`` on the same GPUs ("GPU Recovery Action", and "State" / "Status" of the
"Fabric" section).

Run on the GPU machine: ``python3 -m pytest -v -s -p no:cacheprovider
tests/hardware/test_recovery_fabric_smi.py`` (a few seconds; skipped without a GPU, see
conftest.py). Only reads. Every compared value is printed, with nvidia-smi's own words.
"""

from __future__ import annotations

import re
import subprocess

from exporter.core.config import Config
from exporter.core.model import DeviceSample, normalize_pci_bus_id
from exporter.sources.nvidia.backend import NvidiaBackend

# nvidia-smi's words -> the exporter's. "None", "Reset" and "Reboot" are the words
# nvidia-smi prints for actions 0-2 (as quoted from real machines); a word not here fails
# the test with both readings printed, so that it can be added from what was seen.
SMI_RECOVERY = {"none": "none", "reset": "gpu_reset", "reboot": "node_reboot",
                "drainp2p": "drain_p2p", "drainandreset": "drain_and_reset"}
# nvmlGpuFabricState_t as nvidia-smi spells it.
SMI_FABRIC_STATE = {"notstarted": 1, "inprogress": 2, "completed": 3}
ABSENT = {"n/a", "notsupported", ""}
GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


def word(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def smi_sections() -> dict[str, dict[str, str]]:
    """bus id -> {"recovery": ..., "fabric_state": ..., "fabric_status": ...} as printed (a
    key missing where this nvidia-smi prints no such line)."""
    out = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, check=True)
    gpus: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    fabric_indent: int | None = None
    for line in out.stdout.splitlines():
        if (m := GPU_HEADER.match(line)) is not None:
            current = gpus.setdefault(normalize_pci_bus_id(m.group(1)), {})
            fabric_indent = None
            continue
        if current is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = (part.strip() for part in line.partition(":"))
        if fabric_indent is not None and indent <= fabric_indent:
            fabric_indent = None
        if key == "Fabric" and not value:
            fabric_indent = indent
        elif fabric_indent is not None and key in ("State", "Status") \
                and f"fabric_{key.lower()}" not in current:
            current[f"fabric_{key.lower()}"] = value
        elif key == "GPU Recovery Action":
            current["recovery"] = value
    return gpus


def exporter_samples() -> list[DeviceSample]:
    backend = NvidiaBackend(Config())
    backend.open()
    try:
        devices = [backend.sample(slow=True).devices for _ in range(2)][-1]
    finally:
        backend.close()
    return [d for d in devices if not d.info.parent_key]


def test_recovery_action_and_fabric_state_match_nvidia_smi() -> None:
    smi = smi_sections()
    samples = exporter_samples()
    assert samples and smi
    for d in samples:
        shown = smi[d.info.pci_bus_id]
        print(d.info.pci_bus_id, d.info.uuid, "nvidia-smi:", shown, "| exporter:",
              "recovery", d.recovery_action, dict(d.recovery_action_info),
              "fabric", d.fabric_state, d.fabric_status, d.fabric_health_mask,
              d.fabric_health_summary)
        recovery = shown.get("recovery")
        if recovery is None or word(recovery) in ABSENT:
            assert d.recovery_action is None and dict(d.recovery_action_info) == {}
        else:
            assert word(recovery) in SMI_RECOVERY, f"nvidia-smi word {recovery!r} not mapped"
            assert d.recovery_action == SMI_RECOVERY[word(recovery)]
            assert dict(d.recovery_action_info) == {d.recovery_action: True}
        state = shown.get("fabric_state")
        if state is None or word(state) in ABSENT:
            assert d.fabric_state is None  # a GPU in no fabric: no series
            assert d.fabric_status is None
            continue
        assert d.fabric_state == SMI_FABRIC_STATE[word(state)]
        status = shown.get("fabric_status", "")
        if d.fabric_state == 3:
            assert (word(status) == "success") == (d.fabric_status == 0), (status,
                                                                            d.fabric_status)
        else:
            assert d.fabric_status is None
