"""The health verdict on a real NVIDIA GPU: a working GPU reads healthy, and NVML's GPU
recovery action is read where the driver has it, or its absence is handled.

Run on the GPU machine: ``python3 -m pytest -v -s tests/hardware/test_health_h100.py``
(about 10 s; skipped without a GPU, see conftest.py). Only reads: nothing here changes a
GPU setting. Prints the verdict, the reasons and what nvidia-smi says, so they can be quoted.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.config import Config
from exporter.pipeline.health import HEALTHY
from exporter.sources.nvidia.backend import NvidiaBackend
from exporter.sources.nvidia.health import RECOVERY_ACTIONS, RECOVERY_FIELD
from tests.hardware.harness import exporter, get


@pytest.fixture
def daemon() -> Iterator[int]:
    with exporter("--collector.slow-interval", "2s") as port:
        time.sleep(3)  # a slow cycle or two: recovery action, ECC, remap state
        yield port


@pytest.mark.slow
def test_the_real_gpu_reads_healthy(daemon: int) -> None:
    text = get(daemon, "/metrics")
    statuses = {s.labels["uuid"]: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name == "gpu_health_status"
                and s.labels["vendor"] == "nvidia"}
    checks = {(s.labels["uuid"], s.labels["check"]): s.value
              for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "gpu_health_check_status" and s.labels["vendor"] == "nvidia"}
    devices = [d for d in json.loads(get(daemon, "/snapshot"))["devices"]
               if d["info"]["vendor"] == "nvidia" and "health" in d]
    for d in devices:
        print(d["info"]["uuid"], d["health"], "recovery_action:", d.get("recovery_action"))
    print(subprocess.run(["nvidia-smi", "--query-gpu=uuid,temperature.gpu,"
                          "clocks_event_reasons.active,ecc.errors.uncorrected.volatile.total",
                          "--format=csv"], capture_output=True, text=True).stdout)
    assert statuses and set(statuses.values()) == {HEALTHY}, devices
    assert {"thermal", "memory", "driver"} <= {c for _, c in checks}
    assert set(checks.values()) == {HEALTHY}
    assert all(d["health"]["reasons"] == [] for d in devices)


def test_the_recovery_action_is_read_or_its_absence_handled() -> None:
    import pynvml

    backend = NvidiaBackend(Config())
    backend.open()
    try:
        samples = [backend.sample(slow=True).devices for _ in range(2)][-1]
    finally:
        backend.close()
    pynvml.nvmlInit()
    try:
        fid = getattr(pynvml, RECOVERY_FIELD, None)
        for d in samples:
            if d.info.parent_key:
                continue
            handle = pynvml.nvmlDeviceGetHandleByUUID(d.info.uuid)
            answered = None
            if fid is not None:
                (fv,) = pynvml.nvmlDeviceGetFieldValues(handle, [fid])
                if fv.nvmlReturn == pynvml.NVML_SUCCESS:
                    answered = RECOVERY_ACTIONS.get(int(fv.value.uiVal))
            print(d.info.uuid, "driver", pynvml.nvmlSystemGetDriverVersion(),
                  "NVML answers", answered, "exporter read", d.recovery_action)
            # The driver's answer and the exporter's agree; a driver without the field
            # leaves it None, which the verdict treats as no action asked for.
            assert d.recovery_action == answered
            assert d.recovery_action in (None, "none")  # a working GPU needs nothing
    finally:
        pynvml.nvmlShutdown()
